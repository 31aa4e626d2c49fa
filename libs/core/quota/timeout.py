"""A reservation that placement does not place in time goes back. When placement deferred a reserved job and
has not placed it within the settings' placement timeout, quota asks its reservation back (QuotaRecalled);
kept are jobs placement holds capacity for (they starve there), unless they borrow quota a lender waits for,
and preemptors whose victims are still leaving. Placement may be placing that very job as quota asks (both
react to the same tick, each reading the log on its own), so the reservation goes back only on placement's
answer (a PlacementDeferred `reservation_returned`: it let the job go and will not place it under this
reservation); a job placed before placement read the ask keeps its quota, which nobody took meanwhile. Gone
back (PLACEMENT_TIMEOUT), the job waits again, in its place in line, for a backoff that doubles with each
timeout, so that an unplaceable job does not take and give back quota at every tick; capacity that grows ends
the backoff at once."""

from __future__ import annotations

from contracts import QuotaRecalled, QuotaReleased
from libs.core.kernel.decider import Decisions
from libs.core.kernel.quota_figures import PLACEMENT_TIMEOUT
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


def recall_unplaced(state: QuotaState, now: float, out: Decisions) -> None:
    """Ask back the reservations placement deferred and has not placed within the placement timeout, unless
    placement holds capacity for the job (it starves there; but not against a lender waiting for the quota it
    borrows: the lender's nominal quota comes first) or the job's preemption victims are still leaving (a
    checkpoint may take longer than the timeout: the room they free is the job's). Each goes back on
    placement's answer (give_back_returned)."""
    timeout = state.policy.settings.placement_timeout_s
    if not state.unplaced:
        return
    if timeout is None:
        recall_lent(state, now, out)
        return
    # The cycle lender_waits reads through is made only when a job placement holds capacity for is past its
    # timeout (at most ticks ask it): nothing changes before the last job is looked at, so one made then
    # answers as one made first would.
    cycle: Cycle | None = None
    expired: list[QuotaJob] = []
    for job_id in state.unplaced:
        job = state.jobs[job_id]
        if (not job.placement_code or job_id in state.recalled or now - job.reserved_at < timeout
                or victims_leaving(state, job_id)):
            continue
        if job.placement_code == CAPACITY_HELD:
            if cycle is None:
                cycle = Cycle(now=now)
            if not lender_waits(state, job, cycle):
                continue
        expired.append(job)
    for job in expired:
        out.emit(QuotaRecalled, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                 reason=PLACEMENT_TIMEOUT)


def recall_lent(state: QuotaState, now: float, out: Decisions) -> None:
    """Without a placement timeout nothing else gives back a reservation placement deferred, and no eviction can
    take it (it holds no GPU): a borrower that placement deferred gives back the quota a lender of its cohort waits
    for (lender_waits), on the next tick, as it would at its timeout. Else a borrower never placed (its node lost,
    its model gone) would keep the lender's nominal quota for good. Asked back, as at a timeout."""
    cycle = Cycle(now=now)
    expired = [job for job_id in state.unplaced if (job := state.jobs[job_id]).placement_code
               and job_id not in state.recalled and not victims_leaving(state, job_id)
               and lender_waits(state, job, cycle)]
    for job in expired:
        out.emit(QuotaRecalled, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                 reason=PLACEMENT_TIMEOUT)


def give_back_returned(state: QuotaState, job: QuotaJob, now: float, out: Decisions) -> None:
    """Placement let the recalled job go: its reservation goes back (PLACEMENT_TIMEOUT), and it is told why it
    waits again, and for how long."""
    timeout = state.policy.settings.placement_timeout_s
    code = job.placement_code or "deferred"
    out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
             gpu_milli=job.demand, reason=PLACEMENT_TIMEOUT)
    again = f"{max(0.0, state.requeued.get(job.job_id, now) - now):.0f} s from now"
    if timeout is None:
        why = (f"placement has not placed it (placement: {code}) and a queue of its cohort waits for the quota it "
               f"borrows: its quota went back and it may be reserved again {again}")
    else:
        why = (f"no node could hold it within {timeout:g} s of its quota reservation (placement: {code}); its "
               f"quota went back and it may be reserved again {again}")
    defer(state, job, PLACEMENT_TIMED_OUT, why, 0, out)


def victims_leaving(state: QuotaState, job_id: str) -> bool:
    """Does a victim chosen for the job still run the run it was chosen in (it holds the quota it held then)?"""
    decided = state.victims_of.get(job_id)
    if decided is None:
        return False
    at, victims = decided
    return any((v := state.jobs.get(victim)) is not None and v.state == "reserved" and v.reserved_at < at
               for victim in victims)


def end_placement_backoffs(state: QuotaState, now: float) -> None:
    """Capacity grew (a node registered or came back, a GPU is healthy again): a job that waits out its backoff
    after a placement timeout waited for the cluster to change, and it has: it may take quota again now (its
    backoff still doubles if placement again cannot place it), so that no GPU sits idle while it waits."""
    for job_id in state.requeued:
        state.requeued[job_id] = min(state.requeued[job_id], now)
        state.backoffs_ended.append(state.jobs[job_id].queue)
