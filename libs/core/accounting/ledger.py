"""Accounting: the read models and the GPU-time ledger, as one fold over the whole log.

It decides nothing; it records. The projector writes what `dirty_*` name to Redis after each batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    EventBase,
    GpuHealthChanged,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
)
from contracts.model import JobSpec
from contracts.views import FINAL_JOB_STATES, FlavorUsage, JobView, NodeView, QueueView, TeamUsage, spec_gpus
from libs.core.accounting.gpu_time import GpuRun, UsageBook
from libs.core.accounting.view_books import HELD, UNPLACED, QuotaHolds, SplitGpus, close_run, open_run, start_run
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, Gpu
from libs.core.kernel.policy import PolicyBook, declared_runtime, replica_milli
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.quota.decider import QuotaDecider

FINAL_STATES = FINAL_JOB_STATES


@dataclass(frozen=True, slots=True)
class AdmissionWait:
    queue: str
    priority: str
    seconds: float


LONG_JOB_S = 3600.0


def is_long(view: JobView) -> bool:
    """A job declaring an hour or more of runtime: interruptions hurt these most."""
    runtime = None if view.spec is None else declared_runtime(view.spec)
    return runtime is not None and runtime >= LONG_JOB_S


def requested_gpus(spec: JobSpec) -> float:
    """GPUs a job asks for, fractions counted as fractions."""
    return spec.replicas * (replica_milli(spec) / FULL)


# The demand and capacity figure of the whole cluster, whatever the model.
ALL_MODELS = "all"


def demand_model(spec: JobSpec) -> str:
    """The GPU model a waiting job's demand counts against: its one allowed model; a job that several models
    would do counts only toward the cluster's total."""
    return spec.gpu_models[0] if len(spec.gpu_models) == 1 else ALL_MODELS


