"""The ledger's fold of the events about one job: one small handler per event type, each saying what its event
changes in the job's view (the books it moves besides are accounting/job_books.py). It decides nothing: a job's
view is what the deciders' events say of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobStarted,
    JobSubmitted,
    PlacementDeferred,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
)
from contracts.views import JobView, TeamUsage, spec_gpus
from libs.core.accounting.job_books import charge_loss, end_run, held, queue_reserved, set_state, touch, touch_nodes
from libs.core.accounting.state import FINAL_STATES, AdmissionWait, LedgerState, is_long
from libs.core.accounting.view_books import open_run, start_run
from libs.core.kernel.gpu_time import GpuRun

# (the books, the job's view, the event, its position in the log, the GPU runs the event ended)
JobFold = Callable[[LedgerState, JobView, Any, int, list[GpuRun]], None]


def fold_job(books: LedgerState, event: EventBase, seq: int, ended: list[GpuRun]) -> None:
    """Fold an event about one job (one that names a job id) into its view. A job's view begins with its
    submission or its rejection; an event about a job never seen so is not folded."""
    job_id = getattr(event, "job_id", None)
    if job_id is None:
        return
    view = books.jobs.get(job_id)
    if view is None:
        if not isinstance(event, JobSubmitted | JobRejected):
            return
        spec = event.spec
        view = books.jobs[job_id] = JobView(id=job_id, state="", team=spec.team if spec else "",
                                            queue=spec.queue if spec else "", spec=spec, submitted_at=event.ts)
    handler = JOB_FOLDS.get(type(event))
    if handler is not None:
        handler(books, view, event, seq, ended)
    touch(books, view, seq)  # (any event about the job is its latest, handled or not)


def _submitted(books: LedgerState, view: JobView, event: JobSubmitted, seq: int, ended: list[GpuRun]) -> None:
    set_state(books, view, "pending", seq)
    view.phase = "submitted"
    books.submitted.append((view.queue, event.spec.priority))


def _rejected(books: LedgerState, view: JobView, event: JobRejected, seq: int, ended: list[GpuRun]) -> None:
    set_state(books, view, "rejected", seq)
    view.phase, view.reason, view.message = "rejected", event.code, event.message


def _admitted(books: LedgerState, view: JobView, event: JobAdmitted, seq: int, ended: list[GpuRun]) -> None:
    view.phase, view.admitted_at = "admitted", event.ts


def _deferred(books: LedgerState, view: JobView, event: QuotaDeferred | PlacementDeferred, seq: int,
              ended: list[GpuRun]) -> None:
    view.reason, view.message, view.shortfall_milli = event.code, event.message, event.shortfall_milli
    if view.spec is not None and event.message:
        # The recorded reason says how many GPUs; what the job asks for, in its user's terms, is said first (the
        # decision's own text stays as it was recorded).
        view.message = f"{spec_gpus(view.spec)}: {event.message}"


def _quota_reserved(books: LedgerState, view: JobView, event: QuotaReserved, seq: int, ended: list[GpuRun]) -> None:
    view.phase, view.reason, view.message, view.shortfall_milli = "reserved", "", "", 0
    priority = view.spec.priority if view.spec else ""
    books.waits.append(AdmissionWait(view.queue, priority, event.ts - (view.submitted_at or event.ts)))
    queue_reserved(books, event)
    books.holds.reserved(view.id, event.queue, event.flavor, event.gpu_milli)


def _quota_released(books: LedgerState, view: JobView, event: QuotaReleased, seq: int, ended: list[GpuRun]) -> None:
    queue_reserved(books, event)
    books.holds.released(view.id)


def _placed(books: LedgerState, view: JobView, event: JobPlaced, seq: int, ended: list[GpuRun]) -> None:
    view.phase, view.placements, view.reason, view.message = "placed", event.placements, "", ""
    view.shortfall_milli = 0
    books.cluster.allocate(event.placements)
    books.split_gpus.apply(event.placements, +1)
    touch_nodes(books, event.placements)
    open_run(view, event.id, event.placements, event.ts)
    held(books, books.holds.placed(view.id))


def _started(books: LedgerState, view: JobView, event: JobStarted, seq: int, ended: list[GpuRun]) -> None:
    set_state(books, view, "running", seq)
    # A start that crossed a cancellation (the executor started it before it saw the cancel) still ends as
    # cancelled, whatever the eviction that follows says.
    view.phase = "cancelling" if view.phase == "cancelling" else "running"
    view.started_at = event.ts
    start_run(view, event.ts)
    if view.first_started_at is None:
        view.first_started_at = event.ts
        priority = view.spec.priority if view.spec else ""
        books.start_waits.append(AdmissionWait(view.queue, priority, event.ts - (view.submitted_at or event.ts)))
        if is_long(view):
            books.long_started.append(view.queue)


def _failed(books: LedgerState, view: JobView, event: JobFailed, seq: int, ended: list[GpuRun]) -> None:
    """A failure the job's class retries puts it back to waiting; any other ends it, as a finish would."""
    delay = books.retries.on_failed(event, view.spec, books.policy)
    if delay is None:
        _over(books, view, event, seq, ended)
        return
    end_run(books, view, ended, event.ts, "failed", event.reason, event.exit_code)
    view.retries += 1
    set_state(books, view, "pending", seq)
    view.phase, view.exit_code = "retrying", event.exit_code
    view.reason, view.message = event.reason, f"exit code {event.exit_code}: runs again in {delay:g} s"
    books.retried.append((view.queue, event.reason))


