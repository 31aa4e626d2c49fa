"""A shortcut of a cycle over one queue: a job that trying would only hold for the starving job again, as a job
of the same key was held just before, is skipped on the way to its queue's next head (not tried). It was told so
already, and nothing that could tell it otherwise changed: the cycle's holds, the flavors lent out, and no
reservation since (which clears what the cycle recorded)."""

from __future__ import annotations

from libs.core.kernel.policy import runtime_bound
from libs.core.kernel.wait_reasons import HELD_FOR_STARVING_JOB
from libs.core.quota.fit import flavors_of, may_borrow
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def starving_key(state: QuotaState, job: QuotaJob) -> tuple[str, int, int, tuple[str, ...], bool]:
    """What decides whether a job without a runtime limit is held for the starving job, besides the cycle."""
    borrows = job.borrows if job.borrows_version == state.policy_version else may_borrow(state, job)  # (kept)
    return (job.queue, job.priority, job.demand, flavors_of(state, job), borrows)


def held_like_another(state: QuotaState, job: QuotaJob, cycle: Cycle) -> bool:
    """Would trying the job only hold it for the starving job again, as it was told already? So when, in a cycle
    over one queue (where the job would be tried right now), a job of its key (starving_key) was held that way
    with the same holds and no reservation since, and the job, neither the starving job nor a nominated
    preemptor, has no runtime limit and no user limit binding it: its rooms, usable flavors and the rule's
    effect are then those the other job met, flavor by flavor. (In a cycle over several queues another queue's
    head may be tried, and reserved, between the two: there the job is tried.)"""
    if state.deferred.get(job.job_id) != HELD_FOR_STARVING_JOB:  # (asked first: it needs no key)
        return False
    seen = cycle.held_for_starving.get(starving_key(state, job))
    if seen is None or seen != (cycle.holds, len(cycle.no_borrowing)):
        return False
    if (cycle.starving is None or job.job_id == cycle.starving.job_id or job.job_id in state.nominated
            or runtime_bound(job.spec) is not None):
        return False
    queue = state.policy.queues.get(job.queue)
    limit = queue.user_max_gpus if queue is not None else None
    return limit is None or state.user_used.get((job.queue, job.user), 0) + job.demand <= limit * 1000
