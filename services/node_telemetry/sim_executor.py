"""The simulated executor: "runs" each placed job for its declared duration and reports what a real
executor would (started, finished, evicted). It is the world, not a decider: its timing is the wall clock.

Its reports have ids derived from the placement they belong to, so after a restart it can re-report
without duplicating; it rebuilds what is running from the log and resumes the timers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from contracts import (
    EventBase,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PreemptionDecided,
)
from libs.bus.jetstream import Bus
from libs.core.decider import derived_id
from libs.core.inventory import InventoryBook

log = logging.getLogger(__name__)
SOURCE = "sim-executor"


@dataclass(slots=True)
class Run:
    job_id: str
    run_id: str  # the JobPlaced event id: one run per placement
    duration: float | None
    started_at: float | None = None
    timer: asyncio.TimerHandle | None = None


class SimExecutor:
    """Handler for the node-telemetry reactor: the inventory fold plus the simulated executor."""

    name = "node-telemetry"

    def __init__(self, bus: Bus | None, time_scale: float = 1.0) -> None:
        self.bus = bus
        self.time_scale = time_scale
        self.inventory = InventoryBook()
        self.durations: dict[str, float | None] = {}
        self.runs: dict[str, Run] = {}
        self.cancelled: dict[str, None] = {}
        self._live = False
        self._tasks: set[asyncio.Task[None]] = set()

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, JobSubmitted, JobPlaced, PreemptionDecided, JobCancelled, JobStarted,
                JobFinished, JobFailed, JobEvicted)

    def _report(self, event_type: Any, run: Run, what: str, **fields: Any) -> EventBase:
        """An executor report about one run; `event_type` is one of the Job* executor events."""
        return event_type(id=derived_id(SOURCE, run.run_id, what), ts=time.time(), source=SOURCE,
                          correlation_id=run.job_id, job_id=run.job_id, **fields)

    # --- the fold (replay and live) ---------------------------------------------------------------

    def _fold(self, event: EventBase) -> None:
        match event:
            case NodeRegistered():
                self.inventory.evolve(event)
            case JobSubmitted():
                self.durations[event.job_id] = event.spec.duration_s
            case JobPlaced():
                self.runs[event.job_id] = Run(job_id=event.job_id, run_id=event.id,
                                              duration=self.durations.get(event.job_id))
            case JobStarted():
                run = self.runs.get(event.job_id)
                if run is not None and run.started_at is None:
                    run.started_at = event.ts
            case JobCancelled():
                self.cancelled[event.job_id] = None
            case JobFinished() | JobFailed() | JobEvicted():
                run = self.runs.pop(event.job_id, None)
                if run is not None and run.timer is not None:
                    run.timer.cancel()
                if not isinstance(event, JobEvicted) or event.job_id in self.cancelled:
                    self.durations.pop(event.job_id, None)
                    self.cancelled.pop(event.job_id, None)

    def replay(self, seq: int, event: EventBase) -> None:
        self._fold(event)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        if isinstance(event, JobStarted | JobFinished | JobFailed | JobEvicted) and event.source == SOURCE:
            return []  # our own report coming back: already applied
        self._fold(event)
        out: list[EventBase] = []
        match event:
            case JobPlaced():
                run = self.runs[event.job_id]
                if event.job_id in self.cancelled:
                    out.append(self._stop(run, "cancelled"))
                else:
                    out.append(self._start(run))
            case PreemptionDecided():
                for v in event.victims:
                    if v.job_id in self.runs:
                        out.append(self._stop(self.runs[v.job_id], "preempted"))
            case JobCancelled() if event.job_id in self.runs:
                out.append(self._stop(self.runs[event.job_id], "cancelled"))
        return out

    # --- effects ---------------------------------------------------------------------------------

    def _start(self, run: Run) -> EventBase:
        started = self._report(JobStarted, run, "started", executor=SOURCE)
        run.started_at = started.ts
        self._schedule(run)
        return started

    def _stop(self, run: Run, reason: str) -> EventBase:
        if run.timer is not None:
            run.timer.cancel()
        self.runs.pop(run.job_id, None)
        return self._report(JobEvicted, run, "evicted", reason=reason)

    def _schedule(self, run: Run) -> None:
        if run.duration is None or run.started_at is None:
            return  # runs until cancelled or evicted
        remaining = max(0.0, run.started_at + run.duration / self.time_scale - time.time())
        loop = asyncio.get_running_loop()
        run.timer = loop.call_later(remaining, self._finish_soon, run)

    def _finish_soon(self, run: Run) -> None:
        if self.runs.get(run.job_id) is not run:
            return
        self.runs.pop(run.job_id, None)
        task = asyncio.get_running_loop().create_task(self._publish(self._report(JobFinished, run, "finished")))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _publish(self, event: EventBase) -> None:
        assert self.bus is not None
        try:
            await self.bus.publish([event])
        except Exception:
            log.exception("could not report %s for %s", type(event).__name__, getattr(event, "job_id", "?"))

    async def after_batch(self) -> None:
        return None

    async def after_catch_up(self) -> None:
        """Resume what was running before a restart: start placed jobs, re-arm the finish timers."""
        pending: list[EventBase] = []
        for run in list(self.runs.values()):
            if run.job_id in self.cancelled:
                pending.append(self._stop(run, "cancelled"))
            elif run.started_at is None:
                pending.append(self._start(run))
            else:
                self._schedule(run)
        if pending and self.bus is not None:
            await self.bus.publish(pending)
