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
job at all (`find_shadow` answers None). When the running jobs do not say when they end, the start is unknown
and nobody backfills, but rules 3 and 4 still apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster import Cluster

UNKNOWN_START = float("inf")  # the shadow time when the running jobs do not declare when they end
# Placement's word to the starving job itself: capacity is held for it (quota then keeps its reservation).
CAPACITY_HELD = "capacity_held_for_it"

T = TypeVar("T")
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


def backfills(duration_s: float | None, now: float, shadow: float) -> bool:
    """Does a job of this declared runtime, started now, end before the starving job could start?"""
    return duration_s is not None and shadow != UNKNOWN_START and now + duration_s <= shadow


def holds(starving: Starving | None, job_id: str, priority: int, duration_s: float | None, now: float,
          effect: Callable[[], RoomEffect]) -> bool:
    """Must the job wait for the starving job? `effect` answers rules 3 and 4 (see the module doc) for the
    job's tentative share; it is asked last, as it is the costly part."""
    if starving is None or job_id == starving.job_id or priority > starving.priority:
        return False
    if backfills(duration_s, now, starving.shadow):
        return False
    takes_usable_room, leaves_its_room = effect()
    return takes_usable_room and not leaves_its_room


def find_shadow(now: float, declared: Sequence[tuple[float, T]], undeclared: Iterable[T],
                release: Callable[[T], None], restore: Callable[[T], None], fits: Callable[[], bool]
                ) -> Shadow[T] | None:
    """When the starving job could start (now, if it fits already): release the running jobs in declared-end
    order until it fits.
    If the declared ends never free enough, the start is unknown, unless it would not fit even with the
    undeclared jobs gone too: then it can never fit (None). Everything released is restored before returning."""
    released: list[T] = []
    try:
        if fits():
            return Shadow(at=now, ending=())
        for end, item in declared:
            release(item)
            released.append(item)
            if fits():
                return Shadow(at=end, ending=tuple(released))
        ending = tuple(released)
        for item in undeclared:
            release(item)
            released.append(item)
        return Shadow(at=UNKNOWN_START, ending=ending) if fits() else None
    finally:
        for item in reversed(released):
            restore(item)


def takes_usable_gpus(cluster: Cluster, starving: JobSpec, placements: tuple[ReplicaPlacement, ...]) -> bool:
    """Rule 3 for GPUs: do the placements take a GPU of a model the starving job may use, on a node with
    enough such GPUs to hold one of its replicas? (GPUs on a node too small for it are none of its room.)"""
    per_replica = 1 if starving.gpu_milli > 0 or starving.mig_profile else starving.gpus
    allowed = starving.gpu_models
    for p in placements:
        node = cluster.nodes.get(p.node)
        if node is None or (allowed and p.model not in allowed):
            continue
        if sum(1 for g in node.gpus if not allowed or g.model in allowed) >= per_replica:
            return True
    return False
