"""A queue's quota as its spec states it: its flavors (the `nominal_gpus` shorthand is one "*" flavor), each
flavor's limits in thousandths of a GPU (nominal, borrowing limit, the lendable part), the most a parent's subtree
may hold, what a reclaim may take of a queue's usage, and whether a spec may join the queue tree at all. The
arithmetic over the whole tree, usage included, is the QuotaBook's (kernel/quota_math.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import FlavorQuota, QueueSpec
from libs.core.kernel.accelerators import is_pattern
from libs.core.kernel.queue_policies import policy_problem

ANY = "*"  # the flavor of any GPU model
UNLIMITED = 1 << 60


@dataclass(frozen=True, slots=True)
class Limits:
    nominal: int
    borrow: int | None  # None: as far as the cohort lends
    lend: int  # the lendable part of nominal (<= nominal)

    @property
    def guaranteed(self) -> int:
        return self.nominal - self.lend


def flavor_quotas(spec: QueueSpec) -> tuple[FlavorQuota, ...]:
    """A queue's flavors; the `nominal_gpus` shorthand is one "*" flavor."""
    if spec.flavors:
        return spec.flavors
    if spec.nominal_gpus is None:
        return ()
    return (FlavorQuota(model=ANY, nominal_gpus=spec.nominal_gpus, borrowing_limit_gpus=spec.borrowing_limit_gpus,
                        lending_limit_gpus=spec.lending_limit_gpus),)


def limits_of(flavor: FlavorQuota) -> Limits:
    """A flavor's quota in thousandths of a GPU; the lendable part is all of nominal unless a lending limit says
    less."""
    nominal = flavor.nominal_gpus * 1000
    lend = nominal if flavor.lending_limit_gpus is None else min(nominal, flavor.lending_limit_gpus * 1000)
    borrow = None if flavor.borrowing_limit_gpus is None else flavor.borrowing_limit_gpus * 1000
    return Limits(nominal=nominal, borrow=borrow, lend=lend)


def subtree_cap(lim: Limits, in_cohort: bool) -> int:
    """The most a parent's subtree may hold of a flavor: the parent's nominal, plus its borrowing limit when
    the parent is itself in a cohort (no borrowing limit there: no bound beyond its cohort's)."""
    if not in_cohort:
        return lim.nominal
    return UNLIMITED if lim.borrow is None else lim.nominal + lim.borrow


def taken_while_borrowing(held: int, taken: int, largest: int, nominal: int) -> bool:
    """Kueue's rule for what a reclaim takes from another queue: whole jobs, only while the queue borrows. The
    queue holds `held` and loses victims of `taken` in all, the largest of them `largest`: taken largest last,
    each leaves while the queue still holds more than its nominal quota, i.e. with every victim but the largest
    gone it still borrows. So a queue that does not borrow loses nothing, and a borrower is left at most one job
    below its nominal (which stays its own: it may use it again at once, and reclaim it from others)."""
    return held - taken + largest > nominal


def subtree_taken_while_borrowing(own: tuple[int, int, int, int] | None,
                                  branch: Sequence[tuple[int, int, int, int]]) -> bool:
    """The rule a reclaim takes another queue's jobs by, the borrowing unit being the subtree: each level is
    (held, taken, largest, nominal) as `taken_while_borrowing` reads it; `own` is the victims' queue's (None: it
    has no quota of the flavor), `branch` one per ancestor with quota of the flavor that the lender does not
    share. Every such ancestor must still borrow as `taken_while_borrowing` asks (a parent at or below its
    nominal loses nothing: its subtree holds none of what the lender lent), and then either one of them exists
    (its borrowing is its subtree's, whole jobs of any queue under it given back while it borrows), or the
    victims' own queue borrows as the rule asks."""
    if not all(taken_while_borrowing(*level) for level in branch):
        return False
    return bool(branch) or (own is not None and taken_while_borrowing(*own))


def check_tree(queues: dict[str, QueueSpec], candidate: QueueSpec) -> str | None:
    """Why `candidate` cannot join the tree (unknown parent, a cycle, bad limits), or None."""
    if candidate.flavors and (candidate.nominal_gpus is not None or candidate.borrowing_limit_gpus is not None
                              or candidate.lending_limit_gpus is not None):
        return "set either flavors or nominal_gpus (with its limits), not both"
    models = [f.model for f in candidate.flavors]
    if len(set(models)) != len(models):
        return "a flavor is listed twice"
    # A job's "npu:*" (or "Ascend910*") is no model: a flavor of it would match jobs by a name no device has (an
    # any-GPU job reads it as a GPU model) and hand them to placement as the models they may run on, NPUs for CUDA.
    if kinds := [m for m in models if m != ANY and is_pattern(m)]:
        return f"a flavor is quota of one model or of any model (\"*\"), not of a kind or family ({', '.join(kinds)})"
    for f in flavor_quotas(candidate):
        for name, value in (("nominal_gpus", f.nominal_gpus), ("borrowing_limit_gpus", f.borrowing_limit_gpus),
                            ("lending_limit_gpus", f.lending_limit_gpus)):
            if value is not None and value < 0:
                return f"{name} must be >= 0 (flavor {f.model})"
    if candidate.weight <= 0:
        return "weight must be > 0"
    if candidate.budget_period not in ("day", "week", "month"):
        return f"budget_period must be day, week or month, not {candidate.budget_period!r}"
    if candidate.over_budget not in ("borrow", "wait"):
        return f"over_budget must be borrow or wait, not {candidate.over_budget!r}"
    if candidate.budget_gpu_hours is not None and candidate.budget_gpu_hours < 0:
        return "budget_gpu_hours must be >= 0"
    if candidate.user_max_gpus is not None and candidate.user_max_gpus < 0:
        return "user_max_gpus must be >= 0"
    if candidate.reclaim_after_s < 0:
        return "reclaim_after_s must be >= 0"
    if candidate.eviction_budget_gpus is not None and candidate.eviction_budget_gpus < 0:
        return "eviction_budget_gpus must be >= 0"
    if candidate.eviction_window_s <= 0:
        return "eviction_window_s must be > 0"
    if candidate.las_threshold_gpu_hours is not None and candidate.las_threshold_gpu_hours <= 0:
        return "las_threshold_gpu_hours must be > 0"
    if (problem := policy_problem(candidate)) is not None:
        return problem
    parent = candidate.parent
    seen = {candidate.name}
    while parent:
        if parent in seen:
            return f"parent {candidate.parent!r} would make a cycle"
        if parent not in queues:
            return f"parent queue {parent!r} does not exist"
        seen.add(parent)
        parent = queues[parent].parent
    return None
