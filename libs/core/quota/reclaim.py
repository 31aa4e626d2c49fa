"""The lender-first rule: while a queue under its nominal quota waits for quota of a flavor lent out, no
borrower of that flavor grows.

When the smallest waiting job of a queue that a flavor could serve fits the queue's nominal quota of it but not
the room its cohort left, no borrower of the flavor grows that cycle, whichever of the queue's jobs comes first in
its own order; the preemption service reclaims what running borrowers hold (libs/core/preemption/reclaim.py). A borrower
reserved but not placed holds no GPU and cannot be evicted: it gives its quota back at its placement timeout
(libs/core/quota/timeout.py), even one placement holds capacity for (it starves there) while a lender waits
for that quota (`lender_waits`): the lender's nominal quota comes before a borrower's starvation. Giving it
back sooner is placement's to decide, not quota's: quota cannot know whether placement is placing that job at
that very moment, and a job placed after its quota went back takes that quota again whatever the lender holds
by then."""

from __future__ import annotations

from libs.core.quota.fit import group_of, over_budget, pass_servable, quota_left
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def lent_flavors(state: QuotaState, queue: str, cycle: Cycle) -> list[str]:
    """The flavors whose quota the queue waits for while it is lent out: its smallest job that the flavor could
    serve would fit the queue's own nominal quota of it but not the room its cohort left it. A job held by its
    own user limit or backing off waits for neither (smallest_servable leaves them out)."""
    book = state.book
    if not state.pending.get(queue) or not book.governed(queue) or over_budget(state, queue, cycle):
        return []
    lent = [(f, left, room) for f in book.limits[queue] if (left := (q := quota_left(state, queue, f, cycle))[0])
            > (room := q[1])]
    if not lent:
        return []
    smallest = pass_servable(state, queue, cycle)
    return [f for f, left, room in lent if (need := smallest.get(f)) is not None and left >= need > room]


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
