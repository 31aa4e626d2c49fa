"""Queues, teams and priority classes as every decider sees them: a fold over policy events."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts import (
    JobSpec,
    PriorityClass,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    SchedulingSettings,
    SchedulingSettingsChanged,
)
from libs.core.kernel.mig_profiles import instance_milli
from libs.core.kernel.quota_math import QuotaBook

# Used until the log carries a PriorityClassesChanged; part of the code, hence deterministic.
DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass(name="production-inference", value=1000, preemptible=False),
    PriorityClass(name="urgent", value=800),
    PriorityClass(name="training", value=500),
    PriorityClass(name="experiment", value=300),
    PriorityClass(name="batch", value=100),
)


@dataclass(slots=True)
class PolicyBook:
    queues: dict[str, QueueSpec] = field(default_factory=dict)
    classes: dict[str, PriorityClass] = field(
        default_factory=lambda: {c.name: c for c in DEFAULT_PRIORITY_CLASSES}
    )
    settings: SchedulingSettings = field(default_factory=SchedulingSettings)
    # The queue tree's limits; the deciders that track reservations also keep its usage.
    quotas: QuotaBook = field(default_factory=QuotaBook)
    # team -> how many queues it has: "has this team a queue?" at the cost of one lookup, whatever the count
    team_queues: dict[str, int] = field(default_factory=dict)

    def apply(self, event: object) -> bool:
        """Fold a policy event; True when the event was one."""
        if isinstance(event, QueuePolicyChanged):
            old = self.queues.get(event.queue.name)
            if old is not None:
                self._count_team(old.team, -1)
            self._count_team(event.queue.team, 1)
            self.queues[event.queue.name] = event.queue
            self.quotas.set_queue(event.queue)
            return True
        if isinstance(event, SchedulingSettingsChanged):
            self.settings = event.settings
            return True
        if isinstance(event, PriorityClassesChanged):
            self.classes = {c.name: c for c in event.classes}
            return True
        return False

    def set_queues(self, queues: Iterable[QueueSpec]) -> None:
        """Replace the whole queue tree (a fold of QueuePolicyChanged events does the same one by one)."""
        self.queues = {q.name: q for q in queues}
        self.team_queues = {}
        for q in self.queues.values():
            self._count_team(q.team, 1)
        self.quotas.set_queues(self.queues.values())

    def _count_team(self, team: str, sign: int) -> None:
        left = self.team_queues.get(team, 0) + sign
        if left:
            self.team_queues[team] = left
        else:
            del self.team_queues[team]

    def has_team(self, team: str) -> bool:
        return team in self.team_queues

    def priority_of(self, spec: JobSpec) -> int:
        cls = self.classes.get(spec.priority)
        return cls.value if cls else 0

    def preemptible(self, spec: JobSpec) -> bool:
        cls = self.classes.get(spec.priority)
        return cls.preemptible if cls else True

    def min_runtime_s(self, spec: JobSpec) -> float:
        cls = self.classes.get(spec.priority)
        return cls.min_runtime_s if cls else 0.0


def declared_runtime(spec: JobSpec) -> float | None:
    """How long the deciders (and the views) believe a job runs, from what its user declared, never from how
    long it really runs: its estimate (`duration_s`), else its limit (`max_runtime_s`, which the executor
    enforces), else None (nothing declared: it may run forever). An estimate beyond the limit is capped at
    the limit, since the executor stops the run there. Every "how long will it run" in the deciders reads this."""
    estimate, limit = spec.duration_s, spec.max_runtime_s
    if estimate is None:
        return limit
    return estimate if limit is None else min(estimate, limit)


def runtime_bound(spec: JobSpec) -> float | None:
    """The longest a job can run, as the platform enforces it (its `max_runtime_s`), else None: what a rule
    that must not be wrong (a job let run ahead of a starving one only if it ends before that one could start)
    may trust; an estimate only informs."""
    return spec.max_runtime_s


def replica_milli(spec: JobSpec) -> int:
    """GPU demand of one replica, in thousandths of a GPU: a MIG instance its profile's share (the one figure
    placement allocates and accounting counts), else its fraction or whole GPUs."""
    if spec.mig_profile:
        return instance_milli(spec.mig_profile)
    return spec.gpu_milli if spec.gpu_milli > 0 else spec.gpus * 1000


def takes_devices(spec: JobSpec) -> bool:
    """Does a replica take a GPU or an NPU (or a share of one)?"""
    return replica_milli(spec) > 0


def demand_milli(spec: JobSpec) -> int:
    return spec.replicas * replica_milli(spec)
