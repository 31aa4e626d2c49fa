"""The placement side of the starvation rule (libs/core/kernel/starvation.py, EASY backfill), on GPUs.

A job that has waited for capacity longer than the settings' starvation limit gets capacity held for it: a job
of no higher priority waits only if it takes GPUs on a node that could hold the starving job and leaves it no
room there, unless its declared runtime ends before the starving job could start anyway (its "shadow" time,
from running jobs' declared ends). The starving job is the longest-waiting job past the limit that the present
nodes could hold with every running job gone (the rule quota picks its own by): one no node could hold holds
nobody, and the next-oldest that could be held starves in its place. The starving job is told that capacity is
held for it, so that quota keeps its reservation."""

from __future__ import annotations

from contracts import JobSpec, PlacementDeferred, ReplicaPlacement
from libs.core.cluster.starving_room import takes_usable_gpus
from libs.core.kernel.decider import Decisions
from libs.core.kernel.policy import runtime_bound
from libs.core.kernel.starvation import (
    CAPACITY_HELD,
    UNKNOWN_START,
    RoomEffect,
    Starving,
    find_shadow,
    holds,
    longest_waiting,
)
from libs.core.placement.codes import RESERVED_FOR_PREEMPTOR
from libs.core.placement.order import longest_waiting_first
from libs.core.placement.shortcuts import ShadowAnswer
from libs.core.placement.state import PlacementState, StarvingJob


def find_starving(state: PlacementState, now: float) -> StarvingJob | None:
    """On a tick: the starving job, by the rule quota shares (starvation.longest_waiting): the job waiting
    longest for capacity, past the starvation limit, that the present nodes could hold with every running
    job gone; and its shadow time (when running jobs' declared ends free enough for it; unknown when they do
    not say). A nominated preemptor has capacity held for it already: then nobody starves besides."""
    limit = state.policy.settings.starvation_after_s
    if limit is None or not state.waiting:
        return None
    job_id = longest_waiting(longest_waiting_first(state.waiting_since, state.waiting), now, limit,
                             lambda j: j in state.specs and state.inventory.could_hold(state.specs[j]))
    if job_id is None or job_id in state.nominated:
        return None
    spec = state.specs[job_id]
    key = (state.generation, job_id, spec)
    pure = state.pure(spec)
    known, answer = state.shortcuts.known_shadow(key) if pure else (False, None)
    if not known:
        answer = shadow_of(state, spec, now)
        state.shortcuts.remember_shadow(key, answer, pure)
    if answer is None:
        return None
    shadow, ending = answer
    return StarvingJob(job_id=job_id, priority=state.policy.priority_of(spec), shadow=shadow, ending=ending)


def shadow_of(state: PlacementState, spec: JobSpec, now: float) -> ShadowAnswer:
    """When the job could start as the running jobs end (find_shadow on the cluster, rolled back): (the shadow
    time, the running jobs that end by then), or None when it could never fit."""
    declared = sorted((end, job_id) for job_id, end in state.ends.items() if job_id in state.placed)
    undeclared = [job_id for job_id in state.placed if job_id not in state.ends]
    with state.cluster.what_if() as trial:
        found = find_shadow(now, declared, undeclared, release=lambda j: trial.release(state.placed[j]),
                            fits=lambda: state.placer.fits(spec))
    return None if found is None else (found.at, found.ending)


def tell_starving(state: PlacementState, before: StarvingJob | None, out: Decisions) -> None:
    """The starving job changed: the new one is told capacity is held for it (so quota keeps its reservation),
    the one before, still waiting, why it waits again."""
    current = state.starving
    # (one a preemptor's hold keeps waiting is told so, and told this once the nominations are over)
    held_back = (current is not None and state.deferred.get(current.job_id) == RESERVED_FOR_PREEMPTOR
                 and bool(state.nominated))
    if current is not None and state.deferred.get(current.job_id) != CAPACITY_HELD and not held_back:
        start = "once running jobs end (they do not say when)" if current.shadow == UNKNOWN_START else (
            f"by {current.shadow:.0f}")
        out.emit(PlacementDeferred, correlation_id=current.job_id, job_id=current.job_id, code=CAPACITY_HELD,
                 message=f"it has waited longer than the starvation limit: capacity is held for it; it could "
                         f"start {start}")
    if (before is None or (current is not None and current.job_id == before.job_id)
            or before.job_id not in state.waiting):
        return
    if state.deferred.get(before.job_id) == CAPACITY_HELD:
        short = state.placer.explain(state.specs[before.job_id])
        out.emit(PlacementDeferred, correlation_id=before.job_id, job_id=before.job_id, code=short.code,
                 message=short.message, shortfall_milli=short.shortfall_milli)


def held_for_starving(state: PlacementState, job_id: str, spec: JobSpec, tentative: tuple[ReplicaPlacement, ...],
                      now: float) -> str | None:
    """With `job_id` tentatively allocated (at `tentative`): the starving job it would keep waiting, or None, by
    the starvation rule (libs/core/kernel/starvation.py)."""
    starving = state.starving
    if starving is None or starving.job_id not in state.specs:
        return None
    rule = Starving(job_id=starving.job_id, priority=starving.priority, shadow=starving.shadow)
    held = holds(rule, job_id, state.policy.priority_of(spec), runtime_bound(spec), now,
                 lambda: room_effect(state, tentative, state.specs[starving.job_id], starving.ending))
    return starving.job_id if held else None


def room_effect(state: PlacementState, tentative: tuple[ReplicaPlacement, ...], starving: JobSpec,
                ending: tuple[str, ...]) -> RoomEffect:
    """Does the tentative placement take GPUs the starving job could use (room it would fit in without it, or
    GPUs of its models on a node that could hold one of its replicas), and does the starving job still fit
    beside it once the jobs ending by its shadow time are gone?"""
    with state.cluster.what_if() as at_shadow:
        for job_id in ending:
            if job_id in state.placed:
                at_shadow.release(state.placed[job_id])
        if state.placer.fits(starving):
            return (True, True)
        # It may not fit at all yet; then the question is whether this job takes what it could use.
        with state.cluster.what_if() as without:
            without.release(tentative)
            room_without = state.placer.fits(starving)
        return (room_without or takes_usable_gpus(state.cluster, starving, tentative), False)
