"""A reservation that placement does not place in time goes back. When placement deferred a reserved job and
has not placed it within the settings' placement timeout, its quota is released (PLACEMENT_TIMEOUT) and the job
waits again, in its place in line, for a backoff that doubles with each timeout, so that an unplaceable job does
not take and give back quota at every tick; capacity that grows ends the backoff at once. Kept are jobs
placement holds capacity for (they starve there), unless they borrow quota a lender waits for, and preemptors
whose victims are still leaving. A job that
placement placed just as its quota went back takes that quota again."""

from __future__ import annotations

from contracts import QuotaReleased, QuotaReserved
from libs.core.kernel.decider import Decisions
from libs.core.kernel.flavors import flavor_name
from libs.core.kernel.quota_figures import PLACEMENT_TIMEOUT, borrowed_milli
from libs.core.kernel.starvation import CAPACITY_HELD
from libs.core.kernel.wait_reasons import PLACEMENT_TIMED_OUT
from libs.core.quota.reasons import defer
from libs.core.quota.reclaim import lender_waits
from libs.core.quota.state import Cycle, QuotaJob, QuotaState

# A job whose reservation timed out waits this long before it may take quota again, doubling each time (as
# Kueue's requeuing backoff), so that an unplaceable job does not take and give back quota at every tick.
PLACEMENT_BACKOFF_S = 60.0
PLACEMENT_BACKOFF_MAX_S = 3600.0


def placement_backoff_s(timeouts: int) -> float:
    """How long a job waits after its reservation went back unplaced for the `timeouts`-th time."""
    return min(PLACEMENT_BACKOFF_MAX_S, PLACEMENT_BACKOFF_S * 2 ** (timeouts - 1))


def give_back_unplaced(state: QuotaState, now: float, out: Decisions) -> list[str]:
    """Release the reservations placement deferred and has not placed within the placement timeout, unless
    placement holds capacity for the job (it starves there; but not against a lender waiting for the quota it
    borrows: the lender's nominal quota comes first) or the job's preemption victims are still leaving (a
    checkpoint may take longer than the timeout: the room they free is the job's); the queues that got
    quota back."""
    timeout = state.policy.settings.placement_timeout_s
    if not state.unplaced:
        return []
    if timeout is None:
        return give_back_lent(state, now, out)
    # The cycle lender_waits reads through is made only when a job placement holds capacity for is past its
    # timeout (at most ticks ask it): nothing changes before the last job is looked at, so one made then
    # answers as one made first would.
    cycle: Cycle | None = None
    expired: list[QuotaJob] = []
    for job_id in state.unplaced:
        job = state.jobs[job_id]
        if not job.placement_code or now - job.reserved_at < timeout or victims_leaving(state, job_id):
            continue
        if job.placement_code == CAPACITY_HELD:
            if cycle is None:
                cycle = Cycle(now=now)
            if not lender_waits(state, job, cycle):
                continue
        expired.append(job)
    for job in expired:
        out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                 gpu_milli=job.demand, reason=PLACEMENT_TIMEOUT)
        again = state.requeued.get(job.job_id, now)
        defer(state, job, PLACEMENT_TIMED_OUT, f"no node could hold it within {timeout:g} s of its quota "
              f"reservation (placement: {job.placement_code or 'deferred'}); its quota went back and it "
              f"may be reserved again {max(0.0, again - now):.0f} s from now", 0, out)
    return [job.queue for job in expired]


def give_back_lent(state: QuotaState, now: float, out: Decisions) -> list[str]:
    """Without a placement timeout nothing else gives back a reservation placement deferred, and no eviction can
    take it (it holds no GPU): a borrower that placement deferred gives back the quota a lender of its cohort waits
    for (lender_waits), on the next tick, as it would at its timeout. Else a borrower never placed (its node lost,
    its model gone) would keep the lender's nominal quota for good. The queues that got quota back."""
    cycle = Cycle(now=now)
    expired = [job for job_id in state.unplaced if (job := state.jobs[job_id]).placement_code
               and not victims_leaving(state, job_id) and lender_waits(state, job, cycle)]
    for job in expired:
        out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                 gpu_milli=job.demand, reason=PLACEMENT_TIMEOUT)
        again = state.requeued.get(job.job_id, now)
        defer(state, job, PLACEMENT_TIMED_OUT, f"placement has not placed it (placement: {job.placement_code}) and "
              "a queue of its cohort waits for the quota it borrows: its quota went back and it may be reserved "
              f"again {max(0.0, again - now):.0f} s from now", 0, out)
    return [job.queue for job in expired]


def victims_leaving(state: QuotaState, job_id: str) -> bool:
    """Does a victim chosen for the job still run the run it was chosen in (it holds the quota it held then)?"""
    decided = state.victims_of.get(job_id)
    if decided is None:
        return False
    at, victims = decided
    return any((v := state.jobs.get(victim)) is not None and v.state == "reserved" and v.reserved_at < at
               for victim in victims)


def take_back(state: QuotaState, job: QuotaJob, out: Decisions) -> None:
    """Placement placed the job before it read that the job's quota went back: the job runs, so it holds
    its quota again, in the flavor it had (the preemption service reclaims what this overdraws)."""
    if job.state != "pending":
        return
    state.requeued.pop(job.job_id, None)
    nominal_left = state.book.nominal_left(job.queue, job.flavor)
    borrowed = borrowed_milli(state.book, job.queue, job.demand, nominal_left, job.over_budget)
    out.emit(QuotaReserved, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue, gpu_milli=job.demand,
             flavor=flavor_name(job.flavor), borrowed_milli=borrowed, over_budget=job.over_budget)


def end_placement_backoffs(state: QuotaState, now: float) -> None:
    """Capacity grew (a node registered or came back, a GPU is healthy again): a job that waits out its backoff
    after a placement timeout waited for the cluster to change, and it has: it may take quota again now (its
    backoff still doubles if placement again cannot place it), so that no GPU sits idle while it waits."""
    for job_id in state.requeued:
        state.requeued[job_id] = min(state.requeued[job_id], now)
        state.backoffs_ended.append(state.jobs[job_id].queue)
