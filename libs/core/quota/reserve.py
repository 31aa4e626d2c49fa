"""Trying one job in a scheduling cycle: it gets quota (QuotaReserved) in the first flavor it may use that has room
for it, unless its user's limit or its queue's budget holds it, its queue could never hold it, the quota is held
for the starving job or for a nominated preemptor, or a queue under its nominal quota waits for that flavor's
lent quota. A job that gets none is told why (once), holds the lower jobs of its queue back in the flavors it
could use, and, when it fits its own nominal quota, freezes the borrowers of those flavors for the cycle."""

from __future__ import annotations

from contracts import QuotaReserved
from libs.core.kernel.decider import Decisions
from libs.core.kernel.flavors import flavor_name
from libs.core.kernel.inadmissible import user_limit_message
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.policy import runtime_bound
from libs.core.kernel.queue_policies import flavors_in_turn, fungible, waits_to_preempt
from libs.core.kernel.quota_figures import borrowed_milli, over_budget_room
from libs.core.kernel.quota_math import ANY, UNLIMITED
from libs.core.kernel.wait_reasons import (
    BUDGET_SPENT,
    COHORT_QUOTA_EXHAUSTED,
    EXCEEDS_QUEUE_QUOTA,
    HELD_FOR_PREEMPTOR,
    HELD_FOR_STARVING_JOB,
    NO_QUOTA_FOR_MODELS,
    OVER_BUDGET_WAITS,
    USER_LIMIT,
    WAITING_FOR_QUOTA,
)
from libs.core.quota.fit import (
    could_ever_fit,
    could_hold,
    entitled,
    flavors_of,
    lent_to,
    may_borrow,
    over_budget,
    quota_left,
)
from libs.core.quota.nomination import holding_nominee
from libs.core.quota.reasons import defer, quota_reason, reason, tells
from libs.core.quota.shortcuts.repeated_holds import starving_key
from libs.core.quota.starvation import held_for_starving
from libs.core.quota.state import Cycle, QuotaJob, QuotaState

ANY_FLAVOR: tuple[str, ...] = (ANY,)  # the flavors of a job in a queue without quota


def try_reserve(state: QuotaState, job: QuotaJob, cycle: Cycle, out: Decisions) -> bool:
    """Try the job: reserve quota for it (True), or tell it why it waits, once (False)."""
    # (Codes that do not wait for quota are told whenever they are new: see tells.)
    spent = cycle.over_budget.get(job.queue)
    if spent is None:
        spent = over_budget(state, job.queue, cycle)
    if held_by_its_own(state, job, spent, out):
        return False
    flavors = flavors_to_try(state, job, cycle, spent)
    held_for_starving_job = False
    held_by: QuotaJob | None = None  # the preemptor the quota it could take is held for
    borrows = job.borrows if job.borrows_version == state.policy_version else may_borrow(state, job)  # (kept)
    no_borrowing = cycle.no_borrowing
    kept_quota = cycle.quota
    for flavor in flavors:
        # (quota_left, its cycle's answer read here first: every flavor of every try asks it)
        left = kept_quota.get((job.queue, flavor))
        nominal_left, room = left if left is not None else quota_left(state, job.queue, flavor, cycle)
        if no_borrowing and flavor in no_borrowing and (spent or job.demand > nominal_left):
            continue  # a queue under nominal waits for lent quota: no borrower grows meanwhile
        if spent:  # only quota nobody else is owed (the kernel's rule, shared with the checker)
            room = over_budget_room(state.book, job.queue, flavor)
        elif not borrows:  # it could never give borrowed quota back: its queue's own nominal only
            room = min(room, nominal_left)
        if job.demand > room:
            continue
        if cycle.rule is not None and held_for_starving(state, job, flavor, nominal_left, spent, cycle):
            held_for_starving_job = True
            continue
        if cycle.nominees and (nominee := holding_nominee(state, cycle.nominees, job, flavor, spent,
                                                          cycle.nominee_effects)) is not None:
            held_by = nominee
            continue
        borrowed = borrowed_milli(state.book, job.queue, job.demand, nominal_left, spent)
        out.emit(QuotaReserved, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                 gpu_milli=job.demand, flavor=flavor_name(flavor), borrowed_milli=borrowed,
                 over_budget=spent)
        if job is cycle.starving:
            cycle.rule = None  # it holds quota now: nobody waits for it any longer
        return True
    if held_by is not None:
        tell_held_for_preemptor(state, job, held_by, out)
    elif held_for_starving_job:
        tell_held_for_starving(state, job, cycle, out)
    else:
        not_reserved(state, job, flavors, borrows, spent, cycle, out)
    return False


