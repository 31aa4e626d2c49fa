"""Does a lender wait for quota it lent? One rule, asked by quota (no borrower of the flavor grows meanwhile, and
a starving borrower's reservation goes back at its placement timeout: libs/core/quota/reclaim.py), preemption
(which simulates quota's answer: libs/core/preemption/simulation.py) and the guarantee checker (which owes the
lender a reclaim within its bound and excuses a borrower held back: libs/audit/guarantees/holds.py).

A queue waits for its quota of a flavor lent out when the job its own order admits next in that flavor fits what
is left of the queue's nominal quota of it but not the room its cohort leaves it (`QuotaBook.waits_for_lent_quota`).
That job is the one quota would give the flavor's quota to first, as its queue's order has it:

1. By priority, strictly. A job that gets no quota holds the jobs of lower priority of its queue back in every
   flavor it may use (libs/core/quota/reserve.py `hold_below`; preemption's holds.py knows it too): a small job of
   lower priority held behind a large one of higher priority does not run first, whatever room there is for it,
   so it is not what its queue waits for. Nor is a job of higher priority that cannot use the flavor: it holds
   nobody there.
2. Within one priority, best effort: no job holds another of its priority (a smaller job takes the room a larger
   one does not fit), so of that priority the smallest job is the one the room must hold first.

Only jobs waiting for quota count, as quota tries them: not one backing off, one held by its user's limit, one
no node present could hold, nor one its queue could never hold as its quota is now; none of those holds anybody
back. Each party lists the jobs it knows so; the turn among them and the question are asked here."""

from __future__ import annotations

from collections.abc import Iterable

from libs.core.kernel.quota_math import QuotaBook

Waiter = tuple[int, int, str]  # (priority, demand in thousandths of a GPU, job id) of a job waiting for quota


def first_in_turn(waiting: Iterable[Waiter]) -> Waiter | None:
    """Of a queue's jobs waiting for quota that a flavor could serve, the one its order admits next there: of
    the highest priority, the smallest (then the first by id). None: no job waits for that flavor."""
    return min(waiting, key=lambda w: (-w[0], w[1], w[2]), default=None)


def waits_for_lent_quota(book: QuotaBook, queue: str, flavor: str, waiting: Iterable[Waiter]) -> bool:
    """Does the queue wait for its quota of the flavor lent out: its first job in turn there (first_in_turn of
    `waiting`, its jobs waiting for quota that the flavor could serve) fits what is left of its nominal quota of
    the flavor, but not the room its cohort leaves it?"""
    first = first_in_turn(waiting)
    return first is not None and book.waits_for_lent_quota(queue, flavor, first[1])