def _over(books: LedgerState, view: JobView, event: JobFinished | JobFailed, seq: int, ended: list[GpuRun]) -> None:
    """The job is over: succeeded (finished with exit code 0) or failed."""
    succeeded = isinstance(event, JobFinished) and event.exit_code == 0
    end_run(books, view, ended, event.ts, "succeeded" if succeeded else "failed",
            event.reason if isinstance(event, JobFailed) else "", event.exit_code)
    set_state(books, view, "succeeded" if succeeded else "failed", seq)
    view.phase, view.exit_code, view.finished_at = view.state, event.exit_code, event.ts
    if isinstance(event, JobFailed):
        view.reason = event.reason
    books.teams.setdefault(view.team, TeamUsage(team=view.team)).jobs_finished += 1
    books.dirty_teams[view.team] = None


def _evicted(books: LedgerState, view: JobView, event: JobEvicted, seq: int, ended: list[GpuRun]) -> None:
    """Evicted, the job waits again (its lost GPU time charged); an eviction that stops a cancelled job ends it."""
    cancelled = event.reason == "cancelled" or view.phase == "cancelling"
    if not cancelled:
        charge_loss(books, view, event, ended)
        if is_long(view):
            books.long_interrupted.append((view.queue, event.reason))
    end_run(books, view, ended, event.ts, "cancelled" if cancelled else "evicted", event.reason)
    if cancelled:
        set_state(books, view, "cancelled", seq)
        view.phase, view.finished_at = "cancelled", event.ts
    else:
        view.evictions += 1
        set_state(books, view, "pending", seq)
        view.phase, view.reason = "evicted", event.reason


def _cancelled(books: LedgerState, view: JobView, event: JobCancelled, seq: int, ended: list[GpuRun]) -> None:
    """A job holding GPUs is cancelling until its executor reports it stopped; one holding none is cancelled."""
    if view.state in FINAL_STATES:
        return
    if view.placements:
        view.phase = "cancelling"
    else:
        set_state(books, view, "cancelled", seq)
        view.phase, view.finished_at = "cancelled", event.ts
    view.reason = event.reason


JOB_FOLDS: dict[type[EventBase], JobFold] = {
    JobSubmitted: _submitted,
    JobRejected: _rejected,
    JobAdmitted: _admitted,
    QuotaDeferred: _deferred,
    PlacementDeferred: _deferred,
    QuotaReserved: _quota_reserved,
    QuotaReleased: _quota_released,
    JobPlaced: _placed,
    JobStarted: _started,
    JobFailed: _failed,
    JobFinished: _over,
    JobEvicted: _evicted,
    JobCancelled: _cancelled,
}
