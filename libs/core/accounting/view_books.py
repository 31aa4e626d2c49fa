"""What the read models need beyond the deciders' own state, folded by the ledger from the log: each job's recent
runs, whose quota is held by placed jobs and whose only reserved by jobs still waiting for GPUs, and which GPUs
are split into fractions. Pure bookkeeping: it decides nothing, and folding the same log gives the same books.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from contracts import ReplicaPlacement
from contracts.views import RUN_HISTORY, JobView, RunRecord
from libs.core.kernel.quota_math import ANY

FULL: Final = 1000

# --- runs ----------------------------------------------------------------------------------------------------


def open_run(view: JobView, run: str, placements: tuple[ReplicaPlacement, ...], ts: float) -> None:
    """A placement begins a run; the view keeps the last RUN_HISTORY of them."""
    current = current_run(view)
    if current is not None:  # placed again without an end reported: the earlier placement is over all the same
        close_run(view, ts, "replaced")
    view.runs.append(RunRecord(run=run, placements=placements, placed_at=ts))
    del view.runs[:-RUN_HISTORY]
    view.run_count += 1


def current_run(view: JobView) -> RunRecord | None:
    """The run still going (placed, maybe started, not ended), if any."""
    last = view.runs[-1] if view.runs else None
    return last if last is not None and last.ended_at is None else None


def start_run(view: JobView, ts: float) -> None:
    run = current_run(view)
    if run is not None and run.started_at is None:
        run.started_at = ts


def close_run(view: JobView, ts: float, outcome: str, reason: str = "", exit_code: int | None = None) -> None:
    run = current_run(view)
    if run is not None:
        run.ended_at, run.outcome, run.reason, run.exit_code = ts, outcome, reason, exit_code


# --- quota held by placed jobs, and reserved by jobs waiting for GPUs ----------------------------------------

HELD, UNPLACED, ENDED = "held", "unplaced", "ended"


@dataclass(slots=True)
class QuotaHolds:
    """Each job's quota reservation, by whether its job has GPUs: reserved (QuotaReserved) it waits for a node,
    placed (JobPlaced) it holds them; once its run ends (finished, failed, evicted) it counts as neither until
    quota releases it (QuotaReleased), which follows at once. Per (queue, flavor) and per queue, in thousandths."""

    # job -> (queue, flavor, milli, HELD, UNPLACED or ENDED)
    jobs: dict[str, tuple[str, str, int, str]] = field(default_factory=dict)
    by_flavor: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (queue, flavor, state) -> milli
    by_queue: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state) -> milli

    def _move(self, job: str, state: str) -> str | None:
        """Put the job's reservation in `state`; its queue, or None when it has none."""
        found = self.jobs.get(job)
        if found is None:
            return None
        queue, flavor, milli, old = found
        for s, sign in ((old, -1), (state, +1)):
            if s != ENDED:
                self.by_flavor[queue, flavor, s] = self.by_flavor.get((queue, flavor, s), 0) + sign * milli
                self.by_queue[queue, s] = self.by_queue.get((queue, s), 0) + sign * milli
        self.jobs[job] = (queue, flavor, milli, state)
        return queue

    def reserved(self, job: str, queue: str, flavor: str, milli: int) -> None:
        self.released(job)  # a reservation replaces any the job still had
        self.jobs[job] = (queue, flavor or ANY, milli, ENDED)
        self._move(job, UNPLACED)

    def placed(self, job: str) -> str | None:
        return self._move(job, HELD) if job in self.jobs else None

    def run_ended(self, job: str) -> str | None:
        return self._move(job, ENDED) if job in self.jobs else None

    def released(self, job: str) -> None:
        if self._move(job, ENDED) is not None:
            del self.jobs[job]

    def gpus(self, queue: str, state: str, flavor: str | None = None) -> float:
        """GPUs of the queue's quota (of one flavor, or all) in `state` (HELD or UNPLACED)."""
        if flavor is None:
            return self.by_queue.get((queue, state), 0) / FULL
        return self.by_flavor.get((queue, flavor, state), 0) / FULL


# --- GPUs split into fractions -------------------------------------------------------------------------------


def splits(placement: ReplicaPlacement) -> bool:
    """Is it a fraction of a GPU outside MIG (a GPU it lands on is split)?"""
    return 0 < placement.gpu_milli < FULL and not placement.mig_slices


@dataclass(slots=True)
class SplitGpus:
    """(node, GPU index) -> how many fractions hold it: a GPU fully taken by four quarters is still split."""

    holders: dict[tuple[str, int], int] = field(default_factory=dict)

    def apply(self, placements: tuple[ReplicaPlacement, ...], sign: int) -> None:
        for placement in placements:
            if splits(placement):
                for index in placement.gpu_indices:
                    count = self.holders.get((placement.node, index), 0) + sign
                    if count > 0:
                        self.holders[placement.node, index] = count
                    else:
                        self.holders.pop((placement.node, index), None)

    def is_split(self, node: str, index: int) -> bool:
        return (node, index) in self.holders
