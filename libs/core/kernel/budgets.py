"""GPU-hour budgets, charged for GPU run time: from `JobStarted` to the report that ends the run
(`JobFinished`, `JobFailed`, `JobEvicted`), with the GPUs of the job's last `JobPlaced` (a MIG instance or a
fraction counts as its share of a GPU), exactly as the GPU-time ledger counts it
(libs/core/kernel/gpu_time.py). Time
a job waits with quota reserved, for placement or for its executor, costs its queue nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import ReplicaPlacement
from libs.core.kernel.fairness import period_start
from libs.core.kernel.gpu_time import GpuRun, held_gpus


def _run(queue: str, gpus: float, start: float) -> GpuRun:
    return GpuRun(job="", team="", queue=queue, project="", user="", priority="", model="", gpus=gpus, start=start)


@dataclass(slots=True)
class BudgetBook:
    shares: dict[str, float] = field(default_factory=dict)  # job -> GPUs its last placement holds
    runs: dict[str, GpuRun] = field(default_factory=dict)  # job -> its run going on
    by_queue: dict[str, dict[str, None]] = field(default_factory=dict)  # queue -> its jobs running
    closed: dict[str, tuple[float, float]] = field(default_factory=dict)  # queue -> (period start, GPU-seconds)

    def placed(self, job_id: str, placements: tuple[ReplicaPlacement, ...]) -> None:
        self.shares[job_id] = held_gpus(placements)

    def started(self, job_id: str, queue: str, requested_gpus: float, ts: float, period: str | None) -> None:
        """A run begins (a start without a stop, a lost report, first closes the earlier run). Without a
        placement seen, the run holds what the job asked for."""
        self.stopped(job_id, ts, period)
        self.runs[job_id] = _run(queue, self.shares.get(job_id, requested_gpus), ts)
        self.by_queue.setdefault(queue, {})[job_id] = None

    def stopped(self, job_id: str, ts: float, period: str | None) -> None:
        """The run ends; its GPU time inside the queue's current budget period (`period`, None: the queue has
        no budget) is spent for good."""
        run = self.runs.pop(job_id, None)
        if run is None:
            return
        self.by_queue[run.queue].pop(job_id, None)
        if period is None:
            return
        start, closed = self._period(run.queue, ts, period)
        self.closed[run.queue] = (start, closed + run.gpu_seconds(since=start, until=max(ts, run.start)))

    def forget(self, job_id: str) -> None:
        self.shares.pop(job_id, None)

    def spent_s(self, queue: str, now: float, period: str) -> float:
        """GPU-seconds the queue spent in the budget period holding `now`, runs going on counted up to now."""
        start, closed = self._period(queue, now, period)
        running = sum(self.runs[j].gpu_seconds(since=start, until=now) for j in self.by_queue.get(queue, {}))
        return closed + running

    def _period(self, queue: str, now: float, period: str) -> tuple[float, float]:
        start = period_start(now, period)
        held = self.closed.get(queue)
        return (start, held[1]) if held is not None and held[0] == start else (start, 0.0)
