"""The quota side of the starvation rule (libs/core/kernel/starvation.py). As arithmetic on the quota book: when the
starving job's quota frees up, and what another reservation would do to the room it could use; each answer
changes the book only inside the book's what-if (QuotaBook.what_if), which gives everything back. As the
scheduling cycle applies it: which job of a group starves (`find_starving`), and whether a job about to take
quota must wait for it (`held_for_starving`)."""

from __future__ import annotations

import heapq
from functools import partial

from libs.core.kernel.policy import declared_runtime, runtime_bound
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.kernel.starvation import RoomEffect, Shadow, Starving, find_shadow, holds, longest_waiting
from libs.core.kernel.wait_reasons import WAITING_OR_HELD
from libs.core.quota.fit import could_ever_fit, could_hold, flavors_of
from libs.core.quota.shortcuts.kept_shadow import kept_shadow
from libs.core.quota.state import Cycle, QuotaJob, QuotaState

# A reservation's usage as the book counts it: (queue, flavor, milli, over budget).
Charge = tuple[str, str, int, bool]


def _charge(item: QuotaJob | Charge) -> Charge:
    return (item.queue, item.flavor, item.demand, item.over_budget) if isinstance(item, QuotaJob) else item


def _release(book: QuotaBook, item: QuotaJob | Charge) -> None:
    queue, flavor, milli, over_budget = _charge(item)
    book.add(queue, flavor, -milli, over_budget)


def _summed(jobs: list[QuotaJob]) -> list[Charge]:
    """The jobs' usage summed per (queue, flavor, over budget): the book adds up changes exactly, so releasing
    the sums is releasing the jobs, in one change per queue rather than one per job."""
    sums: dict[tuple[str, str, bool], int] = {}
    for j in jobs:
        key = (j.queue, j.flavor, j.over_budget)
        sums[key] = sums.get(key, 0) + j.demand
    return [(queue, flavor, milli, over) for (queue, flavor, over), milli in sums.items()]


def _fits(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...]) -> bool:
    return any(book.room(starving.queue, f) >= starving.demand for f in flavors)


def reservations_shadow(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...], holding: list[QuotaJob],
                        now: float) -> Shadow[QuotaJob] | None:
    """When the starving job's quota (of `flavors`) frees up, by the declared runtimes of the reservations
    `holding` it; None when it would not fit even with all of them gone."""
    runtimes = [(declared_runtime(j.spec), j) for j in holding]
    declared = sorted(((j.reserved_at + runtime, j.job_id), j) for runtime, j in runtimes if runtime is not None)
    undeclared = _summed([j for runtime, j in runtimes if runtime is None])
    with book.what_if():
        return find_shadow(now, [(end, j) for (end, _), j in declared], undeclared, release=partial(_release, book),
                           fits=lambda: _fits(book, starving, flavors))


def reservation_effect(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...], ending: tuple[QuotaJob, ...],
                       job: QuotaJob, flavor: str, over_budget: bool) -> RoomEffect:
    """Would reserving `job` in `flavor` shrink the room the starving job could use (in any of its
    `flavors`), and would the starving job still fit beside it at its shadow time (the reservations `ending`
    by then gone)?"""
    with book.what_if():
        for j in ending:
            _release(book, j)
        before = [book.room(starving.queue, f) for f in flavors]
        book.add(job.queue, flavor, job.demand, over_budget)
        after = [book.room(starving.queue, f) for f in flavors]
    return (any(a < b for a, b in zip(after, before, strict=True)), any(a >= starving.demand for a in after))


def find_starving(state: QuotaState, group: list[str], cycle: Cycle) -> None:
    """The group's starving job, by the rule placement shares (starvation.longest_waiting): its longest-waiting
    job past the limit that may starve (may_starve), and when its quota frees up by the reserved jobs'
    declared runtimes (the shadow time backfill must end by; unknown when they do not say: then no job
    backfills)."""
    limit = state.policy.settings.starvation_after_s
    if limit is None or not state.by_wait or cycle.now - state.by_wait[0][0] < limit:
        return
    # The group's waiting jobs, longest waiting first (as in by_wait).
    waits = [w for q in group if (w := state.by_wait_in.get(q))]
    oldest = longest_waiting(((since, state.jobs[job_id]) for since, _, job_id in
                              (waits[0] if len(waits) == 1 else heapq.merge(*waits))), cycle.now, limit,
                             lambda job: may_starve(state, job))
    if oldest is None:
        return
    flavors = flavors_of(state, oldest) or (ANY,)
    if _fits(state.book, oldest, flavors):
        # It fits as the book is: its shadow is now, reservations_shadow's first answer, found without reading
        # the group's reservations.
        shadow: Shadow[QuotaJob] | None = Shadow(at=cycle.now, ending=())
    else:
        shadow = kept_shadow(state, group, oldest, flavors, cycle.now, group_shadow)
    if shadow is None:
        return  # it could not fit even with every reservation gone: it holds nobody
    cycle.starving = oldest
    cycle.rule = Starving(job_id=oldest.job_id, priority=oldest.priority, shadow=shadow.at)
    cycle.ending = shadow.ending


def group_shadow(state: QuotaState, group: list[str], starving: QuotaJob, flavors: tuple[str, ...],
                 now: float) -> Shadow[QuotaJob] | None:
    """When the starving job's quota frees up, by the group's reservations of its flavors (the long way that
    shortcuts/kept_shadow.py keeps)."""
    holding = [j for q in group for j_id in state.reserved.get(q, {}) if (j := state.jobs[j_id]).flavor in flavors]
    return reservations_shadow(state.book, starving, flavors, holding, now)


def may_starve(state: QuotaState, job: QuotaJob) -> bool:
    """May the job, past the starvation limit, be the starving job? Only one waiting for quota (not for its
    user limit or budget) that its queue could ever hold and a node present could hold (the shared rule)."""
    return state.deferred.get(job.job_id) in WAITING_OR_HELD and could_ever_fit(state, job) and could_hold(state, job)


def held_for_starving(state: QuotaState, job: QuotaJob, flavor: str, nominal_left: int, over_budget: bool,
                      cycle: Cycle) -> bool:
    """Must the job, about to take quota of `flavor`, wait for the starving job (libs/core/kernel/starvation.py)?
    A job of another queue within its own queue's nominal quota never does: that quota is its queue's,
    whoever starves elsewhere."""
    starving = cycle.starving
    if starving is None or (job.queue != starving.queue and not over_budget and job.demand <= nominal_left):
        return False
    if job.job_id in state.las_nominated and job.job_id in state.nominated:
        # Its victims, of its own queue and priority, leave for it: held for the starving job, which its
        # nomination holds in turn, they would have been evicted for nothing (placement exempts it alike).
        return False
    return holds(cycle.rule, job.job_id, job.priority, runtime_bound(job.spec), cycle.now,
                 lambda: room_effect(state, job, flavor, over_budget, cycle))


def room_effect(state: QuotaState, job: QuotaJob, flavor: str, over_budget: bool, cycle: Cycle) -> RoomEffect:
    """Would reserving the job in `flavor` shrink the room the starving job could use, and would the
    starving job still fit beside it at its shadow time (the reservations ending by then gone)?"""
    key = (job.queue, flavor, job.demand, over_budget)
    effect = cycle.effects.get(key)
    if effect is not None:
        return effect
    starving = cycle.starving
    if starving is None:
        return (False, False)
    flavors = flavors_of(state, starving) or (ANY,)
    effect = cycle.effects[key] = reservation_effect(state.book, starving, flavors, cycle.ending, job, flavor,
                                                     over_budget)
    return effect
