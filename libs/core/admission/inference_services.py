"""Inference services: their replica jobs and their autoscaling, as the admission core decides them.

A service is a set of one-replica jobs (ids derived from the service's name and a running ordinal), so every
replica goes through quota, placement and preemption like any job. The desired count follows the Kubernetes
HPA's rules on load reports from the log: desired = ceil(load / target per replica), unchanged within a
tolerance, a scale-up going to the lowest and a scale-down to the highest recommendation of its
stabilisation window, with cooldowns. Time is the log's: the reports' timestamps.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import msgspec

from contracts import Autoscaling, JobSpec, ServiceSpec
from libs.core.kernel.decider import derived_id

# Metrics a load report may carry: service totals, and a mean over the ready replicas.
TOTAL_METRICS = ("requests_per_s", "queue_length")
MEAN_METRICS = ("gpu_utilization",)
METRICS = TOTAL_METRICS + MEAN_METRICS
INFERENCE = "inference"  # the workload of a service's replicas
# Most replicas one service may ask for: each is a job in the log.
MAX_REPLICAS = 1000
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def replica_job_id(epoch: str, ordinal: int) -> str:
    """`epoch`: the id of the decision that created the service, so a name deployed again after a delete
    never reuses a replica id."""
    return derived_id("replica", epoch, ordinal)


def replica_spec(spec: ServiceSpec, ordinal: int, replicas: int = 1) -> JobSpec:
    """The job one replica runs: the service's template, one replica, marked as the service's. (`replicas`:
    the same as a gang of that many, to check what all of them together would need.)"""
    return msgspec.structs.replace(spec.replica, replicas=replicas, workload=INFERENCE, service=spec.name,
                                   spread=spec.spread, name=f"{spec.name}-{ordinal}", idempotency_key="")


def service_problem(spec: ServiceSpec) -> tuple[str, str] | None:
    """What is wrong with a service's own fields (its replica's job is checked as any job), or None."""
    if not _NAME.match(spec.name):
        return "invalid_service_name", (f"service name {spec.name!r}: lowercase letters, digits and '-', "
                                         "at most 63, starting and ending with a letter or digit")
    if spec.replica.replicas != 1:
        return "invalid_replicas", "a service's replica spec describes one replica: replicas must be 1"
    if spec.max_replicas > MAX_REPLICAS:
        return "too_many_replicas", f"max_replicas is at most {MAX_REPLICAS}, got {spec.max_replicas}"
    if spec.min_replicas < 0 or spec.max_replicas < max(1, spec.min_replicas):
        return "invalid_replica_bounds", (f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                                          f"{spec.min_replicas}..{spec.max_replicas}")
    scaling = spec.autoscaling
    if scaling is None:
        if spec.min_replicas < 1:
            return "invalid_replica_bounds", "without autoscaling a service runs min_replicas, which must be >= 1"
        return None
    if scaling.metric not in METRICS:
        return "unknown_metric", f"metric {scaling.metric!r} unknown ({', '.join(METRICS)})"
    if not (math.isfinite(scaling.target_per_replica) and scaling.target_per_replica > 0):
        return "invalid_target", f"target_per_replica must be > 0, got {scaling.target_per_replica}"
    if not (math.isfinite(scaling.tolerance) and 0 <= scaling.tolerance < 1):
        return "invalid_tolerance", f"tolerance must be in [0, 1), got {scaling.tolerance}"
    for name in ("scale_up_window_s", "scale_down_window_s", "scale_up_cooldown_s", "scale_down_cooldown_s"):
        if not (math.isfinite(getattr(scaling, name)) and getattr(scaling, name) >= 0):
            return "invalid_window", f"{name} must be >= 0, got {getattr(scaling, name)}"
    return None


def _replicas_for(needed: float) -> int:
    """ceil(needed), kept within MAX_REPLICAS (a huge load over a tiny target must not overflow)."""
    return math.ceil(needed - 1e-9) if needed < MAX_REPLICAS else MAX_REPLICAS


def recommend(scaling: Autoscaling, current: int, ready: int, value: float) -> int:
    """The replica count the load asks for, before bounds and stabilisation (HPA's formula)."""
    if scaling.metric in TOTAL_METRICS:
        if value <= 0:
            return 0
        ratio = value / (scaling.target_per_replica * current) if current else math.inf
        if current and abs(ratio - 1) <= scaling.tolerance:
            return current
        return _replicas_for(value / scaling.target_per_replica)
    # A mean over the ready replicas: their total load spread over the count that meets the target.
    if ready == 0:
        return current
    ratio = value / scaling.target_per_replica
    if abs(ratio - 1) <= scaling.tolerance:
        return current
    return _replicas_for(ready * ratio)


@dataclass(slots=True)
class ServiceState:
    spec: ServiceSpec
    epoch: str
    desired: int = 0
    # Live replica jobs (not yet final): job id -> (ordinal, ready?).
    replicas: dict[str, tuple[int, bool]] = field(default_factory=dict)
    next_ordinal: int = 0
    # (report time, recommendation), oldest first, within the longest stabilisation window.
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    last_scale_up: float = -math.inf
    last_scale: float = -math.inf
    load: float = 0.0

    @property
    def ready(self) -> int:
        return sum(1 for _, ready in self.replicas.values() if ready)

    def bounded(self, replicas: int) -> int:
        """`replicas` within the service's bounds (without autoscaling it runs min_replicas, at least one)."""
        low = self.spec.min_replicas if self.spec.autoscaling is not None else max(1, self.spec.min_replicas)
        high = self.spec.max_replicas if self.spec.autoscaling is not None else low
        return min(max(replicas, low), high)

    def next_desired(self, now: float, value: float) -> int:
        """Fold a load report in; the desired count it leads to (the current one when nothing changes)."""
        scaling = self.spec.autoscaling
        assert scaling is not None
        self.load = value
        raw = self.bounded(recommend(scaling, self.desired, self.ready, value))
        horizon = max(scaling.scale_up_window_s, scaling.scale_down_window_s)
        self.recommendations.append((now, raw))
        while self.recommendations and self.recommendations[0][0] < now - horizon:
            del self.recommendations[0]
        current = self.desired
        up = min(r for t, r in self.recommendations if t >= now - scaling.scale_up_window_s)
        down = max(r for t, r in self.recommendations if t >= now - scaling.scale_down_window_s)
        if up > current and now - self.last_scale_up >= scaling.scale_up_cooldown_s:
            return up
        if down < current and now - self.last_scale >= scaling.scale_down_cooldown_s:
            return down
        return current

    def next_replica_id(self) -> str:
        return replica_job_id(self.epoch, self.next_ordinal)

    def to_cancel(self, count: int) -> list[str]:
        """Which `count` replicas a scale-down stops: those not ready yet first, then the newest."""
        order = sorted(self.replicas, key=lambda j: (self.replicas[j][1], -self.replicas[j][0]))
        return order[:count]


@dataclass(slots=True)
class ServiceBook:
    """Every service and its live replicas: a fold over the log."""

    services: dict[str, ServiceState] = field(default_factory=dict)
    replica_of: dict[str, str] = field(default_factory=dict)  # live replica job -> its service

    def deployed(self, spec: ServiceSpec, event_id: str) -> None:
        state = self.services.get(spec.name)
        if state is None:
            self.services[spec.name] = ServiceState(spec, event_id)
        else:
            state.spec = spec

    def scaled(self, name: str, to: int, now: float) -> None:
        state = self.services[name]
        if to > state.desired:
            state.last_scale_up = now
        state.last_scale = now
        state.desired = to

    def deleted(self, name: str) -> None:
        self.services.pop(name, None)

    def replica_submitted(self, job_id: str, spec: JobSpec) -> None:
        state = self.services.get(spec.service)
        if state is None:
            return
        ordinal = state.next_ordinal
        state.next_ordinal += 1
        state.replicas[job_id] = (ordinal, False)
        self.replica_of[job_id] = spec.service

    def replica_ready(self, job_id: str, ready: bool = True) -> None:
        name = self.replica_of.get(job_id)
        state = self.services.get(name) if name is not None else None
        if state is not None and job_id in state.replicas:
            state.replicas[job_id] = (state.replicas[job_id][0], ready)

    def replica_gone(self, job_id: str) -> str | None:
        """A replica ended for good; the service it belonged to (None when it was none's or is deleted)."""
        name = self.replica_of.pop(job_id, None)
        state = self.services.get(name) if name is not None else None
        if state is None:
            return None
        state.replicas.pop(job_id, None)
        return name
