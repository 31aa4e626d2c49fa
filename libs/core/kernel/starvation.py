"""Starvation protection with EASY backfill: the one rule that quota (for quota) and placement (for GPUs) share.

A job that has waited longer than the settings' `starvation_after_s` becomes the starving job of its cohort
(quota) or of the cluster (placement). Its "shadow" time is when it could start: the first moment by which
the running jobs' declared ends free enough for it. Another job is then held back only when all of these hold:
  1. it is of no higher priority than the starving job,
  2. it does not end (by its declared runtime) before the shadow time: a job that does backfills,
  3. it would take room the starving job could use: quota of a flavor the starving job may draw on (and not
     its own queue's nominal quota), or GPUs on a node that could hold the starving job,
  4. and with it in place the starving job would no longer fit at its shadow time (it leaves no room).
A starving job that could never fit, not even with every running job gone, holds nobody: it is no starving
job at all (`find_shadow` answers None). For GPUs that is judged on the present inventory, by placement's fit:
the registered nodes neither lost nor cordoned, their healthy GPUs, every dimension placement checks, asked of
an empty copy of it (`EmptyInventory`, libs/core/cluster/starving_room.py, with rule 3 on GPUs: the rule's
questions of the nodes live with the cluster model; quota asks through libs/core/quota/fleet.py
`Fleet.could_place`, as well as of its quota), so a job no node present could hold is no starving job for
either, until a node that could hold it is back.
When the running jobs do not say when they end, the start is unknown
and nobody backfills, but rules 3 and 4 still apply.

Who starves: the longest-waiting job past the limit that the present inventory could hold with every running
job gone (`longest_waiting`, asked of the cluster model's `EmptyInventory`), so that a job no node could hold
neither holds anybody nor keeps the next-oldest job, which could run, from being the starving job. Quota and
placement pick it by this one rule, each over its own waiting jobs ordered by wait, stopping at the first that
could fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

UNKNOWN_START = float("inf")  # the shadow time when the running jobs do not declare when they end
# Placement's word to the starving job itself: capacity is held for it (quota then keeps its reservation).
CAPACITY_HELD = "capacity_held_for_it"

T = TypeVar("T")
U = TypeVar("U")
# (does the job take room the starving job could use?, does the starving job still fit beside it?)
RoomEffect = tuple[bool, bool]


@dataclass(frozen=True, slots=True)
class Starving:
    job_id: str
    priority: int
    shadow: float  # when it could start; UNKNOWN_START when the running jobs do not say


@dataclass(frozen=True, slots=True)
class Shadow(Generic[T]):
    at: float  # UNKNOWN_START when the jobs that must end do not declare when
    ending: tuple[T, ...]  # the running jobs that end by then (with declared ends), in end order


def longest_waiting(waits: Iterable[tuple[float, T]], now: float, limit: float, may_starve: Callable[[T], bool]
                    ) -> T | None:
    """The starving job: of `waits` ((since, job), longest waiting first), the first past the limit that
    `may_starve` (the present inventory could hold it with every running job gone, and what else the caller
    asks). None when none: the walk stops at the first job not yet past the limit."""
    for since, item in waits:
        if now - since < limit:
            return None
        if may_starve(item):
            return item
    return None


def backfills(runtime_s: float | None, now: float, shadow: float) -> bool:
    """Is a job that runs at most `runtime_s` (`policy.runtime_bound`: a limit the executor enforces, never an
    estimate, which may be wrong), started now, sure to end before the starving job could start?"""
    return runtime_s is not None and shadow != UNKNOWN_START and now + runtime_s <= shadow


def holds(starving: Starving | None, job_id: str, priority: int, runtime_s: float | None, now: float,
          effect: Callable[[], RoomEffect]) -> bool:
    """Must the job wait for the starving job? `effect` answers rules 3 and 4 (see the module doc) for the
    job's tentative share; it is asked last, as it is the costly part."""
    if starving is None or job_id == starving.job_id or priority > starving.priority:
        return False
    if backfills(runtime_s, now, starving.shadow):
        return False
    takes_usable_room, leaves_its_room = effect()
    return takes_usable_room and not leaves_its_room


def find_shadow(now: float, declared: Sequence[tuple[float, T]], undeclared: Iterable[U],
                release: Callable[[T | U], None], fits: Callable[[], bool]) -> Shadow[T] | None:
    """When the starving job could start (now, if it fits already): release the running jobs in declared-end
    order until it fits.
    If the declared ends never free enough, the start is unknown, unless it would not fit even with the
    undeclared jobs gone too: then it can never fit (None). (The undeclared ones are released all together, so a
    caller may pass them summed up.)
    It restores nothing: call it inside a what-if of the state `release` changes (`Cluster.what_if()`,
    `QuotaBook.what_if()`), which gives everything back."""
    ending: list[T] = []
    if fits():
        return Shadow(at=now, ending=())
    for end, item in declared:
        release(item)
        ending.append(item)
        if fits():
            return Shadow(at=end, ending=tuple(ending))
    for other in undeclared:
        release(other)
    return Shadow(at=UNKNOWN_START, ending=tuple(ending)) if fits() else None
