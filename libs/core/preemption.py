"""Preemption: whom to evict so that a higher-priority job of the same queue can run.

Triggered when quota or placement defers a job. Candidates are running jobs of the preemptor's queue with
a lower priority and a preemptible class, ordered:
  1. lowest priority first,
  2. most recently placed first (it has lost the least work),
  3. job id.
Victims are added in that order until a simulation says the preemptor would then get its quota and fit;
a minimisation pass then drops every victim that is not needed. No fit in simulation, no eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
    Victim,
)
from libs.core.cluster import Cluster
from libs.core.decider import Chain, Decisions, Trigger
from libs.core.fit import fits
from libs.core.policy import PolicyBook, demand_milli
from libs.core.quota import QUEUE_QUOTA_EXHAUSTED

SERVICE = "preemption"
WITHIN_QUEUE_PRIORITY = "within_queue_priority"


@dataclass(slots=True)
class Running:
    job_id: str
    queue: str
    priority: int
    preemptible: bool
    demand: int
    placed_order: int
    placements: tuple[ReplicaPlacement, ...]


@dataclass(slots=True)
class PreemptionState:
    specs: dict[str, JobSpec] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    # preemptor -> victims still being evicted; a victim -> its preemptor.
    in_flight: dict[str, list[str]] = field(default_factory=dict)
    victim_of: dict[str, str] = field(default_factory=dict)
    # Jobs waiting for quota (True) or for capacity (False): reconsidered on every clock tick.
    waiting: dict[str, bool] = field(default_factory=dict)
    cancelled: dict[str, None] = field(default_factory=dict)


def choose_victims(candidates: list[Running], enough: Callable[[list[Running]], bool]) -> list[Running]:
    """Greedy in candidate order until `enough`, then drop each victim (last added first) that is not
    needed. Returns [] when even every candidate is not enough."""
    if enough([]):
        return []  # nothing needs to go: it fits (or will, once jobs already leaving are gone)
    chosen: list[Running] = []
    for c in candidates:
        chosen.append(c)
        if enough(chosen):
            break
    else:
        return []
    for victim in reversed(list(chosen)):
        trial = [v for v in chosen if v.job_id != victim.job_id]
        if trial and enough(trial):
            chosen = trial
    return chosen


class PreemptionDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.policy = PolicyBook()
        self.cluster = Cluster()
        self.s = PreemptionState()
        self._placed = 0
        self.changed = False  # anything folded since the last tick's reconsideration?

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, QueuePolicyChanged, PriorityClassesChanged,
                JobSubmitted, QuotaReserved, QuotaReleased, QuotaDeferred, JobPlaced, PlacementDeferred,
                JobCancelled, JobFinished, JobFailed, JobEvicted, ClockTick)

    def evolve(self, event: EventBase) -> None:
        if not isinstance(event, ClockTick):
            self.changed = True
        if self.policy.apply(event):
            return
        s = self.s
        match event:
            case NodeRegistered():
                self.cluster.register(event.node)
            case NodeLost():
                self.cluster.set_online(event.node, False)
            case GpuHealthChanged():
                self.cluster.set_gpu_health(event.node, event.index, event.healthy)
            case JobSubmitted():
                s.specs[event.job_id] = event.spec
            case QuotaReserved():
                s.used[event.queue] = s.used.get(event.queue, 0) + event.gpu_milli
                s.waiting.pop(event.job_id, None)
            case QuotaDeferred() if event.code == QUEUE_QUOTA_EXHAUSTED:
                s.waiting[event.job_id] = True
            case PlacementDeferred():
                s.waiting[event.job_id] = False
            case QuotaReleased():
                s.used[event.queue] = s.used.get(event.queue, 0) - event.gpu_milli
            case JobPlaced():
                s.waiting.pop(event.job_id, None)
                spec = s.specs.get(event.job_id)
                self._placed += 1
                if spec is None:
                    # Placed after it was cancelled: it holds GPUs until its executor reports it gone.
                    s.cancelled[event.job_id] = None
                    run = Running(job_id=event.job_id, queue="", priority=0, preemptible=False, demand=0,
                                  placed_order=self._placed, placements=event.placements)
                else:
                    run = Running(job_id=event.job_id, queue=spec.queue, priority=self.policy.priority_of(spec),
                                  preemptible=self.policy.preemptible(spec), demand=demand_milli(spec),
                                  placed_order=self._placed, placements=event.placements)
                s.running[event.job_id] = run
                self.cluster.allocate(event.placements)
            case PreemptionDecided():
                s.in_flight[event.preemptor_id] = [v.job_id for v in event.victims]
                for v in event.victims:
                    s.victim_of[v.job_id] = event.preemptor_id
            case JobCancelled():
                s.waiting.pop(event.job_id, None)
                if event.job_id in s.running:
                    s.cancelled[event.job_id] = None  # still holds its GPUs until its executor stops it
                else:
                    self._gone(event.job_id, final=True)
            case JobFinished() | JobFailed() | JobEvicted():
                final = not isinstance(event, JobEvicted) or event.job_id in s.cancelled
                self._gone(event.job_id, final=final)

    def _gone(self, job_id: str, final: bool) -> None:
        s = self.s
        s.waiting.pop(job_id, None)
        run = s.running.pop(job_id, None)
        if run is not None:
            self.cluster.release(run.placements)
        preemptor = s.victim_of.pop(job_id, None)
        if preemptor is not None:
            left = [v for v in s.in_flight.get(preemptor, []) if v != job_id]
            if left:
                s.in_flight[preemptor] = left
            else:
                s.in_flight.pop(preemptor, None)
        if final:
            s.specs.pop(job_id, None)
            s.in_flight.pop(job_id, None)
            s.cancelled.pop(job_id, None)

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        event = trigger.event
        if isinstance(event, QuotaDeferred | PlacementDeferred) and event.job_id in self.s.waiting:
            self._consider(event.job_id, quota_bound=self.s.waiting[event.job_id], out=out)
        elif isinstance(event, ClockTick) and self.changed:
            # Circumstances change without a new deferral (a victim ended on its own, a job was placed
            # elsewhere): on a tick after any such change, the first waiting job of each queue is considered
            # again.
            self.changed = False
            for job_id in self._heads_of_queues():
                self._consider(job_id, quota_bound=self.s.waiting[job_id], out=out)
        return out.out

    def _heads_of_queues(self) -> list[str]:
        # The first waiting job per queue: (-priority, id) is a total order, so iterating the dict in any
        # (insertion) order gives the same heads; no sort needed.
        heads: dict[str, tuple[int, str]] = {}
        for job_id in self.s.waiting:
            if job_id in self.s.in_flight or job_id not in self.s.specs:
                continue
            spec = self.s.specs[job_id]
            key = (-self.policy.priority_of(spec), job_id)
            if spec.queue not in heads or key < heads[spec.queue]:
                heads[spec.queue] = key
        return [heads[q][1] for q in sorted(heads)]

    def candidates(self, preemptor: JobSpec, preemptor_id: str) -> list[Running]:
        prio = self.policy.priority_of(preemptor)
        cands = [r for r in self.s.running.values()
                 if r.queue == preemptor.queue and r.priority < prio and r.preemptible
                 and r.job_id not in self.s.victim_of and r.job_id not in self.s.cancelled
                 and r.job_id != preemptor_id]
        cands.sort(key=lambda r: (r.priority, -r.placed_order, r.job_id))
        return cands

    def _consider(self, job_id: str, quota_bound: bool, out: Decisions) -> None:
        spec = self.s.specs.get(job_id)
        if spec is None or job_id in self.s.in_flight or job_id in self.s.running:
            return
        cands = self.candidates(spec, job_id)
        if not cands:
            return
        quota = self.policy.quota_milli(spec.queue)
        demand = demand_milli(spec)
        used = self.s.used.get(spec.queue, 0)

        # Jobs already on their way out (cancelled, or victims of an earlier decision) count as gone.
        leaving = [self.s.running[j] for j in sorted(self.s.running)
                   if j in self.s.cancelled or j in self.s.victim_of]

        def enough(victims: list[Running]) -> bool:
            freed = sum(v.demand for v in victims)
            if quota_bound and quota is not None and used - freed + demand > quota:
                return False
            gone = leaving + victims
            for v in gone:
                self.cluster.release(v.placements)
            try:
                return fits(self.cluster, spec)
            finally:
                for v in gone:
                    self.cluster.allocate(v.placements)

        victims = choose_victims(cands, enough)
        if not victims:
            return
        out.emit(PreemptionDecided, correlation_id=job_id, preemptor_id=job_id, code=WITHIN_QUEUE_PRIORITY,
                 victims=tuple(Victim(job_id=v.job_id, queue=v.queue, priority=v.priority,
                                      gpu_milli=v.demand, reason=WITHIN_QUEUE_PRIORITY) for v in victims))

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"running": sorted(self.s.running), "in_flight": self.s.in_flight,
                                    "used": self.s.used, "waiting": self.s.waiting})
