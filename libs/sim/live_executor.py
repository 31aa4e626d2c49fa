"""The simulated executor on the wall clock, which node-telemetry runs for a simulated cluster. It "runs" each placed
job for its actual runtime, at most its max_runtime_s (divided by the time scale; see libs/sim/executor.py)
and reports what a real executor would. It is the world, not a decider; after a restart it rebuilds what is
running from the log and re-arms the timers. Reports made by its timers carry their job's trace context, as
the reactor's decisions do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from nats.js.errors import NotFoundError

from contracts import (
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    PreemptionDecided,
    PriorityClassesChanged,
)
from libs.bus.jetstream import Bus
from libs.core.node_health.announcements import InventoryBook
from libs.sim.executor import REPORTS, SOURCE, ExecutorBook, Run
from libs.telemetry.tracing import ServiceTracing, current_tracing

log = logging.getLogger(__name__)
ENDS = (JobFinished, JobFailed, JobEvicted)  # reports that end a run
# Decisions and facts that may stop runs (a registration without a GPU a run holds).
STOPPING = (PreemptionDecided, NodeLost, GpuHealthChanged, NodeCordoned, NodeRegistered)


class SimExecutor:
    """Handler for the node-telemetry reactor: the inventory fold plus the simulated executor."""

    name = "node-telemetry"

    def __init__(self, bus: Bus | None, time_scale: float = 1.0, serves: Callable[[str], bool] | None = None) -> None:
        self.bus = bus
        self.time_scale = time_scale
        # Which nodes it runs jobs on: the simulated cluster's, not an agent's that registered beside it (whose
        # agent runs them) nor a node of an earlier cluster source (which nobody serves). None: every node.
        self.serves = serves
        self.inventory = InventoryBook()
        self.book = ExecutorBook(time_scale)
        self.timers: dict[str, asyncio.TimerHandle] = {}  # job id -> the finish of its current run
        # Ids of the reports this process made and applied to its book, until they come back through the log.
        # A report of ours that is not among them was made by the process this one replaced (killed after
        # storing it, before handling it): the book has not seen it and must fold it like any other event.
        self.made: dict[str, None] = {}
        # The last log sequence handled, and after a restart the sequence to read up to before resuming the
        # runs (-1: resumed, or nothing to resume).
        self._seen = 0
        self._resume_at = -1
        # Decisions read before the resume, folded but not yet acted on (see `on_event`).
        # With each, the run of every job as it was then: a stop acts on that run only, if it still runs.
        self._deferred: list[tuple[EventBase, dict[str, str]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # None: the process's tracing, which its reactor also uses (one memory of the jobs' contexts).
        self.tracing: ServiceTracing | None = None

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, JobSubmitted, JobPlaced, PreemptionDecided,
                JobCancelled, PriorityClassesChanged, *REPORTS)

    def replay(self, seq: int, event: EventBase) -> None:
        self._seen = seq
        if self._elsewhere(event):
            return
        self.inventory.fold(event)
        self.book.fold(event)

    def _elsewhere(self, event: EventBase) -> bool:
        """A placement on a node this executor does not serve: another executor's run, never started here."""
        return (self.serves is not None and isinstance(event, JobPlaced)
                and not all(self.serves(p.node) for p in event.placements))

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        self._seen = seq
        if self._elsewhere(event):
            return self._resume() if 0 <= self._resume_at <= seq else []
        if self._resume_at > seq and not isinstance(event, REPORTS):
            # Until every report of the replaced process is read, the book may hold runs that already ended
            # (a preemption decided before a run's finish, read here before that finish): acting now could
            # evict a finished job. The event is folded now and acted on at the resume, on the runs as they are.
            self.inventory.fold(event)
            self.book.fold(event)
            # Placements and cancellations are served by the resume's pass over the runs (a start is timed
            # when it comes back through the log); only the decisions that stop runs wait, with their runs.
            if isinstance(event, STOPPING):
                self._deferred.append((event, {job: run.run_id for job, run in self.book.runs.items()}))
            out: list[EventBase] = []
        else:
            out = self._handle(event)
        if 0 <= self._resume_at <= seq:  # every report of the replaced process's read: resume now
            out += self._resume()
        return out

    def _handle(self, event: EventBase) -> list[EventBase]:
        if isinstance(event, REPORTS) and event.source == SOURCE:
            if event.id in self.made:
                del self.made[event.id]
            else:  # the replaced process's report, stored but never handled: what the log says happened
                ends_running = isinstance(event, ENDS) and not self.book.about_other_run(event)
                self.book.fold(event)
                if ends_running and event.job_id in self.timers:
                    self.timers.pop(event.job_id).cancel()  # that run ended: its finish is not due
            # A run's finish is timed from here, once its start is stored: a finish timed from the decision
            # could reach the log before a start lost to a reconnecting server, and the log would read
            # "finished, then started".
            if isinstance(event, JobStarted):
                run = self.book.runs.get(event.job_id)
                if run is not None and event.id == self.book.reports(run).report_id("started"):
                    self._arm(run)
            return []
        self.inventory.fold(event)
        reports = self._made(self.book.react(event, time.time()))
        self._untime_evicted(reports)
        self._arm_stops()
        return reports

    def _untime_evicted(self, reports: list[EventBase]) -> None:
        """An evicted run's finish is no longer due."""
        for report in reports:
            if isinstance(report, JobEvicted) and report.job_id in self.timers:
                self.timers.pop(report.job_id).cancel()

    def _made(self, reports: list[EventBase]) -> list[EventBase]:
        """Reports about to be published: remembered until they come back through the log."""
        for report in reports:
            self.made[report.id] = None
        return reports

    def _arm_stops(self) -> None:
        """Stops that complete later (a checkpoint being written, a grace running out)."""
        loop = asyncio.get_running_loop()
        for due, run in self.book.later:
            loop.call_later(max(0.0, due - time.time()), self._expire, run)
        self.book.later.clear()

    def _expire(self, run: Run) -> None:
        reports = self._made(self.book.expire(run, time.time()))
        if reports:
            timer = self.timers.pop(run.job_id, None)
            if timer is not None:
                timer.cancel()
            task = asyncio.get_running_loop().create_task(self._publish(reports))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _arm(self, run: Run) -> None:
        end = run.ends_at(self.time_scale)
        if end is None:
            return
        loop = asyncio.get_running_loop()
        self.timers[run.job_id] = loop.call_later(max(0.0, end - time.time()), self._finish, run)

    def _finish(self, run: Run) -> None:
        self.timers.pop(run.job_id, None)
        report = self.book.finish(run, time.time())
        if report is not None:
            self._made([report])
            task = asyncio.get_running_loop().create_task(self._publish([report]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def settled(self) -> bool:
        """No report of a timer's (a finish, a stop come due) is still on its way to the log, and no decision
        read waits for the resume to be acted on (a snapshot would hold it folded but never acted on)."""
        return not self._tasks and not self._deferred

    async def _publish(self, events: list[EventBase]) -> None:
        assert self.bus is not None
        tracing = self.tracing or current_tracing()
        await self.bus.publish_until_stored(events, None if tracing is None else tracing.headers_for(events))

    async def after_batch(self) -> None:
        return None

    async def after_catch_up(self) -> None:
        """Resume what was running before a restart (start placed jobs, time the runs' finishes again), once
        this process has read every report the process it replaced stored: those beyond the point it caught up
        to (its acknowledged floor) may already have ended a run, and a finish timed from an older view would
        end it a second time."""
        if self.bus is not None:
            self._resume_at = await self._last_report_seq()
            # Everything up to the floor is folded in (replayed, or restored from a snapshot).
            self._seen = max(self._seen, await self.bus.ack_floor(self.name))
        if self._resume_at <= self._seen:
            await self._publish_resumed(self._resume())

    async def _last_report_seq(self) -> int:
        """Where in the log the latest executor report is (0: none)."""
        assert self.bus is not None
        last = 0
        for kind in REPORTS:
            with contextlib.suppress(NotFoundError):
                msg = await self.bus.js.get_last_msg(self.bus.config.stream, self.bus.subject_for_type(kind))
                last = max(last, int(msg.seq or 0))
        return last

    def _resume(self) -> list[EventBase]:
        """The resumption itself: reports to publish; timers armed."""
        self._resume_at = -1
        now = time.time()
        pending: list[EventBase] = []
        for event, runs_then in self._deferred:
            pending += self.book.act(event, now, runs_then)
        self._deferred.clear()
        self._untime_evicted(pending)
        for run in list(self.book.runs.values()):
            if run.job_id in self.book.cancelled:
                pending += self.book.stop(run, "cancelled", now)
            elif run.started_at is None:
                pending += self.book.start(run, now)  # timed when it comes back through the log
            else:
                self._arm(run)
                self.book.arm_stop(run)  # told to stop before the restart: its stop comes due still
        self._arm_stops()
        return self._made(pending)

    async def _publish_resumed(self, pending: list[EventBase]) -> None:
        if pending and self.bus is not None:
            await self._publish(pending)
