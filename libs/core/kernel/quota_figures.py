"""The quota figures every reader of quota states the same way: what a reservation charges to its queue's usage
(with the decayed usage fair share reads) and to its flavor in the quota book, what it borrows, the queue's fair
share, what is left of its GPU-hour budget, and the room a queue over that budget has. The quota decider
(libs/core/quota/) applies them to its own state, and the read-only book of them that accounting folds
(kernel/quota_ledger.py) to its: stated once here, the two can never disagree about a figure. The guarantee
checker (libs/audit/guarantees) judges a waiting job by the same over-budget room."""

from __future__ import annotations

from typing import Protocol

from libs.core.kernel.budgets import BudgetBook
from libs.core.kernel.fairness import DecayedUsage
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.quota_math import QuotaBook

PLACEMENT_TIMEOUT = "placement_timeout"  # the QuotaReleased reason of a reservation placement did not place in time
# The QuotaReleased reasons after which the job waits for quota again; after any other its run is over.
WAITS_AGAIN = frozenset({PLACEMENT_TIMEOUT, "evicted", "retry"})


class QuotaFigures(Protocol):
    """What holds the figures: the quota decider's state, or the ledger's read-only book."""

    policy: PolicyBook
    queue_used: dict[str, int]
    decayed: dict[str, DecayedUsage]
    budgets: BudgetBook


def charge_queue(figures: QuotaFigures, queue: str, flavor: str, milli: int, over_budget: bool, now: float) -> None:
    """A reservation of `milli` (negative: given back) changes its queue's usage, decayed usage first (it
    integrates the usage held until now), and its flavor's in the quota book."""
    half_life = figures.policy.settings.fair_share_half_life_s
    decayed = figures.decayed.setdefault(queue, DecayedUsage(since=now))
    decayed.advance(figures.queue_used.get(queue, 0), now, half_life)
    figures.queue_used[queue] = figures.queue_used.get(queue, 0) + milli
    figures.policy.quotas.add(queue, flavor, milli, over_budget)


def fair_share(figures: QuotaFigures, queue: str, now: float) -> float:
    """Weighted (decayed) usage relative to nominal quota: 1.0 is exactly the queue's share."""
    spec = figures.policy.queues.get(queue)
    half_life = figures.policy.settings.fair_share_half_life_s
    used = subtree_used(figures, queue, now, half_life)
    nominal = max(figures.policy.quotas.nominal_of(queue), 1)
    return used / nominal / (spec.weight if spec is not None else 1.0)


def subtree_used(figures: QuotaFigures, queue: str, now: float, half_life: float) -> float:
    """The queue's usage, half now and half decayed, with that of the queues below it."""
    current = figures.queue_used.get(queue, 0)
    decayed = figures.decayed.get(queue)
    own = (current + decayed.value(current, now, half_life)) / 2 if decayed is not None else current / 2
    children = figures.policy.quotas.children.get(queue)
    return own + sum(subtree_used(figures, c, now, half_life) for c in children) if children else own


def budget_period(policy: PolicyBook, queue: str) -> str | None:
    """The period the queue's GPU-hour budget runs over (None: it has no budget)."""
    spec = policy.queues.get(queue)
    return None if spec is None or spec.budget_gpu_hours is None else spec.budget_period


def budget_left_s(figures: QuotaFigures, queue: str, now: float) -> float | None:
    """GPU-seconds left in the queue's budget period: what its jobs ran in it, runs going on up to now."""
    spec = figures.policy.queues.get(queue)
    if spec is None or spec.budget_gpu_hours is None:
        return None
    return spec.budget_gpu_hours * 3600 - figures.budgets.spent_s(queue, now, spec.budget_period)


def over_budget_room(book: QuotaBook, queue: str, flavor: str) -> int:
    """The room of a queue over its GPU-hour budget that may go on (over_budget: borrow): only quota nobody else
    is owed, which is idle. Of a queue with quota, that is what its cohort's peers lend and leave idle, never its
    own nominal quota (QuotaBook.borrow_only_room): its nominal is owed to it only within budget. A queue
    without quota of its own is owed nothing and holds no one's claim: quota never ties what it takes to any
    queue's quota, so the free capacity it would use is capacity no queue's quota claims, idle by definition,
    and its room is what it has within budget (unlimited, but for what a parent with quota leaves its subtree).
    Its reservations are over budget all the same, so preemption may take them whatever their class."""
    if not book.governed(queue):
        return book.room(queue, flavor)
    return book.borrow_only_room(queue, flavor)


def borrowed_milli(book: QuotaBook, queue: str, demand: int, nominal_left: int, over_budget: bool) -> int:
    """What a reservation borrows from its queue's cohort (QuotaReserved.borrowed_milli): over budget all of it,
    as its queue's own nominal is not its then; within budget what passes the nominal left. A queue without
    quota of its own has no cohort to borrow from: none, over budget too."""
    if over_budget:
        return demand if book.governed(queue) else 0
    return max(0, demand - nominal_left)