def held_by_its_own(state: QuotaState, job: QuotaJob, spent: bool, out: Decisions) -> bool:
    """Does a hold of the job's own keep it from quota whatever room there is: its user's limit, its queue's spent
    budget where the queue then waits, a ceiling its queue could never hold it under (`spent`: its queue is over
    budget)? Told so, each in that order."""
    # (Over budget a job gets to never_fits only if its queue goes on borrowing: one that waits stopped before.)
    return over_user_limit(state, job, out) or (spent and waits_for_budget(state, job, spent, out)) \
        or never_fits(state, job, out, spent)


def over_user_limit(state: QuotaState, job: QuotaJob, out: Decisions) -> bool:
    """Would the job take its user past the user limit of its queue? Then it waits, told so."""
    queue = state.policy.queues.get(job.queue)
    limit = queue.user_max_gpus if queue is not None else None
    if limit is None or state.user_used.get((job.queue, job.user), 0) + job.demand <= limit * 1000:
        return False
    if state.deferred.get(job.job_id) != USER_LIMIT:
        held = state.user_used.get((job.queue, job.user), 0)
        defer(state, job, USER_LIMIT, user_limit_message(job.user, job.queue, held, job.demand, limit), 0, out)
    return True


def waits_for_budget(state: QuotaState, job: QuotaJob, spent: bool, out: Decisions) -> bool:
    """Did the job's queue spend its budget, and does it wait for the next period then? Told so."""
    queue = state.policy.queues.get(job.queue)
    if not spent or queue is None or queue.over_budget != "wait":
        return False
    if state.deferred.get(job.job_id) != BUDGET_SPENT:
        defer(state, job, BUDGET_SPENT, f"queue {job.queue} spent its {queue.budget_gpu_hours:g} GPU-hour "
              f"{queue.budget_period}ly budget; it waits for the next period", 0, out)
    return True


def never_fits(state: QuotaState, job: QuotaJob, out: Decisions, spent: bool = False) -> bool:
    """Can its queue not hold the job at all as its quota is now (more than its ceiling, no quota of its models:
    submitted so, or quota lowered, flavor removed)? It waits, holding nothing, until a policy change gives it
    room (libs/core/kernel/inadmissible.py). `spent`: its queue is over budget and borrows (fit.borrows_over_budget),
    so the job is judged by the ceiling with borrowing, as it is reserved (fit.may_borrow)."""
    if (job.fits if job.fits_version == state.flavors_epoch and job.fits_spent == spent
            else could_ever_fit(state, job, spent)):  # (kept on the job)
        return False
    code = NO_QUOTA_FOR_MODELS if not flavors_of(state, job) else EXCEEDS_QUEUE_QUOTA
    if tells(state, job, code):
        defer(state, job, *reason(state, job, spent), out)
    return True


def flavors_to_try(state: QuotaState, job: QuotaJob, cycle: Cycle, spent: bool) -> tuple[str, ...]:
    """The job's usable flavors in the order they are tried: by its queue's flavor fungibility (judged on all
    its flavors, those held for a job above included: kernel/queue_policies.py), and placement could not place
    its last reservation of the flavor it timed out in, so another with room is tried first."""
    flavors = usable_flavors(state, job, cycle)
    spec = state.policy.queues.get(job.queue)
    if fungible(spec) and not spent and flavors is not ANY_FLAVOR:
        in_turn = flavors_in_turn(spec, flavors_of(state, job), job.demand,
                                  lambda flavor: quota_left(state, job.queue, flavor, cycle), job.priority,
                                  lambda flavor: lent_to(state, job.queue, flavor))
        flavors = tuple(f for f in in_turn if f in flavors)
    if job.timed_out_flavor is not None and len(flavors) > 1 and job.timed_out_flavor in flavors:
        flavors = (*(f for f in flavors if f != job.timed_out_flavor), job.timed_out_flavor)
    return flavors


def tell_held_for_preemptor(state: QuotaState, job: QuotaJob, held_by: QuotaJob, out: Decisions) -> None:
    if state.deferred.get(job.job_id) != HELD_FOR_PREEMPTOR:
        at = state.nominated[held_by.job_id]
        defer(state, job, HELD_FOR_PREEMPTOR, f"quota freed by preemption is held for job {held_by.job_id} "
              f"(its victims chosen at {at:.0f}) until it is reserved, at the latest until "
              f"{at + NOMINATION_TTL_S:.0f}", 0, out)


