"""The ledger's state as plain data: the read models (jobs, queues, teams, nodes), the GPU-time books and what
changed since the projector last flushed, with the few figures read straight off them. Nothing here folds an
event (accounting/fold.py does) and nothing here decides: accounting records."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts.model import JobSpec
from contracts.views import FINAL_JOB_STATES, JobView, QueueView, TeamUsage
from libs.core.accounting.view_books import QuotaHolds, SplitGpus
from libs.core.cluster.model import Cluster
from libs.core.kernel.accelerators import one_model
from libs.core.kernel.gpu_time import GpuRun, UsageBook
from libs.core.kernel.gpu_units import FULL
from libs.core.kernel.policy import PolicyBook, declared_runtime, replica_milli
from libs.core.kernel.quota_ledger import QuotaLedger
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns

FINAL_STATES = FINAL_JOB_STATES
# The demand and capacity figure of the whole cluster, whatever the model.
ALL_MODELS = "all"
LONG_JOB_S = 3600.0


@dataclass(frozen=True, slots=True)
class AdmissionWait:
    queue: str
    priority: str
    seconds: float


def is_long(view: JobView) -> bool:
    """A job declaring an hour or more of runtime: interruptions hurt these most."""
    runtime = None if view.spec is None else declared_runtime(view.spec)
    return runtime is not None and runtime >= LONG_JOB_S


def requested_gpus(spec: JobSpec) -> float:
    """GPUs a job asks for, fractions counted as fractions."""
    return spec.replicas * (replica_milli(spec) / FULL)


def demand_model(spec: JobSpec) -> str:
    """The GPU model a waiting job's demand counts against: its one allowed model; a job that several models
    would do counts only toward the cluster's total."""
    return one_model(spec.gpu_models) or ALL_MODELS


@dataclass(slots=True)
class LedgerState:
    # Quota's figures, folded from the log by quota's own rules (kernel/quota_ledger.py): usage, borrowing,
    # lending, fair share and budgets exactly as the quota decider sees them.
    quota: QuotaLedger = field(default_factory=QuotaLedger)
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

    def queue(self, name: str) -> QueueView:
        """The queue's counters, made empty the first time a queue is named (by a job, or asked for)."""
        counters = self.queues.get(name)
        if counters is None:
            counters = self.queues[name] = QueueView(name=name, team="")
        return counters

    def oldest_pending_s(self, queue: str) -> float:
        """How long the queue's longest-waiting job has waited, as of the last event."""
        since = self.pending_since.get(queue)
        return max(0.0, self.last_ts - next(iter(since.values()))) if since else 0.0

    def demand(self) -> dict[str, float]:
        """GPUs asked for per model: held by running jobs plus asked for by waiting ones pinned to that model;
        under ALL_MODELS, everything held and asked for."""
        out = {model: gpus for model, gpus in self.pending_demand.items() if model != ALL_MODELS}
        for (_, model), gpus in self.usage.held.items():
            out[model] = out.get(model, 0.0) + gpus
        out[ALL_MODELS] = sum(out.values()) + self.pending_demand.get(ALL_MODELS, 0.0)
        return out
