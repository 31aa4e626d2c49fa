"""Answers about a job kept per request shape, so that jobs asking alike are answered once.

The flavors a job may use (fit.flavors_of: kernel/usable_flavors.py) read only its queue, the GPU models it
allows and its demand, besides the queue's flavors in the book and the fleet's GPU counts per model, both of
which change only with the flavors epoch (every policy event and every change of those counts bumps it): jobs
of one (queue, models, demand) share the answer within an epoch.
Whether the present nodes could hold a job with every running job gone (fit.could_hold: Fleet.could_place)
reads only the flavors it may use and its placement shape (cluster/job_fit.py placement_shape: everything
placement looks at; narrowing the job to a flavor changes only its models), besides the inventory: jobs of one
(flavors, shape) share the answer within an inventory version."""

from __future__ import annotations

from collections.abc import Callable

from libs.core.cluster.job_fit import placement_shape
from libs.core.cluster.scoring import DEFAULT_POLICY
from libs.core.quota.state import QuotaJob, QuotaState


def shaped_flavors(state: QuotaState, job: QuotaJob,
                   find: Callable[[QuotaState, QuotaJob], tuple[str, ...]]) -> tuple[str, ...]:
    """The flavors `find` answers for the job, shared by the jobs of its queue, models and demand."""
    kept = state.flavors_by_shape
    if kept[0] != state.flavors_epoch:
        kept = state.flavors_by_shape = (state.flavors_epoch, {})
    spec = job.spec
    key = (spec.queue, spec.gpu_models, job.demand)
    flavors = kept[1].get(key)
    if flavors is None:
        flavors = kept[1][key] = find(state, job)
    return flavors


def shaped_holdable(state: QuotaState, job: QuotaJob, flavors: tuple[str, ...],
                    find: Callable[[QuotaState, QuotaJob], bool]) -> bool:
    """Whether the present nodes could hold the job (`find`), shared by the jobs of its flavors and shape."""
    version = state.fleet.inventory.version
    kept = state.holdable_by_shape
    if kept[0] != version:
        kept = state.holdable_by_shape = (version, {})
    key = (flavors, placement_shape(job.spec, DEFAULT_POLICY))
    able = kept[1].get(key)
    if able is None:
        able = kept[1][key] = find(state, job)
    return able
