"""The whole platform in virtual time, in one process: the four deciders read one in-memory log in order
(as their consumers read the stream), a simulated executor runs placed jobs for their actual runtimes (see
libs/sim/executor.py: up to their max_runtime_s), and clock ticks advance. Same decision code as the
services; no bus, no wall clock. Used by what-if and to make large realistic logs."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from contracts import (
    ClockTick,
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
)
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import Decider, derived_id, run_decider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from libs.sim.executor import REPORTS, ExecutorBook, Run
from libs.sim.executor import SOURCE as EXECUTOR

WORLD = (AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider)
# With nothing left to happen but jobs still waiting, the clock runs on this long (past any nomination's
# lapse) before the run ends with them waiting.
IDLE_LIMIT_S = 300.0
# The source of scripted executor actions among the world's inputs: a JobFinished, JobFailed or JobEvicted
# from it tells the simulated executor that the job's current run ends now (its process exited with that
# code, or its executor stopped it for that reason); the executor reports it as its own, and nothing happens
# when the job does not run then.
SCRIPT = "script"
SCRIPTED = (JobFinished, JobFailed, JobEvicted)
# A scripted report may be about an earlier run of its job: its `run` then names the run by the job's
# placements, "#1" for its first (a world input cannot know the placement ids the deciders will make). The
# executor reports it naming that run's placement: a late report of a run that is over.
PLACEMENT_REF = "#"


def placement_ref(number: int) -> str:
    """The `run` of a scripted report about the job's `number`-th run (1: its first)."""
    return f"{PLACEMENT_REF}{number}"


def placement_number(run: str) -> int | None:
    """The run a scripted report's `run` names, counted from 1; None: the job's current run."""
    digits = run.removeprefix(PLACEMENT_REF)
    return int(digits) if run.startswith(PLACEMENT_REF) and digits.isdigit() and int(digits) >= 1 else None


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
        self.placements: dict[str, dict[str, None]] = {}  # job -> the ids of its placements, one per run, in order

    @property
    def running(self) -> dict[str, Run]:
        return self.book.runs

    def react(self, event: EventBase) -> list[EventBase]:
        """Reports due now; later ones (finishes) go to the schedule."""
        if isinstance(event, REPORTS) and event.source == EXECUTOR:
            return []  # its own report, already applied
        if isinstance(event, JobPlaced):
            self.placements.setdefault(event.job_id, {})[event.id] = None
        reports = self.book.react(event, event.ts)
        for report in reports:
            run = self.book.runs.get(getattr(report, "job_id", ""))
            end = run.ends_at() if isinstance(report, JobStarted) and run is not None else None
            if run is not None and end is not None:
                finish = self.book.reports(run).finished(end)
                self.pending[finish.id] = run
                self.schedule(finish)
        for due, run in self.book.later:
            # A stop that completes later: scheduled as its eviction, made real (or dropped) when due.
            stop = self.book.reports(run).evicted(due, "preempted")
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

    def scripted(self, event: JobFinished | JobFailed | JobEvicted) -> list[EventBase]:
        """A scripted end of the job's current run (see SCRIPT): the executor's report of it, [] when the job
        does not run now."""
        book = self.book
        run = book.runs.get(event.job_id)
        number = placement_number(event.run)
        if number is not None:
            placed = list(self.placements.get(event.job_id, {}))
            if number > len(placed):
                return []  # the job has not run that often: there is no such run to report on
            if run is None or run.run_id != placed[number - 1]:
                return [self._late(event, placed[number - 1])]
        if run is None:
            return []
        if isinstance(event, JobEvicted):
            return book.stop(run, event.reason or "evicted", event.ts)
        del book.runs[run.job_id]
        book.ended_runs[run.job_id] = book.ended_runs.get(run.job_id, 0) + 1  # its own report is not folded back
        if isinstance(event, JobFailed):
            book.saved.pop(run.job_id, None)  # a failed run keeps nothing
            return [book.reports(run).failed(event.ts, event.exit_code, event.reason or "exit_code")]
        return [book.reports(run).finished(event.ts)]

    def _late(self, event: JobFinished | JobFailed | JobEvicted, run_id: str) -> EventBase:
        """The executor's report, read now, of the job's run `run_id`, which is over: as the report it would
        have made then, with an id of its own (the scripted event's) so that it is a message of its own."""
        fields: dict[str, Any] = ({"exit_code": event.exit_code, "reason": event.reason or "exit_code"}
                                  if isinstance(event, JobFailed) else
                                  {"reason": event.reason or "evicted"} if isinstance(event, JobEvicted) else {})
        return type(event)(id=derived_id(EXECUTOR, run_id, "late", event.id), ts=event.ts, source=EXECUTOR,
                           correlation_id=event.job_id, job_id=event.job_id, run=run_id, **fields)


@dataclass
class VirtualRun:
    log: list[tuple[int, EventBase]]
    end: float
    # Seconds each decider spent folding and deciding, and the decisions it made: the cost of a decision.
    seconds: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)


