"""Lent quota comes back at once from borrowers that hold no capacity.

A reclaim by eviction (libs/core/reclaim.py) is for running borrowers. A borrower whose quota is reserved but
which placement could not place yet (it told quota why) holds no GPU: evicting it is impossible, and waiting
for its placement timeout would keep the lender's quota idle for nothing. So while a queue under its nominal
quota waits for quota of a flavor lent out, with a job that quota could serve, the quota decider gives back
the reservations of that flavor's unplaced borrowers (other queues of the cohort that borrow it, or jobs
admitted over budget), newest reservation first, each only if it gives the lender room, until the lender's
job has room. Kept are those that hold or will hold capacity: placement holds capacity for the job (it
starves there), or it is a preemptor whose victims are still leaving (the room they free is its). The jobs
given back wait again, and the lender-first rule (no borrower grows while a lender waits) keeps them from
taking the quota again before the lender does. On an input that frees capacity (a job ending, a node back)
placement may be placing such a borrower at that very moment, so quota leaves it to placement then and gives
the reservation back on the next clock tick instead.

The guarantee checker asks the same question of the decider's folded state (`releasable_unplaced`), so the
two cannot disagree about which borrowers owe quota back at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.core.quota_state import QuotaJob
from libs.core.starvation import CAPACITY_HELD

if TYPE_CHECKING:
    from libs.core.quota import QuotaDecider

RECLAIMED_UNPLACED = "reclaimed_unplaced"  # the QuotaReleased reason of such a borrower


def holds_no_capacity(d: QuotaDecider, job: QuotaJob) -> bool:
    """Reserved, not placed (placement said why), no capacity held for it, no victims of its still leaving."""
    return (job.state == "reserved" and not job.placed and bool(job.placement_code)
            and job.placement_code != CAPACITY_HELD and not d._victims_leaving(job.job_id))


def unplaced_borrowers(d: QuotaDecider, lender: str, flavor: str) -> list[QuotaJob]:
    """The reservations of `flavor` of the lender's cohort peers that borrow it (or were admitted over budget)
    and hold no capacity, newest first."""
    book = d.book
    cohort = book.cohort.get(lender, "")
    if not cohort or not d.unplaced:
        return []
    out = []
    for job_id in reversed(d.unplaced):
        job = d.jobs[job_id]
        if (job.flavor == flavor and job.queue != lender and book.cohort.get(job.queue, "") == cohort
                and (job.over_budget or book.borrowed(job.queue, flavor) > 0) and holds_no_capacity(d, job)):
            out.append(job)
    return out


def releasable_unplaced(d: QuotaDecider, lender: str, flavor: str, need: int) -> list[QuotaJob]:
    """The unplaced borrowers whose reservations quota gives back for the lender's job of `need` (which fits
    the lender's nominal quota of the flavor but not its room): newest first, each only while the lender
    still lacks room and only if giving it back adds to that room (a queue's borrowing or a parent's quota
    may be what binds). Tried on the book and undone."""
    book = d.book
    if need > book.nominal_left(lender, flavor) or book.room(lender, flavor) >= need:
        return []
    taken: list[QuotaJob] = []
    try:
        for job in unplaced_borrowers(d, lender, flavor):
            room = book.room(lender, flavor)
            if room >= need:
                break
            if not job.over_budget and book.borrowed(job.queue, flavor) <= 0:
                continue  # its queue borrows no more (an earlier one given back was the borrowing)
            book.add(job.queue, flavor, -job.demand, job.over_budget)
            if book.room(lender, flavor) <= room:
                book.add(job.queue, flavor, job.demand, job.over_budget)
                continue
            taken.append(job)
    finally:
        for job in taken:
            book.add(job.queue, flavor, job.demand, job.over_budget)
    return taken


def lender_need(d: QuotaDecider, queue: str, flavor: str, now: float) -> int | None:
    """The demand of the queue's first job the flavor could serve: the smallest of its highest waiting priority
    that has one (jobs below wait behind it), leaving out jobs backing off, jobs their user's limit holds
    (they wait for something else) and jobs no node present could hold (they hold nobody). None when no job of
    the queue could use the flavor."""
    levels = d.pending.get(queue)
    if not levels:
        return None
    spec = d.policy.queues.get(queue)
    limit = spec.user_max_gpus if spec is not None else None
    for prio in sorted(levels, reverse=True):
        smallest: int | None = None
        for user, keys in levels[prio].items():
            held = d.user_used.get((queue, user), 0)
            for _, job_id in keys:
                job = d.jobs[job_id]
                if max(d.backing_off.get(job_id, now), d.requeued.get(job_id, now)) > now:
                    continue
                if limit is not None and held + job.demand > limit * 1000:
                    continue
                if flavor in d._flavors(job) and (smallest is None or job.demand < smallest) and (
                        d._inventory_could_hold(job)):
                    smallest = job.demand
        if smallest is not None:
            return smallest
    return None
