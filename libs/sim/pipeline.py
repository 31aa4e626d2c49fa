"""The whole platform in virtual time, in one process: the four deciders read one in-memory log in order
(as their consumers read the stream), a simulated executor runs placed jobs for their declared durations,
and clock ticks advance. Same decision code as the services; no bus, no wall clock. Used by what-if and to
make large realistic logs."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from contracts import (
    ClockTick,
    EventBase,
    JobEvicted,
    JobFinished,
    JobStarted,
)
from libs.core.admission import AdmissionDecider
from libs.core.decider import Decider, derived_id, run_decider
from libs.core.placement import PlacementDecider
from libs.core.preemption import PreemptionDecider
from libs.core.quota import QuotaDecider
from libs.sim.executor import REPORTS, ExecutorBook, Run
from libs.sim.executor import SOURCE as EXECUTOR

WORLD = (AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider)
# With nothing left to happen but jobs still waiting, the clock runs on this long (past any nomination's
# lapse) before the run ends with them waiting.
IDLE_LIMIT_S = 300.0


@dataclass(order=True)
class _Timed:
    ts: float
    order: int
    event: EventBase = field(compare=False)


class VirtualExecutor:
    """The simulated executor in virtual time: finishes go to the pipeline's schedule."""

    def __init__(self, schedule: Callable[[EventBase], None]) -> None:
        self.schedule = schedule
        self.book = ExecutorBook()
        self.pending: dict[str, Run] = {}  # finish event id -> its run
        self.stopping: dict[str, Run] = {}  # scheduled stop (eviction) id -> its run

    @property
    def running(self) -> dict[str, Run]:
        return self.book.runs

    def react(self, event: EventBase) -> list[EventBase]:
        """Reports due now; later ones (finishes) go to the schedule."""
        if isinstance(event, REPORTS) and event.source == EXECUTOR:
            return []  # its own report, already applied
        reports = self.book.react(event, event.ts)
        for report in reports:
            run = self.book.runs.get(getattr(report, "job_id", ""))
            end = run.ends_at() if isinstance(report, JobStarted) and run is not None else None
            if run is not None and end is not None:
                finish = self.book.report(JobFinished, run, "finished", end)
                self.pending[finish.id] = run
                self.schedule(finish)
        for due, run in self.book.later:
            # A stop that completes later: scheduled as its eviction, made real (or dropped) when due.
            stop = self.book.report(JobEvicted, run, "evicted", due, reason="preempted")
            self.stopping[stop.id] = run
            self.schedule(stop)
        self.book.later.clear()
        return reports

    def expire(self, event: JobEvicted) -> list[EventBase]:
        """A scheduled stop as it happens (checkpoint and eviction, or a kill); [] if the run ended first."""
        run = self.stopping.pop(event.id, None)
        return self.book.expire(run, event.ts) if run is not None else []

    def still_running(self, event: JobFinished) -> EventBase | None:
        """The run's end as it happens (a finish, or a scripted failure); None for a run evicted meanwhile."""
        run = self.pending.pop(event.id, None)
        return self.book.finish(run, event.ts) if run is not None else None


@dataclass
class VirtualRun:
    log: list[tuple[int, EventBase]]
    end: float


def run_virtual(inputs: Iterable[EventBase], tick_s: float = 5.0, horizon_s: float = 30 * 86400.0,
                progress: Callable[[int], None] | None = None) -> VirtualRun:
    """Feed the world's inputs (submissions, cancellations, policy, inventory) at their timestamps; decide
    everything else. Stops when nothing is pending and nothing runs, or at the horizon."""
    deciders: list[Decider] = [make() for make in WORLD]
    accepts = [tuple(d.input_types()) for d in deciders]
    log: list[tuple[int, EventBase]] = []
    heap: list[_Timed] = []
    counter = 0

    def schedule(event: EventBase) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(heap, _Timed(event.ts, counter, event))

    executor = VirtualExecutor(schedule)
    for event in inputs:
        schedule(event)
    if not heap:
        return VirtualRun(log, 0.0)
    start = heap[0].ts
    next_tick = (start // tick_s + 1) * tick_s
    now = start

    def append(event: EventBase) -> None:
        log.append((len(log) + 1, event))

    def settle(first: int) -> None:
        """Let every decider and the executor react until the log is quiet (services at full speed)."""
        cursor = first
        while cursor < len(log):
            seq, event = log[cursor]
            cursor += 1
            for decider, accepted in zip(deciders, accepts, strict=True):
                if isinstance(event, accepted):
                    for d in run_decider(decider, event, seq):
                        append(d)
            for report in executor.react(event):
                append(report)

    quota = next(d for d in deciders if isinstance(d, QuotaDecider))
    idle_since: float | None = None  # nothing scheduled or running, yet jobs wait: for how long?

    def busy() -> bool:
        """Work still to come: events due, runs going, a retry backing off, or waiting jobs that time
        alone may release (a nomination or hold lapsing), for at most IDLE_LIMIT_S of idle virtual time."""
        if heap or executor.running or quota.backing_off:
            return True
        return any(quota.pending.values()) and (idle_since is None or now - idle_since <= IDLE_LIMIT_S)

    while busy():
        if not (heap or executor.running or quota.backing_off):
            idle_since = now if idle_since is None else idle_since
        else:
            idle_since = None
        upcoming = heap[0].ts if heap else None
        if upcoming is None or next_tick <= upcoming:
            # The clock ticks between events (time-driven decisions react to ticks, as in the services).
            now = next_tick
            next_tick += tick_s
            first = len(log)
            append(ClockTick(id=derived_id("node-telemetry", "tick", tick_s, int(now // tick_s)), ts=now,
                             source="node-telemetry"))
            settle(first)
            if now - start > horizon_s:
                break
            continue
        item = heapq.heappop(heap)
        now = item.ts
        arrived: list[EventBase] = [item.event]
        if isinstance(item.event, JobFinished):
            finished = executor.still_running(item.event)
            arrived = [] if finished is None else [finished]
        elif isinstance(item.event, JobEvicted) and item.event.id in executor.stopping:
            arrived = executor.expire(item.event)
        if not arrived:
            continue
        first = len(log)
        for event in arrived:
            append(event)
        settle(first)
        if progress is not None and len(log) % 1000 < 20:
            progress(len(log))
    return VirtualRun(log, now)


def world_inputs(log: Iterable[tuple[int, EventBase]]) -> list[EventBase]:
    """The events of a recorded log that came from outside: submissions, cancellations, policy and
    inventory. Decisions, executor reports, clock ticks and audit checkpoints are derived again."""
    derived = {"admission", "quota", "placement", "preemption", EXECUTOR}
    return [e for _, e in log if e.source not in derived and not e.source.endswith(".audit")
            and not isinstance(e, ClockTick)]
