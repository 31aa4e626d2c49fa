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

The lender-first rule is applied here too (`lent_out`): when the smallest waiting job of a queue that a flavor
could serve fits the queue's nominal quota of it but not the room its cohort left, no borrower of the flavor
grows that pass.

The guarantee checker asks the same question of the decider's folded state (`releasable_unplaced`), so the
two cannot disagree about which borrowers owe quota back at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from contracts import QuotaReleased
from libs.core.decider import Decisions
from libs.core.quota_fit import could_hold, flavors_of, group_of, over_budget, smallest_servable
from libs.core.quota_state import Pass, QuotaJob
from libs.core.quota_timeout import victims_leaving
from libs.core.starvation import CAPACITY_HELD

if TYPE_CHECKING:
    from libs.core.quota import QuotaDecider

RECLAIMED_UNPLACED = "reclaimed_unplaced"  # the QuotaReleased reason of such a borrower


def holds_no_capacity(d: QuotaDecider, job: QuotaJob) -> bool:
    """Reserved, not placed (placement said why), no capacity held for it, no victims of its still leaving."""
    return (job.state == "reserved" and not job.placed and bool(job.placement_code)
            and job.placement_code != CAPACITY_HELD and not victims_leaving(d, job.job_id))


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
                if flavor in flavors_of(d, job) and (smallest is None or job.demand < smallest) and (
                        could_hold(d, job)):
                    smallest = job.demand
        if smallest is not None:
            return smallest
    return None


def lent_out(d: QuotaDecider, group: list[str], p: Pass) -> None:
    """Flavors in which a queue's smallest job that the flavor could serve would fit the queue's own
    nominal quota but not the room its cohort left it: that quota is lent out, so no borrower of the
    flavor grows this pass, whichever of the queue's jobs comes first in its own order. A job held by its
    own user limit or backing off waits for neither, so it freezes nothing."""
    book = d.book
    for q in group:
        levels = d.pending.get(q)
        if not levels or not book.governed(q) or over_budget(d, q, p):
            continue
        lent = [(f, left, room) for f in book.limits[q]
                if (left := book.nominal_left(q, f)) > (room := book.room(q, f))]
        if not lent:
            continue
        smallest = smallest_servable(d, q, [f for f, _, _ in lent], p.now)
        for f, left, room in lent:
            need = smallest.get(f)
            if need is not None and left >= need > room:
                p.no_borrowing.add(f)


def lenders_of_unplaced(d: QuotaDecider) -> set[str]:
    """The queues under their nominal quota of a flavor lent to a borrower holding no capacity: a clock tick
    gives it back to them (when the input that made them wait freed capacity, it was left to placement)."""
    book = d.book
    found: set[str] = set()
    for job_id in d.unplaced:
        job = d.jobs[job_id]
        if not holds_no_capacity(d, job):
            continue
        found.update(q for q in group_of(d, job.queue) if q != job.queue and d.pending.get(q)
                     and book.nominal_left(q, job.flavor) > book.room(q, job.flavor))
    return found


def reclaim_unplaced(d: QuotaDecider, group: list[str], p: Pass, out: Decisions) -> list[QuotaJob]:
    """A queue under its nominal quota whose first job the flavor could serve fits that nominal but not its
    room gets the quota lent to borrowers that hold no capacity back at once; no borrower of the flavor grows
    this pass. The jobs given back."""
    book = d.book
    given_back: list[QuotaJob] = []
    for q in group:
        if not d.pending.get(q) or not book.governed(q) or over_budget(d, q, p):
            continue
        for f in book.limits[q]:
            left = book.nominal_left(q, f)
            if left <= book.room(q, f) or not unplaced_borrowers(d, q, f):
                continue
            need = lender_need(d, q, f, p.now)
            if need is None:
                continue
            released = releasable_unplaced(d, q, f, need)
            for job in released:
                out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                         gpu_milli=job.demand, reason=RECLAIMED_UNPLACED)
            if released:
                given_back.extend(released)
                p.no_borrowing.add(f)
                p.reserved()  # usage changed: what the pass cached goes stale
    return given_back
