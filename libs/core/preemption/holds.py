"""Which flavors a waiting job is held back from by the jobs above it in its queue.

Quota tries a queue's waiting jobs by priority, and a job it cannot reserve holds the jobs of lower priority of
its queue back in the flavors it could use (quota/reserve.py hold_below): quota freed there goes to it first.
So evicting for a lower job can serve it only in the flavors no higher job waits for; in the others the
eviction would serve the higher job. A job of the same priority holds nobody back."""

from __future__ import annotations

from libs.core.kernel.policy import demand_milli
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.usable_flavors import usable_flavors
from libs.core.preemption.state import PLACEMENT, World


def flavors_of(world: World, job_id: str) -> tuple[str, ...]:
    """The flavors quota would reserve the waiting job in: of its queue's, those of a model the nodes serve
    (the one rule for both deciders); ANY for a queue without quota."""
    spec = world.state.specs[job_id]
    return usable_flavors(world.policy.quotas, world.models, spec, demand_milli(spec)) or (ANY,)


def holds_others(world: World, job_id: str) -> bool:
    """Does the waiting job hold lower jobs of its queue back? Only one waiting for quota: one waiting for a
    place holds its quota already."""
    waiting = world.state.waiting.get(job_id)
    return waiting is not None and waiting.code != PLACEMENT and job_id in world.state.specs


def free_flavors(world: World, job_id: str) -> tuple[str, ...]:
    """The flavors of the waiting job (flavors_of, in its queue's order) that no job of higher priority
    waiting for quota in its queue holds it back from; none when such a job waits in a queue without quota."""
    state = world.state
    spec = state.specs[job_id]
    flavors = flavors_of(world, job_id)
    priority = world.policy.priority_of(spec)
    priorities = state.waiting_priorities.get(spec.queue)
    if not priorities or max(priorities) <= priority:
        return flavors  # the common case: nobody above it waits for quota
    if not world.policy.quotas.governed(spec.queue):
        return ()
    free = set(flavors)
    # The queue's waiting jobs in (-priority, id) order: those above it come first.
    for negative_priority, other in state.heads.get(spec.queue, ()):
        if -negative_priority <= priority:
            break
        if holds_others(world, other):
            free.difference_update(flavors_of(world, other))
            if not free:
                return ()
    return tuple(flavor for flavor in flavors if flavor in free)