def tell_held_for_starving(state: QuotaState, job: QuotaJob, cycle: Cycle, out: Decisions) -> None:
    """The quota the job could take is held for the starving job: told so (the message made once per cycle)."""
    starving = cycle.starving
    cycle.held_for_starving_job = True
    if cycle.one_queue and runtime_bound(job.spec) is None:
        cycle.held_for_starving[starving_key(state, job)] = (cycle.holds, len(cycle.no_borrowing))
    if starving is not None and state.deferred.get(job.job_id) != HELD_FOR_STARVING_JOB:
        if not cycle.held_message:
            cycle.held_message = (f"quota is held for job {starving.job_id}, waiting since {starving.since:.0f}; "
                                  "only jobs ending before it can start, or leaving it its room, may go first")
        defer(state, job, HELD_FOR_STARVING_JOB, cycle.held_message, 0, out)


def not_reserved(state: QuotaState, job: QuotaJob, flavors: tuple[str, ...], borrows: bool, spent: bool,
                  cycle: Cycle, out: Decisions) -> None:
    """No flavor had room for the job: what the cycle learns from that, and what the job is told."""
    # (One that may not borrow failing says nothing of those that may; nor, where a job waits at a flavor whose
    # lent quota a reclaim would give back, does one failing say anything of larger jobs: they may not wait there.)
    if borrows and not waits_to_preempt(state.policy.queues.get(job.queue)):
        key = (job.queue, flavors_of(state, job))
        cycle.failed[key] = min(cycle.failed.get(key, UNLIMITED), job.demand)
    # A job no node present could hold, even with every running job gone, holds nobody: quota kept for it
    # could not start it, so neither the jobs below it nor borrowers wait for it (nor does anyone reclaim
    # for it: it is told so, which preemption does not act on).
    holds_others = could_hold(state, job)
    if holds_others:
        hold_below(state, job, cycle)
    if spent:
        # Only idle quota of its peers may serve it; evicting anyone for it would be wrong.
        if tells(state, job, OVER_BUDGET_WAITS):
            defer(state, job, OVER_BUDGET_WAITS, f"queue {job.queue} spent its GPU-hour budget; the job waits "
                  "for idle quota its cohort lends", 0, out)
        return
    # Every quota reason waits for quota: a job told it waits for quota is not told again (see defer).
    tell = state.deferred.get(job.job_id) not in WAITING_FOR_QUOTA or not holds_others
    if tell:
        code, message, shortfall = quota_reason(state, job, cycle)
        if cycle.no_borrowing and code == COHORT_QUOTA_EXHAUSTED:
            message = ("a queue under its nominal quota waits for quota lent out first; no queue borrows more "
                       "meanwhile")
    if holds_others and entitled(state, job, cycle):  # (asked only here: it reads what no telling changes)
        # It fits its own nominal, yet no room: that quota is lent out. No borrower of it grows now.
        cycle.no_borrowing.update(f for f in flavors if quota_left(state, job.queue, f, cycle)[0] >= job.demand)
    if tell:
        defer(state, job, code, message, shortfall, out)


def usable_flavors(state: QuotaState, job: QuotaJob, cycle: Cycle) -> tuple[str, ...]:
    """The flavors the job may take quota of in this cycle: its own, less those a job of higher priority
    of its queue waits for (which holds lower jobs back there)."""
    if not state.policy.quotas.limits.get(job.queue):  # (QuotaBook.governed)
        flavors = ANY_FLAVOR
    else:
        flavors = job.flavors if job.flavors_version == state.flavors_epoch else flavors_of(state, job)
    held = cycle.held_below.get(job.queue)
    if not held:
        return flavors
    priority = job.priority
    for flavor in flavors:
        if held.get(flavor, priority) > priority:  # (most often none is held: the flavors as they are)
            return tuple(f for f in flavors if held.get(f, priority) <= priority)
    return flavors


def hold_below(state: QuotaState, job: QuotaJob, cycle: Cycle) -> None:
    """The job did not get quota: lower jobs of its queue wait behind it in the flavors it could use."""
    cycle.holds += 1
    queue, priority = job.queue, job.priority
    held = cycle.held_below.get(queue)
    if held is None:
        held = cycle.held_below[queue] = {}
    book = state.policy.quotas
    for f in flavors_of(state, job) if book.governed(queue) else ANY_FLAVOR:
        if held.get(f, priority) <= priority:
            held[f] = priority
    # Held in every flavor of the queue: by the smallest priority holding one.
    least: int | None = None
    for f in book.limits.get(queue) or ANY_FLAVOR:
        prio = held.get(f)
        if prio is None:
            return
        if least is None or prio < least:
            least = prio
    if least is not None:
        cycle.held_all[queue] = least
