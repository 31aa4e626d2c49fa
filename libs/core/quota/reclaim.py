"""The lender-first rule: while a queue under its nominal quota waits for quota of a flavor lent out, no
borrower of that flavor grows.

When the job a queue's order admits next in a flavor (libs/core/kernel/lent_quota.py: the smallest of its highest
priority waiting there) fits the queue's nominal quota of it but not the room its cohort left, no borrower of the
flavor grows that cycle; the preemption service reclaims what running borrowers hold
(libs/core/preemption/reclaim.py). A borrower reserved but not placed holds no GPU and cannot be evicted: it
gives its quota back at its placement timeout (libs/core/quota/timeout.py), even one placement holds capacity
for (it starves there) while a lender waits for that quota (`lender_waits`): the lender's nominal quota comes
before a borrower's starvation. Giving it back sooner is placement's to decide, not quota's: quota cannot know
whether placement is placing that job at that very moment, and a job placed after its quota went back takes
that quota again whatever the lender holds by then."""

from __future__ import annotations

from collections.abc import Iterator

from libs.core.kernel.lent_quota import Waiter, waits_for_lent_quota
from libs.core.quota.fit import could_ever_fit, could_hold, flavors_of, group_of, over_budget, quota_left
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def lent_flavors(state: QuotaState, queue: str, cycle: Cycle) -> list[str]:
    """The flavors whose quota the queue waits for while it is lent out (the kernel's rule,
    kernel/lent_quota.py): the job its order admits next in the flavor would fit the queue's own nominal quota
    of it but not the room its cohort left it."""
    book = state.book
    if not state.pending.get(queue) or not book.governed(queue) or over_budget(state, queue, cycle):
        return []
    lent = [f for f in book.limits[queue] if (q := quota_left(state, queue, f, cycle))[0] > q[1]]
    return [f for f in lent if waits_for_lent_quota(book, queue, f, waiting_in_turn(state, queue, f, cycle.now))]


def waiting_in_turn(state: QuotaState, queue: str, flavor: str, now: float) -> Iterator[Waiter]:
    """The queue's jobs waiting for quota that may use the flavor, as quota tries them: none backing off, held by
    its user's limit, that no node present could hold, or that its queue could never hold (quota_reserve holds
    nobody back for those). By priority from the highest, ending with the first priority that has one: no job
    below it comes first in the flavor (kernel/lent_quota.py), so the rest need not be read."""
    spec = state.policy.queues.get(queue)
    limit = spec.user_max_gpus if spec is not None else None
    for priority in sorted(state.pending.get(queue, {}), reverse=True):
        found = False
        for user, keys in state.pending[queue][priority].items():
            held = state.user_used.get((queue, user), 0)
            for _, job_id in keys:
                job = state.jobs[job_id]
                if (max(state.backing_off.get(job_id, now), state.requeued.get(job_id, now)) > now
                        or (limit is not None and held + job.demand > limit * 1000)
                        or flavor not in flavors_of(state, job) or not could_hold(state, job)
                        or not could_ever_fit(state, job)):
                    continue
                found = True
                yield priority, job.demand, job_id
        if found:
            return


def lent_out(state: QuotaState, group: list[str], cycle: Cycle) -> None:
    """No borrower of a flavor some queue of the group waits for while it is lent out grows this cycle,
    whichever of that queue's jobs comes first in its own order."""
    for q in group:
        cycle.no_borrowing.update(lent_flavors(state, q, cycle))


def lender_waits(state: QuotaState, job: QuotaJob, cycle: Cycle) -> bool:
    """Does another queue of the job's cohort wait for quota of the job's flavor that the job borrows?"""
    if not job.over_budget and state.book.borrowed(job.queue, job.flavor) <= 0:
        return False
    return any(q != job.queue and job.flavor in lent_flavors(state, q, cycle) for q in group_of(state, job.queue))