@dataclass(slots=True)
class Ledger:
    # The quota decider's state, folded from the log (never asked to decide): usage, borrowing, lending,
    # fair share and budgets exactly as quota sees them.
    quota: QuotaDecider = field(default_factory=QuotaDecider)
    cluster: Cluster = field(default_factory=Cluster)
    jobs: dict[str, JobView] = field(default_factory=dict)
    queues: dict[str, QueueView] = field(default_factory=dict)
    teams: dict[str, TeamUsage] = field(default_factory=dict)
    # node -> ("cordoned" or "draining", the operator's reason)
    cordons: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Nodes that left the inventory (NodeLost removed): no view shows them until they register again.
    removed_nodes: set[str] = field(default_factory=set)
    # Every run's GPU time, per model: the one source of GPU-seconds (the usage report folds it too).
    usage: UsageBook = field(default_factory=UsageBook)
    # GPUs waiting jobs ask for, per model (ALL_MODELS when not pinned to one): with the allocated GPUs, the demand.
    pending_demand: dict[str, float] = field(default_factory=dict)
    # queue -> {job: when it last became pending}, oldest first: the age of each queue's oldest waiting job.
    pending_since: dict[str, dict[str, float]] = field(default_factory=dict)
    # What changed since the projector last flushed (dicts keep a deterministic order).
    dirty_jobs: dict[str, None] = field(default_factory=dict)
    dirty_queues: dict[str, None] = field(default_factory=dict)
    dirty_nodes: dict[str, None] = field(default_factory=dict)
    dirty_teams: dict[str, None] = field(default_factory=dict)
    waits: list[AdmissionWait] = field(default_factory=list)
    # (queue, reason, GPU-seconds) lost to each eviction since the projector last flushed
    losses: list[tuple[str, str, float]] = field(default_factory=list)
    # (queue, reason) of each failure that will run again, since the projector last flushed
    retried: list[tuple[str, str]] = field(default_factory=list)
    retries: RetryBook = field(default_factory=RetryBook)
    # Long jobs (declared runtime of an hour or more) first started, and interrupted, since the last flush.
    long_started: list[str] = field(default_factory=list)
    long_interrupted: list[tuple[str, str]] = field(default_factory=list)
    # Runs that ended, submissions (queue, priority) and start waits since the last flush.
    ended_runs: list[GpuRun] = field(default_factory=list)
    submitted: list[tuple[str, str]] = field(default_factory=list)
    start_waits: list[AdmissionWait] = field(default_factory=list)
    last_seq: int = 0
    last_ts: float = 0.0
    # Each job's current run: an executor's report about a run that is over is not folded (libs/core/kernel/runs.py).
    runs: CurrentRuns = field(default_factory=CurrentRuns)
    # For the views: quota held by placed jobs and reserved by unplaced ones; GPUs split into fractions.
    holds: QuotaHolds = field(default_factory=QuotaHolds)
    split_gpus: SplitGpus = field(default_factory=SplitGpus)

    @property
    def policy(self) -> PolicyBook:
        return self.quota.policy

    # --- helpers -------------------------------------------------------------------------------

    def _queue(self, name: str) -> QueueView:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueView(name=name, team="")
        return q

    def _set_state(self, view: JobView, state: str, seq: int) -> None:
        q = self._queue(view.queue)
        for s, delta in ((view.state, -1), (state, +1)):
            if s == "pending":
                q.pending += delta
            elif s == "running":
                q.running += delta
        if (view.state == "pending") != (state == "pending") and view.spec is not None:
            self._waiting(view, state == "pending")
        view.state = state
        q.seq = seq
        self.dirty_queues[view.queue] = None

    def _waiting(self, view: JobView, waits: bool) -> None:
        """Keep the demand of waiting jobs and each queue's waiting order as a job starts or stops waiting."""
        assert view.spec is not None
        model, gpus = demand_model(view.spec), requested_gpus(view.spec)
        since = self.pending_since.setdefault(view.queue, {})
        if waits:
            self.pending_demand[model] = self.pending_demand.get(model, 0.0) + gpus
            since[view.id] = self.last_ts
        else:
            self.pending_demand[model] = max(0.0, self.pending_demand.get(model, 0.0) - gpus)
            since.pop(view.id, None)

    def oldest_pending_s(self, queue: str) -> float:
        """How long the queue's longest-waiting job has waited, as of the last event."""
        since = self.pending_since.get(queue)
        return max(0.0, self.last_ts - next(iter(since.values()))) if since else 0.0

    def demand(self) -> dict[str, float]:
        """GPUs asked for per model: held by running jobs plus asked for by waiting ones pinned to that model;
        under ALL_MODELS, everything held and asked for."""
        out = {m: g for m, g in self.pending_demand.items() if m != ALL_MODELS}
        for (_, model), gpus in self.usage.held.items():
            out[model] = out.get(model, 0.0) + gpus
        out[ALL_MODELS] = sum(out.values()) + self.pending_demand.get(ALL_MODELS, 0.0)
        return out

    def _touch(self, view: JobView, seq: int) -> None:
        view.seq = seq
        self.dirty_jobs[view.id] = None

    def _touch_nodes(self, placements: tuple[ReplicaPlacement, ...]) -> None:
        for p in placements:
            self.dirty_nodes[p.node] = None

    def _charge(self, view: JobView, ended: list[GpuRun]) -> None:
        """Add the GPU time of the run that just ended to the job and its team."""
        if not ended:
            return
        seconds = sum(r.gpu_seconds() for r in ended)
        self.ended_runs.extend(ended)
        view.gpu_seconds += seconds
        usage = self.teams.setdefault(view.team, TeamUsage(team=view.team))
        usage.gpu_seconds += seconds
        self.dirty_teams[view.team] = None

    def _charge_loss(self, view: JobView, event: JobEvicted, ended: list[GpuRun]) -> None:
        """GPU time an eviction threw away: the run's time not covered by the progress it checkpointed."""
        if not ended:
            return
        saved = max(0.0, event.progress_s - view.progress_s)
        lost = sum(max(0.0, event.ts - r.start - saved) * r.gpus for r in ended)
        view.progress_s = event.progress_s
        view.lost_gpu_seconds += lost
        usage = self.teams.setdefault(view.team, TeamUsage(team=view.team))
        usage.lost_gpu_seconds += lost
        self.dirty_teams[view.team] = None
        self.losses.append((view.queue, event.reason, lost))

    # --- the fold ------------------------------------------------------------------------------

    def apply(self, event: EventBase, seq: int) -> None:
        self.last_seq = max(self.last_seq, seq)
        self.last_ts = max(self.last_ts, event.ts)
        if self.runs.is_stale(event):
            return  # about a run already over: it neither ends the job's current run nor charges its time
        self.runs.fold(event)
        ended = self.usage.apply(event)  # before the job fold, which charges the runs this event ended
        if isinstance(event, QUOTA_FOLD):
            self.quota.evolve(event)
        if isinstance(event, QueuePolicyChanged):
            q = self._queue(event.queue.name)
            q.team, q.seq = event.queue.team, seq
            self.dirty_queues.update(dict.fromkeys(self.quota.policy.queues))  # nominal sums and pools change
            return
        if isinstance(event, QuotaReserved | QuotaReleased):
            cohort = self.quota.book.cohort.get(event.queue, "")
            self.dirty_queues.update(dict.fromkeys(self.quota.book.members.get(cohort, []) if cohort else []))
        if isinstance(event, NodeRegistered | NodeLost | GpuHealthChanged):
            self._apply_node(event, seq)
            return
        if isinstance(event, NodeCordoned | NodeUncordoned):
            if isinstance(event, NodeCordoned):
                self.cordons[event.node] = ("draining" if event.drain else "cordoned", event.reason)
            else:
                self.cordons.pop(event.node, None)
            self.dirty_nodes[event.node] = None
            return
        job_id = getattr(event, "job_id", None)
        if isinstance(event, PreemptionDecided):
            for v in event.victims:
                view = self.jobs.get(v.job_id)
                if view is not None:
                    view.phase, view.reason = "preempting", v.reason
                    self._touch(view, seq)
            return
        if job_id is None:
            return
        view = self.jobs.get(job_id)
        if view is None:
            if not isinstance(event, JobSubmitted | JobRejected):
                return
            spec = event.spec
            view = self.jobs[job_id] = JobView(id=job_id, state="", team=spec.team if spec else "",
                                               queue=spec.queue if spec else "", spec=spec,
                                               submitted_at=event.ts)
        self._apply_job(view, event, seq, ended)
        self._touch(view, seq)

    def _apply_node(self, event: NodeRegistered | NodeLost | GpuHealthChanged, seq: int) -> None:
        if isinstance(event, NodeRegistered):
            self.cluster.register(event.node)
            self.removed_nodes.discard(event.node.name)
            self.dirty_nodes[event.node.name] = None
        elif isinstance(event, NodeLost):
            self.cluster.set_online(event.node, False)
            if event.removed:  # out of the views; the cluster keeps it offline for the runs still charged to it
                self.removed_nodes.add(event.node)
                self.cordons.pop(event.node, None)
            self.dirty_nodes[event.node] = None
        else:
            self.cluster.set_gpu_health(event.node, event.index, event.healthy)
            self.dirty_nodes[event.node] = None

    def _apply_job(self, view: JobView, event: EventBase, seq: int, ended: list[GpuRun]) -> None:
        match event:
            case JobSubmitted():
                self._set_state(view, "pending", seq)
                view.phase = "submitted"
                self.submitted.append((view.queue, event.spec.priority))
            case JobRejected():
                self._set_state(view, "rejected", seq)
                view.phase, view.reason, view.message = "rejected", event.code, event.message
            case JobAdmitted():
                view.phase, view.admitted_at = "admitted", event.ts
            case QuotaDeferred() | PlacementDeferred():
                view.reason, view.message, view.shortfall_milli = event.code, event.message, event.shortfall_milli
                if view.spec is not None and event.message:
                    # The recorded reason says how many GPUs; what the job asks for, in its user's terms, is
                    # said first (the decision's own text stays as it was recorded).
                    view.message = f"{spec_gpus(view.spec)}: {event.message}"
            case QuotaReserved():
                view.phase, view.reason, view.message, view.shortfall_milli = "reserved", "", "", 0
                prio = view.spec.priority if view.spec else ""
                self.waits.append(AdmissionWait(view.queue, prio, event.ts - (view.submitted_at or event.ts)))
                self._queue_reserved(event)
                self.holds.reserved(view.id, event.queue, event.flavor, event.gpu_milli)
            case QuotaReleased():
                self._queue_reserved(event)
                self.holds.released(view.id)
            case JobPlaced():
                view.phase, view.placements, view.reason, view.message = "placed", event.placements, "", ""
                view.shortfall_milli = 0
                self.cluster.allocate(event.placements)
                self.split_gpus.apply(event.placements, +1)
                self._touch_nodes(event.placements)
                open_run(view, event.id, event.placements, event.ts)
                self._held(self.holds.placed(view.id))
            case JobStarted():
                self._set_state(view, "running", seq)
                # A start that crossed a cancellation (the executor started it before it saw the cancel) still
                # ends as cancelled, whatever the eviction that follows says.
                view.phase = "cancelling" if view.phase == "cancelling" else "running"
                view.started_at = event.ts
                start_run(view, event.ts)
                if view.first_started_at is None:
                    view.first_started_at = event.ts
                    prio = view.spec.priority if view.spec else ""
                    self.start_waits.append(AdmissionWait(view.queue, prio,
                                                          event.ts - (view.submitted_at or event.ts)))
                    if is_long(view):
                        self.long_started.append(view.queue)
            case JobFailed() if (delay := self.retries.on_failed(event, view.spec, self.policy)) is not None:
                self._end_run(view, ended, event.ts, "failed", event.reason, event.exit_code)
                view.retries += 1
                self._set_state(view, "pending", seq)
                view.phase, view.exit_code = "retrying", event.exit_code
                view.reason, view.message = event.reason, f"exit code {event.exit_code}: runs again in {delay:g} s"
                self.retried.append((view.queue, event.reason))
            case JobFinished() | JobFailed():
                ok = isinstance(event, JobFinished) and event.exit_code == 0
                self._end_run(view, ended, event.ts, "succeeded" if ok else "failed",
                              event.reason if isinstance(event, JobFailed) else "", event.exit_code)
                self._set_state(view, "succeeded" if ok else "failed", seq)
                view.phase, view.exit_code, view.finished_at = view.state, event.exit_code, event.ts
                if isinstance(event, JobFailed):
                    view.reason = event.reason
                self.teams.setdefault(view.team, TeamUsage(team=view.team)).jobs_finished += 1
                self.dirty_teams[view.team] = None
            case JobEvicted():
                if event.reason != "cancelled" and view.phase != "cancelling":
                    self._charge_loss(view, event, ended)
                    if is_long(view):
                        self.long_interrupted.append((view.queue, event.reason))
                cancelled = event.reason == "cancelled" or view.phase == "cancelling"
                self._end_run(view, ended, event.ts, "cancelled" if cancelled else "evicted", event.reason)
                if cancelled:
                    self._set_state(view, "cancelled", seq)
                    view.phase, view.finished_at = "cancelled", event.ts
                else:
                    view.evictions += 1
                    self._set_state(view, "pending", seq)
                    view.phase, view.reason = "evicted", event.reason
            case JobCancelled() if view.state not in FINAL_STATES:
                if view.placements:
                    view.phase = "cancelling"
                else:
                    self._set_state(view, "cancelled", seq)
                    view.phase, view.finished_at = "cancelled", event.ts
                view.reason = event.reason

    def _end_run(self, view: JobView, ended: list[GpuRun], ts: float, outcome: str, reason: str = "",
                 exit_code: int | None = None) -> None:
        self._charge(view, ended)
        self.cluster.release(view.placements)
        self.split_gpus.apply(view.placements, -1)
        self._touch_nodes(view.placements)
        view.placements = ()
        close_run(view, ts, outcome, reason, exit_code)
        self._held(self.holds.run_ended(view.id))

    def _held(self, queue: str | None) -> None:
        """The queue's held and unplaced quota changed."""
        if queue is not None:
            self._queue(queue)
            self.dirty_queues[queue] = None

    # --- views ---------------------------------------------------------------------------------

    def node_view(self, name: str) -> NodeView:
        node = self.cluster.nodes[name]
        free = tuple(g.free_milli for g in node.gpus)
        modes = tuple(self._gpu_mode(name, g) for g in node.gpus)
        cordon, reason = self.cordons.get(name, ("", ""))
        view = NodeView(cordon=cordon, cordon_reason=reason,
            name=name, online=node.online, gpus=len(node.gpus),
            models=tuple(sorted({g.model for g in node.gpus})),
            allocated_gpus=sum(FULL - f for f in free) / FULL,
            healthy_gpus=sum(1 for g in node.gpus if g.healthy), gpu_free_milli=free, gpu_modes=modes,
            seq=self.last_seq)
        # Free capacity by the kind of work each GPU takes: a MIG-enabled GPU's free share is free MIG slices,
        # which no whole-GPU job or fraction can use (nor the other way round).
        for g, mode in zip(node.gpus, modes, strict=True):
            if not g.healthy:
                continue
            if mode == "mig":
                view.mig_gpus += 1
                view.mig_slices += g.mig_product.slices if g.mig_product is not None else 0
                view.mig_free_slices += g.free_slices
            elif mode == "split":
                view.split_gpus += 1
                view.split_free_milli += g.free_milli
            elif g.idle:
                view.idle_gpus += 1
        return view

    def _gpu_mode(self, node: str, g: Gpu) -> str:
        """mig (MIG-enabled, or MIG instances still on it), split (fractions hold it) or whole."""
        if g.mig_enabled or g.mig_instances:
            return "mig"
        return "split" if self.split_gpus.is_split(node, g.index) else "whole"

    def _queue_reserved(self, event: QuotaReserved | QuotaReleased) -> None:
        """Reserved GPUs per queue follow quota's own events."""
        q = self._queue(event.queue)
        sign = 1 if isinstance(event, QuotaReserved) else -1
        q.reserved_gpus += sign * event.gpu_milli / FULL
        self.dirty_queues[q.name] = None

    def queue_view(self, name: str) -> QueueView:
        """The queue's counters with its quota figures as of the last event folded."""
        q = self._queue(name)
        quota, book = self.quota, self.quota.book
        spec = quota.policy.queues.get(name)
        flavors = []
        for flavor, lim in book.limits.get(name, {}).items():
            flavors.append(FlavorUsage(
                flavor=flavor, nominal_gpus=lim.nominal / FULL,
                borrowing_limit_gpus=None if lim.borrow is None else lim.borrow / FULL,
                lending_limit_gpus=None if lim.lend == lim.nominal else lim.lend / FULL,
                in_use_gpus=book.usage(name, flavor) / FULL, borrowed_gpus=book.borrowed(name, flavor) / FULL,
                lent_gpus=book.lent(name, flavor) / FULL, held_gpus=self.holds.gpus(name, HELD, flavor),
                unplaced_gpus=self.holds.gpus(name, UNPLACED, flavor)))
        governed = book.governed(name) or bool(book.children.get(name))
        left = quota.budget_left_s(name, self.last_ts)
        return QueueView(
            name=name, team=q.team, nominal_gpus=book.nominal_of(name) // FULL if governed else None,
            reserved_gpus=q.reserved_gpus, held_gpus=self.holds.gpus(name, HELD),
            unplaced_gpus=self.holds.gpus(name, UNPLACED), pending=q.pending, running=q.running,
            parent=spec.parent if spec else "", cohort=book.cohort.get(name, ""),
            weight=spec.weight if spec else 1.0, flavors=flavors,
            fair_share=round(quota.fair_share(name, self.last_ts), 4) if spec else 0.0,
            budget_gpu_hours=spec.budget_gpu_hours if spec else None,
            budget_left_gpu_hours=None if left is None else round(left / 3600, 3), spec=spec, seq=q.seq)


# What the quota mirror folds: quota's inputs and its own decisions.
QUOTA_FOLD: tuple[type[EventBase], ...] = (*QuotaDecider().input_types(), QuotaReserved, QuotaReleased,
                                           QuotaDeferred)
