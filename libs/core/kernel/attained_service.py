"""Least attained service (Tiresias' LAS, with one threshold): how much GPU time each job has held over all its
runs, and whether its queue's policy ranks it behind the jobs that have held less.

A queue with `las_threshold_gpu_hours` orders its waiting jobs of one priority by service level first: those
that have held at most the threshold (new jobs, short ones) before those that have held more; and a job waiting
below the threshold may preempt a running job of its queue and priority above it (libs/core/preemption/decider.py,
through the checkpoint handshake, so the victim resumes from its checkpoint). No runtime has to be known: in a
heavy-tailed workload the jobs that have run long are the ones likely to run longest still, so this
approximates shortest-remaining-time-first. Quota and preemption both fold the log's runs into one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import LEAST_ATTAINED_SERVICE, PreemptionDecided, QueueSpec

# Added to a waiting job's arrival rank in quota when it is above its queue's threshold: it then comes after
# every job of its priority that is not, whatever their arrival.
DEMOTED = 1 << 40


def threshold_milli_s(spec: QueueSpec | None) -> float | None:
    """The queue's LAS threshold in thousandths of GPU-seconds (the unit of demand x time); None: no LAS."""
    if spec is None or spec.las_threshold_gpu_hours is None:
        return None
    return spec.las_threshold_gpu_hours * 3600.0 * 1000.0


def least_served(event: PreemptionDecided) -> bool:
    """Has the preemptor a victim chosen by least attained service (of its own queue and priority)? Then the
    room its victims free is held for it against its own queue's jobs of its priority too, and no starving job
    holds it back: quota, placement and the guarantee checker all ask this one question."""
    return any(v.reason == LEAST_ATTAINED_SERVICE for v in event.victims)


@dataclass(slots=True)
class AttainedService:
    """GPU time (thousandths of GPU-seconds) each job has held: its runs that are over, plus the one going on."""

    held: dict[str, float] = field(default_factory=dict)
    running: dict[str, tuple[float, int]] = field(default_factory=dict)  # job -> (run started, demand)

    def started(self, job_id: str, ts: float, demand: int) -> None:
        self.running[job_id] = (ts, demand)

    def stopped(self, job_id: str, ts: float) -> None:
        run = self.running.pop(job_id, None)
        if run is not None:
            self.held[job_id] = self.held.get(job_id, 0.0) + max(0.0, ts - run[0]) * run[1]

    def forget(self, job_id: str) -> None:
        self.held.pop(job_id, None)
        self.running.pop(job_id, None)

    def of(self, job_id: str, now: float) -> float:
        run = self.running.get(job_id)
        current = max(0.0, now - run[0]) * run[1] if run is not None else 0.0
        return self.held.get(job_id, 0.0) + current

    def crosses_at(self, job_id: str, threshold: float) -> float | None:
        """When the running job's service passes `threshold` (None: not running, or never: no demand)."""
        run = self.running.get(job_id)
        if run is None or run[1] <= 0:
            return None
        return run[0] + max(0.0, threshold - self.held.get(job_id, 0.0)) / run[1]
