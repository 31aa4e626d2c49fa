"""Why a job waits for quota, and telling it so: the reason a queue cannot take a job now (by its first flavor,
with the shortfall; the codes are the kernel's, libs/core/kernel/wait_reasons.py, which preemption acts on and
the guarantee checker verifies), and the rule that a job is told a reason only when it is new to it, waiting for
quota counting as one reason whichever limit binds."""

from __future__ import annotations

from contracts import QuotaDeferred
from libs.core.kernel.decider import Decisions
from libs.core.kernel.inadmissible import ceiling_reason
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.wait_reasons import (
    BEHIND_HIGHER_PRIORITY,
    COHORT_QUOTA_EXHAUSTED,
    NO_NODE_COULD_HOLD,
    NOMINAL_QUOTA_ONLY,
    OVER_BUDGET_WAITS,
    PARENT_QUOTA_EXHAUSTED,
    QUEUE_QUOTA_EXHAUSTED,
    QUOTA_LENT_OUT,
    WAITING_FOR_QUOTA,
)
from libs.core.quota.fit import borrows_over_budget, could_ever_fit, could_hold, flavors_of, may_borrow
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def quota_reason(state: QuotaState, job: QuotaJob, cycle: Cycle | None = None) -> tuple[str, str, int]:
    """Why the job's queue cannot take it now (by its first flavor), with the shortfall. Within a cycle
    (`p`) the answer is kept until the next reservation."""
    if cycle is None:
        return reason(state, job)
    spent = borrows_over_budget(state, job.queue, cycle.now, cycle)
    key = (job.queue, job.demand if may_borrow(state, job, spent) else -job.demand, flavors_of(state, job),
           could_hold(state, job))  # (two jobs alike to quota may differ in shape, hence to the nodes)
    found = cycle.reasons.get(key)
    if found is None:
        found = cycle.reasons[key] = reason(state, job, spent)
    return found


def reason(state: QuotaState, job: QuotaJob, spent: bool = False) -> tuple[str, str, int]:
    """Why the job waits for quota; `spent`: its queue is over budget and borrows (fit.borrows_over_budget)."""
    book = state.book
    borrows = may_borrow(state, job, spent)
    if not could_ever_fit(state, job, spent):
        return ceiling_reason(book, job.queue, job.demand, flavors_of(state, job), borrows, job.spec.gpu_models)
    if not could_hold(state, job):
        return (NO_NODE_COULD_HOLD, f"the job needs {job.demand / 1000:g} GPUs and no node present (registered, "
                "healthy, not cordoned) could hold it even with every running job gone: it holds no quota for "
                "itself, and waits until a node that could hold it registers", job.demand)
    flavor = (flavors_of(state, job) or (ANY,))[0]
    lim = book.limits.get(job.queue, {}).get(flavor)
    nominal = lim.nominal if lim is not None else 0
    used = book.usage(job.queue, flavor)
    room = book.room(job.queue, flavor)
    shortfall = max(0, job.demand - room)
    where = f"queue {job.queue}" + (f" ({flavor})" if flavor != ANY else "")
    ceiling = book.ceiling(job.queue, flavor)
    if not borrows and lim is not None and used + job.demand > nominal:  # (a queue without quota: its parent's)
        return (NOMINAL_QUOTA_ONLY, f"{where} holds {used / 1000:g} of its nominal {nominal / 1000:g} GPUs; the "
                f"job needs {job.demand / 1000:g} and, as it cannot be preempted, never borrows",
                used + job.demand - nominal)
    if used + job.demand > ceiling:
        return (QUEUE_QUOTA_EXHAUSTED, f"{where} holds {used / 1000:g} of at most {ceiling / 1000:g} GPUs "
                f"(nominal {nominal / 1000:g}); the job needs {job.demand / 1000:g}", shortfall)
    parent_room = book.parent_room(job.queue, flavor)
    if parent_room < job.demand:
        return (PARENT_QUOTA_EXHAUSTED, f"{where} has room, but its parent's quota bounds the queues under it and "
                f"leaves {parent_room / 1000:g} GPUs; the job needs {job.demand / 1000:g}",
                job.demand - parent_room)
    if used + job.demand <= nominal:
        # What of its own nominal quota the cohort does not leave it: the part lent out (not the shortfall).
        lent = max(0, book.nominal_left(job.queue, flavor) - room)
        return (QUOTA_LENT_OUT, f"{where} is under its nominal quota but {lent / 1000:g} GPUs of it are lent to "
                f"other queues of its cohort; the job needs {job.demand / 1000:g}", shortfall)
    return (COHORT_QUOTA_EXHAUSTED, f"{where} must borrow {shortfall / 1000:g} more GPUs and its cohort has "
            "no idle quota to lend", shortfall)


def tell_new(state: QuotaState, job: QuotaJob, now: float, out: Decisions) -> None:
    """Tell a job that waits anew (admitted, or back in its queue) why, when no cycle reached it. One its queue
    could never hold as the quota is now hears that, not the jobs ahead of it: only a policy change helps it,
    whether it was submitted so or the quota was lowered under it."""
    levels = state.pending.get(job.queue)
    spent = borrows_over_budget(state, job.queue, now)
    if levels and max(levels) > job.priority and could_ever_fit(state, job, spent):
        defer(state, job, BEHIND_HIGHER_PRIORITY, f"a job of higher priority waits for queue {job.queue}'s quota first",
              0, out)
    else:
        defer(state, job, *reason(state, job, spent), out)


def tells(state: QuotaState, job: QuotaJob, code: str) -> bool:
    """Would deferring the job with `code` tell it something new (see defer)?"""
    told = state.deferred.get(job.job_id)
    return told != code and not (told in WAITING_FOR_QUOTA and code in WAITING_FOR_QUOTA)


def defer(state: QuotaState, job: QuotaJob, code: str, message: str, shortfall: int, out: Decisions) -> None:
    """Tell the job why it waits, unless it was told so already. Waiting for quota (whichever limit
    binds, or behind a job of higher priority) counts as one reason here: which one applies shifts with
    every reservation, and re-telling each waiting job every time would flood the log without changing
    what anyone does about it."""
    told = state.deferred.get(job.job_id)
    if told != code and not (told in WAITING_FOR_QUOTA and code in WAITING_FOR_QUOTA):
        out.emit(QuotaDeferred, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue, code=code,
                 message=message, shortfall_milli=shortfall)


def tell_no_node(state: QuotaState, now: float, out: Decisions) -> set[str]:
    """Nodes went or shrank (lost, cordoned, a GPU sick, registered again smaller or with MIG on): a job waiting
    for quota that no node present could hold any more is told so (preemption then stops acting for it), and
    holds nobody from now on. The queues of the jobs that may have held others (those waiting for quota, or for
    idle quota over budget), for a cycle."""
    queues: set[str] = set()
    for job_id, code in list(state.deferred.items()):
        job = state.jobs.get(job_id)
        if (code not in WAITING_FOR_QUOTA and code != OVER_BUDGET_WAITS) or job is None or job.state != "pending":
            continue
        if not could_hold(state, job):
            queues.add(job.queue)
            if code in WAITING_FOR_QUOTA:
                defer(state, job, *reason(state, job, borrows_over_budget(state, job.queue, now)), out)
    return queues
