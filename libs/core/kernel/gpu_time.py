"""The GPU-time ledger: every run of every job, per GPU model, folded from the log.

A run begins at `JobStarted` with the GPUs of the job's last `JobPlaced` and ends at the report that takes
them back (`JobFinished`, `JobFailed`, `JobEvicted`). GPU time is GPUs held x wall time, fractions counted
in thousandths, so a 250-milli share for an hour is 0.25 GPU-hours. Accounting's live counters, the usage
report and the capacity trend all come from this one fold, which is why they always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
)
from contracts.model import JobSpec
from libs.core.kernel.accelerators import accelerator
from libs.core.kernel.gpu_units import FULL

# What a usage report can group by, in the order rows are sorted.
USAGE_KEYS = ("team", "queue", "project", "user", "model", "vendor", "kind", "priority", "job")


@dataclass(frozen=True, slots=True)
class GpuRun:
    """One run of one job on GPUs of one model. `end` is None while it still runs."""

    job: str
    team: str
    queue: str
    project: str
    user: str
    priority: str
    model: str
    gpus: float
    start: float
    end: float | None = None

    @property
    def vendor(self) -> str:
        """nvidia or huawei: the model's (libs/core/kernel/accelerators.py)."""
        return accelerator(self.model).vendor

    @property
    def kind(self) -> str:
        """gpu or npu."""
        return accelerator(self.model).kind

    def key(self, by: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(getattr(self, k) for k in by)

    def gpu_seconds(self, since: float | None = None, until: float | None = None) -> float:
        """GPU-seconds of the run inside [since, until]; a run still going counts up to `until`."""
        end = self.end if self.end is not None else until
        if end is None:
            return 0.0
        if until is not None:
            end = min(end, until)
        start = self.start if since is None else max(self.start, since)
        return max(0.0, end - start) * self.gpus


def gpus_by_model(placements: tuple[ReplicaPlacement, ...]) -> dict[str, float]:
    """GPUs a placement holds per model (a fraction of a GPU counts as that fraction)."""
    held: dict[str, float] = {}
    for p in placements:
        held[p.model] = held.get(p.model, 0.0) + len(p.gpu_indices) * p.gpu_milli / FULL
    return held


def held_gpus(placements: tuple[ReplicaPlacement, ...]) -> float:
    """GPUs a placement holds over all models (a MIG instance or a fraction counts as its share)."""
    return sum(gpus_by_model(placements).values())


@dataclass(slots=True)
class UsageBook:
    specs: dict[str, JobSpec] = field(default_factory=dict)
    placed: dict[str, tuple[ReplicaPlacement, ...]] = field(default_factory=dict)
    running: dict[str, list[GpuRun]] = field(default_factory=dict)  # job -> its open runs, one per model
    # GPUs held right now per (team, model): the allocated-GPUs gauge.
    held: dict[tuple[str, str], float] = field(default_factory=dict)

    def fold(self, event: EventBase) -> list[GpuRun]:
        """Fold one event; returns the runs it ended (with their end time set)."""
        match event:
            case JobSubmitted():
                self.specs[event.job_id] = event.spec
            case JobPlaced():
                self.placed[event.job_id] = event.placements
            case JobStarted():
                self._start(event.job_id, event.ts)
            case JobFinished() | JobFailed() | JobEvicted():
                return self._stop(event.job_id, event.ts)
        return []

    def started_at(self, job_id: str) -> float | None:
        runs = self.running.get(job_id)
        return runs[0].start if runs else None

    def open_runs(self) -> list[GpuRun]:
        return [r for runs in self.running.values() for r in runs]

    def _start(self, job_id: str, ts: float) -> None:
        spec = self.specs.get(job_id)
        placements = self.placed.get(job_id, ())
        if spec is None or not placements:
            return
        self._stop(job_id, ts)  # a start without a stop (a lost report) closes the earlier run
        runs = [GpuRun(job=job_id, team=spec.team, queue=spec.queue, project=spec.project, user=spec.user,
                       priority=spec.priority, model=model, gpus=gpus, start=ts)
                for model, gpus in gpus_by_model(placements).items()]
        self.running[job_id] = runs
        for r in runs:
            self.held[(r.team, r.model)] = self.held.get((r.team, r.model), 0.0) + r.gpus

    def _stop(self, job_id: str, ts: float) -> list[GpuRun]:
        runs = self.running.pop(job_id, None)
        if not runs:
            return []
        ended = []
        for r in runs:
            ended.append(GpuRun(job=r.job, team=r.team, queue=r.queue, project=r.project, user=r.user,
                                priority=r.priority, model=r.model, gpus=r.gpus, start=r.start,
                                end=max(ts, r.start)))
            self.held[(r.team, r.model)] = max(0.0, self.held[(r.team, r.model)] - r.gpus)
        return ended
