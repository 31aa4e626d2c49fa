"""What a job's change moves in the ledger's other books: its queue's counters and waiting demand when its state
changes, the GPU time charged (and lost) when a run ends, the nodes and GPUs it frees, and what the projector must
write again. The job fold's handlers (accounting/job_fold.py) call these, so that each handler says only what its
event changes in the job's own view."""

from __future__ import annotations

from contracts import JobEvicted, QuotaReleased, QuotaReserved, ReplicaPlacement
from contracts.views import JobView, TeamUsage
from libs.core.accounting.state import LedgerState, demand_model, requested_gpus
from libs.core.accounting.view_books import close_run
from libs.core.kernel.gpu_time import GpuRun
from libs.core.kernel.gpu_units import FULL


def set_state(books: LedgerState, view: JobView, state: str, seq: int) -> None:
    """Move the job to `state`, keeping its queue's pending and running counts (and the waiting demand)."""
    counters = books.queue(view.queue)
    for counted, delta in ((view.state, -1), (state, +1)):
        if counted == "pending":
            counters.pending += delta
        elif counted == "running":
            counters.running += delta
    if (view.state == "pending") != (state == "pending") and view.spec is not None:
        _waiting(books, view, state == "pending")
    view.state = state
    counters.seq = seq
    books.dirty_queues[view.queue] = None


def _waiting(books: LedgerState, view: JobView, waits: bool) -> None:
    """Keep the demand of waiting jobs and each queue's waiting order as a job starts or stops waiting."""
    assert view.spec is not None
    model, gpus = demand_model(view.spec), requested_gpus(view.spec)
    since = books.pending_since.setdefault(view.queue, {})
    if waits:
        books.pending_demand[model] = books.pending_demand.get(model, 0.0) + gpus
        since[view.id] = books.last_ts
    else:
        books.pending_demand[model] = max(0.0, books.pending_demand.get(model, 0.0) - gpus)
        since.pop(view.id, None)


def touch(books: LedgerState, view: JobView, seq: int) -> None:
    """The job's view changed at `seq`: the projector writes it again."""
    view.seq = seq
    books.dirty_jobs[view.id] = None


def touch_nodes(books: LedgerState, placements: tuple[ReplicaPlacement, ...]) -> None:
    for placement in placements:
        books.dirty_nodes[placement.node] = None


def end_run(books: LedgerState, view: JobView, ended: list[GpuRun], ts: float, outcome: str, reason: str = "",
            exit_code: int | None = None) -> None:
    """The job's run is over: its GPU time is charged, its GPUs free, its run record closed, its quota no longer
    held by a placed job."""
    _charge(books, view, ended)
    books.cluster.release(view.placements)
    books.split_gpus.apply(view.placements, -1)
    touch_nodes(books, view.placements)
    view.placements = ()
    close_run(view, ts, outcome, reason, exit_code)
    held(books, books.holds.run_ended(view.id))


def _charge(books: LedgerState, view: JobView, ended: list[GpuRun]) -> None:
    """Add the GPU time of the run that just ended to the job and its team."""
    if not ended:
        return
    seconds = sum(run.gpu_seconds() for run in ended)
    books.ended_runs.extend(ended)
    view.gpu_seconds += seconds
    usage = books.teams.setdefault(view.team, TeamUsage(team=view.team))
    usage.gpu_seconds += seconds
    books.dirty_teams[view.team] = None


def charge_loss(books: LedgerState, view: JobView, event: JobEvicted, ended: list[GpuRun]) -> None:
    """GPU time an eviction threw away: the run's time not covered by the progress it checkpointed."""
    if not ended:
        return
    saved = max(0.0, event.progress_s - view.progress_s)
    lost = sum(max(0.0, event.ts - run.start - saved) * run.gpus for run in ended)
    view.progress_s = event.progress_s
    view.lost_gpu_seconds += lost
    usage = books.teams.setdefault(view.team, TeamUsage(team=view.team))
    usage.lost_gpu_seconds += lost
    books.dirty_teams[view.team] = None
    books.losses.append((view.queue, event.reason, lost))


def held(books: LedgerState, queue: str | None) -> None:
    """The queue's held and unplaced quota changed."""
    if queue is not None:
        books.queue(queue)
        books.dirty_queues[queue] = None


def queue_reserved(books: LedgerState, event: QuotaReserved | QuotaReleased) -> None:
    """Reserved GPUs per queue follow quota's own events."""
    counters = books.queue(event.queue)
    sign = 1 if isinstance(event, QuotaReserved) else -1
    counters.reserved_gpus += sign * event.gpu_milli / FULL
    books.dirty_queues[counters.name] = None
