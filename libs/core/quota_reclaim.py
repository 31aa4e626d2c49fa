"""The lender-first rule: while a queue under its nominal quota waits for quota of a flavor lent out, no
borrower of that flavor grows.

When the smallest waiting job of a queue that a flavor could serve fits the queue's nominal quota of it but not
the room its cohort left, no borrower of the flavor grows that pass, whichever of the queue's jobs comes first in
its own order; the preemption service reclaims what running borrowers hold (libs/core/reclaim.py). A borrower
reserved but not placed holds no GPU and cannot be evicted: it gives its quota back at its placement timeout
(libs/core/quota_timeout.py). Giving it back sooner is placement's to decide, not quota's: quota cannot know
whether placement is placing that job at that very moment, and a job placed after its quota went back takes
that quota again whatever the lender holds by then."""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.core.quota_fit import over_budget, smallest_servable
from libs.core.quota_state import Pass

if TYPE_CHECKING:
    from libs.core.quota import QuotaDecider


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
