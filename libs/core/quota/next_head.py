"""Finding, in a scheduling cycle, a queue's next job worth trying: the jobs backing off, the jobs told their
queue could never hold them and still so (no head: they hold nobody and take nothing, so their queue ranks by
the job after them), the jobs held behind a job of higher priority, and those at least as large as a job of the
same flavors that already failed this cycle (quota only shrinks during a cycle) are skipped and told why, once."""

from __future__ import annotations

import math

from libs.core.kernel.decider import Decisions
from libs.core.kernel.wait_reasons import (
    BACKING_OFF,
    BEHIND_HIGHER_PRIORITY,
    INADMISSIBLE,
    RETRY_BACKOFF,
    WAITING_FOR_QUOTA,
)
from libs.core.quota.fit import borrows_over_budget, flavors_of, over_budget
from libs.core.quota.order import Order
from libs.core.quota.reasons import defer, quota_reason, tells
from libs.core.quota.reserve import ANY_FLAVOR, held_by_its_own, never_fits
from libs.core.quota.shortcuts.repeated_holds import held_like_another
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def next_head(state: QuotaState, queue: str, order: Order, cycle: Cycle, out: Decisions) -> QuotaJob | None:
    """The next job of the queue worth trying; jobs that cannot fit are told why (once) on the way."""
    backing_off, requeued = state.backing_off, state.requeued
    # None of these changes while the queue's next head is looked for (only trying a head does).
    held = cycle.held_below.get(queue)
    held_all = cycle.held_all.get(queue)
    failures = cycle.failed
    held_for_starving = cycle.held_for_starving
    deferred, version = state.deferred, state.flavors_epoch
    # The last flavors (interned: see fit.flavors_of) and level seen, with what the cycle knows of them.
    seen_flavors: tuple[str, ...] | None = None
    seen_failed: int | None = None
    seen_level = -1
    level_skips = False
    # Held back in every flavor it may use (reserve.usable_flavors finds none) is a job of priority below the
    # smallest priority holding those flavors, all of them held: that bound, found once per flavors (interned)
    # while the queue's holds stay as they are (None: some flavor is not held, so never held in all).
    ungoverned = None if held is None or state.policy.quotas.governed(queue) else ANY_FLAVOR
    held_under: dict[tuple[str, ...], float | None] = {}
    under_flavors: tuple[str, ...] | None = None
    under: float | None = None
    for job in order.remaining:
        job_id = job.job_id
        backoffs = bool(backing_off or requeued)
        if (backoffs or deferred.get(job_id) in INADMISSIBLE) and held_apart(state, job, backoffs, cycle, out):
            continue
        if held is not None or failures:
            flavors = job.flavors if job.flavors_version == version else flavors_of(state, job)
            if held is not None:
                usable = ungoverned or flavors
                if usable is not under_flavors:
                    under_flavors, under = usable, bound_of(held_under, held, usable)
                priority = job.priority
                below_all = held_all is not None and priority < held_all
                if below_all or (under is not None and priority < under):
                    if below_all and deferred.get(job_id) in WAITING_FOR_QUOTA:
                        cycle.stopped_at = job
                        return None  # everything after it is of lower priority still, held in every flavor, and told
                    tell_behind(state, job, cycle, out)
                    continue
            if failures:
                if flavors is not seen_flavors:
                    seen_flavors, seen_failed, seen_level = flavors, failures.get((queue, flavors)), -1
                failed = seen_failed
                if failed is not None and job.demand >= failed:
                    if deferred.get(job_id) in WAITING_FOR_QUOTA:
                        if job.priority != seen_level:
                            seen_level = job.priority
                            level_skips = skips_level(state, (queue, seen_level), failed, cycle)
                        if level_skips:
                            cycle.skipped[seen_level] = job
                            order.skip_level()
                        continue
                    defer(state, job, *quota_reason(state, job, cycle), out)
                    continue
        if held_for_starving and held_like_another(state, job, cycle):
            continue
        return job
    return None


def held_apart(state: QuotaState, job: QuotaJob, backoffs: bool, cycle: Cycle, out: Decisions) -> bool:
    """Is the job no head, by a hold of its own: backing off still (`backoffs`: some job may), or told its queue
    could never hold it and still so? Such a job holds nobody and takes nothing, so its queue ranks by the job
    after it (order.order_key: one within its queue's nominal quota before any borrower, as quota given back to
    a lender is the lender's). It hears what a try would tell it."""
    if backoffs and backs_off(state, job, cycle.now, out):
        return True
    if state.deferred.get(job.job_id) in INADMISSIBLE \
            and held_by_its_own(state, job, over_budget(state, job.queue, cycle), out):
        cycle.passed_inadmissible.add(job.queue)
        return True
    return False


def backs_off(state: QuotaState, job: QuotaJob, now: float, out: Decisions) -> bool:
    """Does the job back off still (told so, once)? A backoff that is over is forgotten here."""
    backoffs = state.backing_off if job.job_id in state.backing_off else state.requeued
    not_before = backoffs.get(job.job_id)
    if not_before is None:
        return False
    if not_before > now:
        if state.deferred.get(job.job_id) not in BACKING_OFF:
            defer(state, job, RETRY_BACKOFF, f"it failed and runs again after {not_before:.0f}", 0, out)
        return True
    del backoffs[job.job_id]
    return False


def tell_behind(state: QuotaState, job: QuotaJob, cycle: Cycle, out: Decisions) -> None:
    """The job is held back behind a job of higher priority of its queue: told so, once. One its queue could
    never hold as the quota is now is told that instead (reserve.never_fits): no job ahead of it is what it waits
    for, and it hears the same whether it was submitted so or its quota was lowered under it."""
    if never_fits(state, job, out, borrows_over_budget(state, job.queue, cycle.now, cycle)):
        return
    if tells(state, job, BEHIND_HIGHER_PRIORITY):
        defer(state, job, BEHIND_HIGHER_PRIORITY, f"a job of higher priority waits for queue {job.queue}'s quota "
              "first", 0, out)


def skips_level(state: QuotaState, level: tuple[str, int], failed: int, cycle: Cycle) -> bool:
    """May the scan skip the rest of the level (queue, priority), a job of it told already failing as one of
    `failed` did? So when nothing of the level is smaller, nor asks for other models."""
    smallest = cycle.smallest.get(level)
    if smallest is None:
        smallest = cycle.smallest[level] = min(state.demands[level])
    return failed <= smallest and len(state.models[level]) == 1


def bound_of(known: dict[tuple[str, ...], float | None], held: dict[str, int],
             flavors: tuple[str, ...]) -> float | None:
    """held_bound, kept in `known` per flavors while the queue's holds stay as they are."""
    if flavors in known:
        return known[flavors]
    bound = known[flavors] = held_bound(held, flavors)
    return bound


def held_bound(held: dict[str, int], flavors: tuple[str, ...]) -> float | None:
    """The priority below which a job of these flavors is held back in every one of them (reserve.usable_flavors
    leaves it none): the smallest priority holding them, if each is held; None if one is not (math.inf for no
    flavors: such a job has none to use)."""
    bound = math.inf
    for flavor in flavors:
        prio = held.get(flavor)
        if prio is None:
            return None
        bound = min(bound, prio)
    return bound
