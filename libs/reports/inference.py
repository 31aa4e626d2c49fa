"""How well inference services were served, folded from the log: desired against ready replicas over time,
scale-up times (from the scale decision to the last new replica ready), load per replica.

Accounting's metrics and `gpusched bench inference` both fold the log through `ServiceTracker`, so the live
gauges and the benchmark's figures are one computation. Times are the log's (event timestamps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobReady,
    JobSubmitted,
    ReportServiceLoad,
    ServiceDeleted,
    ServiceDeployed,
    ServiceScaled,
)
from libs.core.kernel.runs import CurrentRuns


@dataclass(slots=True)
class ServiceTimeline:
    queue: str
    desired: int = 0
    ready: set[str] = field(default_factory=set)
    since: float | None = None  # when the timeline was last brought up to date
    service_s: float = 0.0  # time with a desired count above zero
    below_s: float = 0.0  # of which with fewer ready replicas than desired
    # Scale-ups not yet complete: (replicas to reach, decided at).
    pending_ups: list[tuple[int, float]] = field(default_factory=list)
    scale_up_s: list[float] = field(default_factory=list)
    load: float = 0.0
    metric: str = ""
    deleted: bool = False

    def advance(self, now: float) -> None:
        if self.since is not None and now > self.since and not self.deleted:
            dt = now - self.since
            if self.desired > 0:
                self.service_s += dt
                if len(self.ready) < self.desired:
                    self.below_s += dt
        self.since = now if self.since is None else max(self.since, now)

    def complete_ups(self, now: float) -> list[float]:
        done = [t0 for target, t0 in self.pending_ups if len(self.ready) >= target]
        self.pending_ups = [(target, t0) for target, t0 in self.pending_ups if len(self.ready) < target]
        latencies = [now - t0 for t0 in done]
        self.scale_up_s.extend(latencies)
        return latencies

    @property
    def load_per_replica(self) -> float:
        return self.load / len(self.ready) if self.ready else 0.0


@dataclass(slots=True)
class ServiceTracker:
    services: dict[str, ServiceTimeline] = field(default_factory=dict)
    replica_of: dict[str, str] = field(default_factory=dict)
    # The replicas' current runs: a report about a run that is over neither readies nor ends a replica.
    runs: CurrentRuns = field(default_factory=CurrentRuns)

    def apply(self, event: EventBase) -> list[tuple[str, float]]:
        """Fold one event; returns the scale-ups it completed: (service, seconds from decision to ready)."""
        if getattr(event, "job_id", None) in self.replica_of:
            if self.runs.is_stale(event):
                return []
            self.runs.fold(event)
        match event:
            case ServiceDeployed():
                timeline = self.services.get(event.service.name)
                if timeline is None or timeline.deleted:
                    self.services[event.service.name] = ServiceTimeline(queue=event.service.replica.queue,
                                                                        since=event.ts)
            case ServiceScaled() if event.service in self.services:
                timeline = self.services[event.service]
                timeline.advance(event.ts)
                if event.to_replicas > event.from_replicas:
                    timeline.pending_ups.append((event.to_replicas, event.ts))
                else:  # a scale-down makes pending scale-ups above it moot
                    timeline.pending_ups = [(t, t0) for t, t0 in timeline.pending_ups if t <= event.to_replicas]
                timeline.desired = event.to_replicas
                return [(event.service, s) for s in timeline.complete_ups(event.ts)]
            case ReportServiceLoad() if event.service in self.services:
                self.services[event.service].load = event.value
                self.services[event.service].metric = event.metric
            case JobSubmitted() if event.spec.service:
                self.replica_of[event.job_id] = event.spec.service
            case JobReady() if event.job_id in self.replica_of:
                name = self.replica_of[event.job_id]
                timeline = self.services.get(name)
                if timeline is not None:
                    timeline.advance(event.ts)
                    timeline.ready.add(event.job_id)
                    return [(name, s) for s in timeline.complete_ups(event.ts)]
            case JobFinished() | JobFailed() | JobEvicted() if event.job_id in self.replica_of:
                timeline = self.services.get(self.replica_of[event.job_id])
                if timeline is not None:
                    timeline.advance(event.ts)
                    timeline.ready.discard(event.job_id)
            case ServiceDeleted() if event.name in self.services:
                timeline = self.services[event.name]
                timeline.advance(event.ts)
                timeline.deleted = True
        return []

    def finish(self, now: float) -> None:
        """Bring every timeline up to `now` (the end of a report's window)."""
        for timeline in self.services.values():
            timeline.advance(now)

    def below_desired_pct(self) -> float:
        service = sum(t.service_s for t in self.services.values())
        below = sum(t.below_s for t in self.services.values())
        return 100.0 * below / service if service else 0.0

    def scale_up_times(self) -> list[float]:
        return sorted(s for t in self.services.values() for s in t.scale_up_s)
