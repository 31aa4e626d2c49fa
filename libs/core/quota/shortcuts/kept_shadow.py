"""The starving job's shadow kept between cycles.

Looking for when the starving job's quota frees up (starvation.group_shadow) releases the group's reservations
one by one inside the book's what-if until it fits: most cycles find the same starving job behind the same
reservations, so they would find the same answer. That answer reads only the quota book's limits and usage, the
group's reservations (their flavors, when they were made and their declared runtimes, none of which changes while
a reservation holds) and the starving job with its flavors; never the clock (it is asked only when the job does
not fit as the book is, so its answer is never "now"). So it is kept per group and read back while the policy
version, the starving job, its flavors and the usage the rooms read are those it was found with. The rooms of a
group none of whose queues is in a tree read the usage of the group's queues alone (their cohort's pool is
theirs): then only their usage counts (usage.usage_changed bumps each); otherwise any usage anywhere."""

from __future__ import annotations

from collections.abc import Callable

from libs.core.kernel.starvation import Shadow
from libs.core.quota.state import QuotaJob, QuotaState

# The long way: (state, group, starving job, its flavors, now) -> its shadow, None if it could never fit.
FindShadow = Callable[[QuotaState, list[str], QuotaJob, tuple[str, ...], float], Shadow[QuotaJob] | None]


def kept_shadow(state: QuotaState, group: list[str], starving: QuotaJob, flavors: tuple[str, ...], now: float,
                find: FindShadow) -> Shadow[QuotaJob] | None:
    """The shadow `find` answers, read back when nothing it reads changed since it was found for the group."""
    stamp = (usage_read(state, group), state.policy_version, starving.job_id, flavors)
    key = tuple(group)
    known = state.kept_shadows.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    shadow = find(state, group, starving, flavors, now)
    state.kept_shadows[key] = (stamp, shadow)
    return shadow


def usage_read(state: QuotaState, group: list[str]) -> tuple[int, ...]:
    """The versions of the usage the group's rooms read: its queues' own, or, when one of them is in a tree (a
    parent's quota bounds it, or it bounds its children, across groups), every queue's."""
    book, usage_of = state.book, state.usage_of
    if any(book.bounds.get(queue) or book.children.get(queue) for queue in group):
        return (state.usage_version,)
    return tuple(usage_of.get(queue, 0) for queue in group)