class VirtualWorld:
    """The deciders and the simulated executor on one in-memory log, stepped through virtual time by its
    driver: `run_virtual` runs a whole history to its end; a driver that acts on what happened so far (a
    scenario, a property test) feeds inputs and advances the clock bit by bit."""

    def __init__(self, tick_s: float = 5.0, start: float | None = None) -> None:
        self.tick_s = tick_s
        self.deciders: list[Decider] = [make() for make in WORLD]
        self.accepts = [tuple(d.input_types()) for d in self.deciders]
        self.log: list[tuple[int, EventBase]] = []
        self.heap: list[_Timed] = []
        self.counter = 0
        self.executor = VirtualExecutor(self.schedule)
        self.quota = next(d for d in self.deciders if isinstance(d, QuotaDecider))
        self.start = start
        self.now = 0.0 if start is None else start
        self.next_tick = 0.0 if start is None else (start // tick_s + 1) * tick_s
        self.idle_since: float | None = None  # nothing scheduled or running, yet jobs wait: for how long?
        self.seconds: dict[str, float] = {d.name: 0.0 for d in self.deciders}
        self.decisions: dict[str, int] = {d.name: 0 for d in self.deciders}

    def schedule(self, event: EventBase) -> None:
        self.counter += 1
        heapq.heappush(self.heap, _Timed(event.ts, self.counter, event))

    def feed(self, inputs: Iterable[EventBase]) -> None:
        """World inputs, each to happen at its own timestamp."""
        for event in inputs:
            self.schedule(event)

    def begin(self) -> None:
        """The clock starts at the first input (unless a start was given)."""
        if self.start is None:
            self.start = self.heap[0].ts if self.heap else 0.0
            self.now = self.start
            self.next_tick = (self.start // self.tick_s + 1) * self.tick_s

    def append(self, event: EventBase) -> None:
        self.log.append((len(self.log) + 1, event))

    def settle(self, first: int) -> None:
        """Let every decider and the executor react until the log is quiet (services at full speed)."""
        cursor = first
        log = self.log
        while cursor < len(log):
            seq, event = log[cursor]
            cursor += 1
            for decider, accepted in zip(self.deciders, self.accepts, strict=True):
                if isinstance(event, accepted):
                    began = perf_counter()
                    decided = run_decider(decider, event, seq)
                    self.seconds[decider.name] += perf_counter() - began
                    self.decisions[decider.name] += len(decided)
                    for d in decided:
                        self.append(d)
            for report in self.executor.react(event):
                self.append(report)

    def busy(self) -> bool:
        """Work still to come: events due, runs going, a retry backing off, or waiting jobs that time
        alone may release (a nomination or hold lapsing), for at most IDLE_LIMIT_S of idle virtual time."""
        if self.heap or self.executor.running or self.quota.state.backing_off:
            return True
        return any(self.quota.state.pending.values()) and (self.idle_since is None
                                                     or self.now - self.idle_since <= IDLE_LIMIT_S)

    def next_due(self) -> float:
        """When the next thing happens: a clock tick or the earliest scheduled event."""
        return min(self.next_tick, self.heap[0].ts) if self.heap else self.next_tick

    def step(self) -> bool:
        """One clock tick or one scheduled event, with everything it causes; True for a tick."""
        self.begin()
        if not (self.heap or self.executor.running or self.quota.state.backing_off):
            self.idle_since = self.now if self.idle_since is None else self.idle_since
        else:
            self.idle_since = None
        upcoming = self.heap[0].ts if self.heap else None
        if upcoming is None or self.next_tick <= upcoming:
            # The clock ticks between events (time-driven decisions react to ticks, as in the services).
            self.now = self.next_tick
            self.next_tick += self.tick_s
            first = len(self.log)
            self.append(ClockTick(id=derived_id("node-telemetry", "tick", self.tick_s, int(self.now // self.tick_s)),
                                  ts=self.now, source="node-telemetry"))
            self.settle(first)
            return True
        item = heapq.heappop(self.heap)
        self.now = item.ts
        arrived: list[EventBase] = [item.event]
        if isinstance(item.event, SCRIPTED) and item.event.source == SCRIPT:
            arrived = self.executor.scripted(item.event)
        elif isinstance(item.event, JobFinished):
            finished = self.executor.still_running(item.event)
            arrived = [] if finished is None else [finished]
        elif isinstance(item.event, JobEvicted) and item.event.id in self.executor.stopping:
            arrived = self.executor.expire(item.event)
        if arrived:
            first = len(self.log)
            for event in arrived:
                self.append(event)
            self.settle(first)
        return False

    def advance(self, until: float) -> None:
        """Everything due up to `until` (inclusive), ticks included; the clock then reads `until`."""
        self.begin()
        while self.next_due() <= until:
            self.step()
        self.now = max(self.now, until)


def run_virtual(inputs: Iterable[EventBase], tick_s: float = 5.0, horizon_s: float = 30 * 86400.0,
                progress: Callable[[int], None] | None = None) -> VirtualRun:
    """Feed the world's inputs (submissions, cancellations, policy, inventory) at their timestamps; decide
    everything else. Stops when nothing is pending and nothing runs, or at the horizon."""
    world = VirtualWorld(tick_s)
    world.feed(inputs)
    if not world.heap:
        return VirtualRun(world.log, 0.0, world.seconds, world.decisions)
    world.begin()
    start = world.now
    while world.busy():
        if world.step():
            if world.now - start > horizon_s:
                break
        elif progress is not None and len(world.log) % 1000 < 20:
            progress(len(world.log))
    return VirtualRun(world.log, world.now, world.seconds, world.decisions)


def world_inputs(log: Iterable[tuple[int, EventBase]]) -> list[EventBase]:
    """The events of a recorded log that came from outside: submissions, cancellations, policy and
    inventory. Decisions, executor reports, clock ticks and audit checkpoints are derived again."""
    derived = {"admission", "quota", "placement", "preemption", EXECUTOR}
    return [e for _, e in log if e.source not in derived and not e.source.endswith(".audit")
            and not isinstance(e, ClockTick)]
