"""The accounting shell: fold every event into the ledger, then write the changed views to Redis once
per batch and refresh the metrics."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from contracts import (
    ALL_EVENT_TYPES,
    COMMAND_TYPES,
    EventBase,
    JobEvicted,
    PreemptionDecided,
    ReportServiceLoad,
    ServiceDeleted,
    ServiceDeployed,
    ServiceScaled,
)
from libs.core.accounting.ledger import Ledger
from libs.core.cluster.nodes import FULL, Node
from libs.core.kernel.accelerators import accelerator
from libs.reports.inference import ServiceTracker
from libs.reports.rates import Rates
from libs.views import metrics
from libs.views.store import ViewStore, ViewsVanished

log = logging.getLogger(__name__)

FINAL = ("succeeded", "failed", "cancelled", "rejected")


def service_of(event: EventBase, services: ServiceTracker) -> str:
    """The inference service an event is about ("" for none)."""
    if isinstance(event, ServiceDeployed):
        return event.service.name
    if isinstance(event, ServiceDeleted):
        return event.name
    if isinstance(event, ServiceScaled | ReportServiceLoad):
        return event.service
    return services.replica_of.get(getattr(event, "job_id", ""), "")


@dataclass(slots=True)
class NodeFigures:
    """One node's (or, summed, the cluster's) GPU figures: per model [GPUs, healthy, allocated milli]; free
    milli on healthy GPUs, idle GPUs, free milli stranded on partly allocated GPUs, online nodes."""

    by_model: dict[str, list[int]] = field(default_factory=dict)
    free: int = 0
    idle: int = 0
    stranded: int = 0
    online: int = 0

    @classmethod
    def of(cls, node: Node) -> NodeFigures:
        figures = cls(online=int(node.online))
        for g in node.gpus:
            counts = figures.by_model.setdefault(g.model, [0, 0, 0])
            counts[0] += 1
            if g.healthy and node.online:
                counts[1] += 1
                counts[2] += FULL - g.free_milli
                figures.free += g.free_milli
                figures.idle += g.free_milli == FULL
                figures.stranded += g.free_milli if 0 < g.free_milli < FULL else 0
        return figures

    def add(self, other: NodeFigures, sign: int) -> None:
        for model, counts in other.by_model.items():
            mine = self.by_model.setdefault(model, [0, 0, 0])
            for i in range(3):
                mine[i] += sign * counts[i]
        self.free += sign * other.free
        self.idle += sign * other.idle
        self.stranded += sign * other.stranded
        self.online += sign * other.online


class Projector:
    name = "accounting"

    def __init__(self, store: ViewStore, rates: Rates | None = None) -> None:
        self.store = store
        self.rates = rates or Rates()
        self.ledger = Ledger()
        self.first_seq: dict[str, int] = {}
        self.written_state: dict[str, str] = {}
        self._enc = msgspec.json.Encoder()
        self.services = ServiceTracker()
        self._dirty_services: dict[str, None] = {}
        self._scale_ups: list[tuple[str, float]] = []  # completed since the last flush
        self._below_reported: dict[str, float] = {}
        # The cluster's GPU figures, kept per node and summed (all in thousandths of a GPU, so exact): a batch
        # recounts only the nodes it changed, not every GPU of the cluster.
        self._node_figures: dict[str, NodeFigures] = {}
        self._totals = NodeFigures()

    def snapshot_roots(self) -> dict[str, object]:
        """The state a snapshot holds (libs/runtime/snapshots.py): the ledger, each job's first sequence and the
        inference services; the views are written again from them after catch-up, as after a replay."""
        return {"ledger": self.ledger, "first_seq": self.first_seq, "services": self.services}

    def input_types(self) -> Iterable[type[EventBase]]:
        # Every event, and the services' load reports (commands) for the load per replica.
        return (*(t for t in ALL_EVENT_TYPES if t not in COMMAND_TYPES), ReportServiceLoad)

    def replay(self, seq: int, event: EventBase) -> None:
        self._fold(seq, event)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        self._fold(seq, event)
        self._observe(event)
        return []

    def _fold(self, seq: int, event: EventBase) -> None:
        self._scale_ups.extend(self.services.apply(event))
        name = service_of(event, self.services)
        if name in self.services.services:
            self._dirty_services[name] = None
        if isinstance(event, ReportServiceLoad):
            return
        self.ledger.fold(event, seq)
        job_id = getattr(event, "job_id", None)
        if job_id is not None and job_id in self.ledger.state.jobs:
            self.first_seq.setdefault(job_id, seq)

    def _observe(self, event: EventBase) -> None:
        if isinstance(event, PreemptionDecided):
            for v in event.victims:
                metrics.PREEMPTIONS.labels(v.queue, v.reason).inc()
        elif isinstance(event, JobEvicted):
            metrics.EVICTIONS.labels(event.reason).inc()

    async def after_catch_up(self) -> None:
        # The views are rebuilt from the log on every start: Redis is never the source of truth.
        await self.rebuild()

    async def after_batch(self) -> None:
        try:
            await self.flush(expect_existing=True)
        except ViewsVanished:
            # Redis lost the views (flushed, or restarted empty) while we ran: the ledger in memory holds
            # the whole log's fold, so every view is written again from it, as after a restart.
            log.warning("the read models vanished from Redis; rebuilding every view from the ledger")
            await self.rebuild()

    async def rebuild(self) -> None:
        """Write every view from the ledger into an emptied store."""
        await self.store.clear()
        self.written_state.clear()
        self._mark_all_dirty()
        await self.flush(force=True)

    def _mark_all_dirty(self) -> None:
        """Everything the ledger knows is due for writing (after a catch-up the fold marked it already;
        after a loss of the store mid-run, only what changed since the last batch is marked)."""
        led = self.ledger.state
        led.dirty_jobs.update(dict.fromkeys(led.jobs))
        led.dirty_queues.update(dict.fromkeys(led.queues))
        led.dirty_nodes.update(dict.fromkeys(led.cluster.nodes))  # removed ones too: their views are deleted
        led.dirty_teams.update(dict.fromkeys(led.teams))

    def ops(self) -> list[list[Any]]:
        led, store, enc = self.ledger, self.store, self._enc
        books = led.state
        ops: list[list[Any]] = []
        for job_id in books.dirty_jobs:
            view = books.jobs[job_id]
            ops.append(["SET", store.job_key(job_id), enc.encode(view).decode()])
            score = self.first_seq.get(job_id, view.seq)
            old = self.written_state.get(job_id)
            if old is None:
                ops.append(["ZADD", store.index_key(), score, job_id])
                ops.append(["ZADD", store.index_key("queue", view.queue), score, job_id])
                ops.append(["ZADD", store.index_key("team", view.team), score, job_id])
            if old != view.state:
                if old is not None:
                    ops.append(["ZREM", store.index_key("state", old), job_id])
                    if view.state in FINAL:
                        metrics.FINISHED.labels(view.queue, view.state).inc()
                ops.append(["ZADD", store.index_key("state", view.state), score, job_id])
                self.written_state[job_id] = view.state
        for name in books.dirty_queues:
            q = led.queue_view(name)
            ops.append(["HSET", f"{store.p}:queues", name, enc.encode(q).decode()])
            metrics.PENDING.labels(name).set(q.pending)
            metrics.RUNNING.labels(name).set(q.running)
            metrics.QUOTA_RESERVED.labels(name).set(q.reserved_gpus)
            if q.nominal_gpus is not None:
                metrics.QUOTA_NOMINAL.labels(name).set(q.nominal_gpus)
            for f in q.flavors:
                metrics.BORROWED.labels(name, f.flavor).set(f.borrowed_gpus)
                metrics.LENT.labels(name, f.flavor).set(f.lent_gpus)
            for f in q.flavors:
                metrics.QUOTA_FLAVOR.labels(name, f.flavor).set(f.nominal_gpus)
                metrics.USED_FLAVOR.labels(name, f.flavor).set(f.in_use_gpus)
            metrics.FAIR_SHARE.labels(name).set(q.fair_share)
            if q.budget_left_gpu_hours is not None:
                metrics.BUDGET_LEFT.labels(name).set(q.budget_left_gpu_hours)
            if q.budget_gpu_hours is not None:
                metrics.BUDGET.labels(name).set(q.budget_gpu_hours)
        for name in books.dirty_nodes:
            if name in books.removed_nodes:
                ops.append(["HDEL", f"{store.p}:nodes", name])
                metrics.forget_node(name)
                continue
            node = led.node_view(name)
            ops.append(["HSET", f"{store.p}:nodes", name, enc.encode(node).decode()])
            metrics.NODE_ONLINE.labels(name).set(1 if node.online else 0)
            metrics.NODE_UNHEALTHY.labels(name).set(node.gpus - node.healthy_gpus)
        for team in books.dirty_teams:
            usage = books.teams[team]
            ops.append(["HSET", f"{store.p}:usage", team, enc.encode(usage).decode()])
            metrics.TEAM_GPU_SECONDS.labels(team).set(usage.gpu_seconds)
        for w in books.waits:
            metrics.ADMISSION_WAIT.labels(w.queue, w.priority).observe(w.seconds)
        for queue, reason, lost in books.losses:
            metrics.LOST_GPU_SECONDS.labels(queue, reason).inc(lost)
        for queue, reason in books.retried:
            metrics.RETRIES.labels(queue, reason).inc()
        for queue in books.long_started:
            metrics.LONG_STARTED.labels(queue).inc()
        for queue, reason in books.long_interrupted:
            metrics.LONG_INTERRUPTED.labels(queue, reason).inc()
        self._usage_metrics()
        self._service_metrics()
        if books.dirty_nodes:
            self._gpu_gauges(books.dirty_nodes)
        books.dirty_jobs.clear()
        books.dirty_queues.clear()
        books.dirty_nodes.clear()
        books.dirty_teams.clear()
        books.waits.clear()
        books.losses.clear()
        books.retried.clear()
        books.long_started.clear()
        books.long_interrupted.clear()
        books.ended_runs.clear()
        books.submitted.clear()
        books.start_waits.clear()
        return ops

    def _service_metrics(self) -> None:
        """Inference services: desired and ready replicas, scale-up times, load per replica, time below desired."""
        for name, seconds in self._scale_ups:
            metrics.SCALE_UP_SECONDS.labels(name).observe(seconds)
        self._scale_ups.clear()
        for name in self._dirty_services:
            t = self.services.services[name]
            if t.deleted:
                for state in ("desired", "ready"):
                    with contextlib.suppress(KeyError):
                        metrics.INFERENCE_REPLICAS.remove(t.queue, name, state)
                continue
            metrics.INFERENCE_REPLICAS.labels(t.queue, name, "desired").set(t.desired)
            metrics.INFERENCE_REPLICAS.labels(t.queue, name, "ready").set(len(t.ready))
            if t.metric:
                metrics.LOAD_PER_REPLICA.labels(name, t.metric).set(t.load_per_replica)
            below = t.below_s - self._below_reported.get(name, 0.0)
            metrics.BELOW_DESIRED_SECONDS.labels(name).inc(max(0.0, below))
            self._below_reported[name] = t.below_s
        self._dirty_services.clear()

    def _usage_metrics(self) -> None:
        """Submissions, start waits, GPU time and cost of the runs that ended, and what is held and wanted."""
        led = self.ledger.state
        for queue, priority in led.submitted:
            metrics.SUBMITTED.labels(queue, priority).inc()
        for w in led.start_waits:
            metrics.START_WAIT.labels(w.queue, w.priority).observe(w.seconds)
        for run in led.ended_runs:
            seconds = run.gpu_seconds()
            metrics.GPU_SECONDS.labels(run.team, run.queue, run.model, run.priority).inc(seconds)
            metrics.COST.labels(run.team, run.model).inc(self.rates.cost(run.model, seconds))
        for (team, model), gpus in led.usage.held.items():
            metrics.ALLOCATED.labels(team, model).set(gpus)
        for model, gpus in led.demand().items():
            metrics.DEMAND.labels(model).set(gpus)
        # Every queue with a waiting job ages; the others changed only if the batch touched them (a queue of
        # thousands that waits for nothing costs nothing here).
        for name in {*(q for q, since in led.pending_since.items() if since), *led.dirty_queues}:
            metrics.OLDEST_PENDING.labels(name).set(led.oldest_pending_s(name))

    def _gpu_gauges(self, changed: Iterable[str]) -> None:
        """Cluster-wide capacity figures after a batch that changed some nodes: theirs recounted, then summed."""
        books = self.ledger.state
        totals, nodes = self._totals, books.cluster.nodes
        for name in changed:
            old = self._node_figures.pop(name, None)
            if old is not None:
                totals.add(old, -1)
            node = nodes.get(name) if name not in books.removed_nodes else None
            if node is not None:
                new = self._node_figures[name] = NodeFigures.of(node)
                totals.add(new, +1)
        by_model = totals.by_model
        total, healthy = (sum(c[i] for c in by_model.values()) for i in range(2))
        allocated = sum(c[2] for c in by_model.values()) / FULL
        free, idle, stranded, online = totals.free, totals.idle, totals.stranded, totals.online
        for model, (m_total, m_healthy, m_allocated) in by_model.items():
            device = accelerator(model)
            kinds = (device.vendor, device.kind, model)
            metrics.MODEL_GPUS.labels(*kinds, "total").set(m_total)
            metrics.MODEL_GPUS.labels(*kinds, "healthy").set(m_healthy)
            metrics.MODEL_GPUS.labels(*kinds, "allocated").set(m_allocated / FULL)
        metrics.GPUS.labels("total").set(total)
        metrics.GPUS.labels("healthy").set(healthy)
        metrics.GPUS.labels("allocated").set(allocated)
        metrics.GPU_ALLOCATION.set(allocated / healthy if healthy else 0.0)
        metrics.FRAGMENTATION.set(stranded / free if free else 0.0)
        metrics.IDLE.set(idle / healthy if healthy else 0.0)
        metrics.NODES.labels("online").set(online)
        metrics.NODES.labels("lost").set(len(books.cluster.nodes) - len(books.removed_nodes) - online)
        metrics.NODES.labels("cordoned").set(len(books.cordons))

    async def flush(self, force: bool = False, expect_existing: bool = False) -> None:
        await self.store.apply(self.ledger.state.last_seq, self.ops(), force=force, expect_existing=expect_existing)
