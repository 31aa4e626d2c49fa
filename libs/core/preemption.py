"""Preemption: whom to evict so that a waiting job can run.

Triggered when quota or placement defers a job for a reason eviction can cure, and re-considered on clock
ticks. Two kinds of victims:
  - reclaim: a queue under its nominal quota takes back quota its cohort lent to borrowers (queues above
    their nominal, or jobs admitted over budget), once the queue's reclaim grace has passed. Only borrowers
    lose jobs: never a queue within its nominal quota, to feed another queue's borrowing.
  - within the queue: jobs of lower priority in the preemptor's own queue.
Borrowers are considered first; then, within each kind: lowest priority, least GPU-time lost (time running
x GPUs), most recently started, id. Jobs of non-preemptible classes, jobs that have not yet run their class's
minimum runtime, and jobs expected to end within the settings' preempt_min_remaining_s anyway are never
victims. Victims are added in that order until a simulation says the preemptor would then get its quota and
fit; a minimisation pass then drops every victim that is not needed. No fit in simulation, no eviction.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
    SchedulingSettingsChanged,
    Victim,
)
from libs.core.cluster import Cluster
from libs.core.decider import Chain, Decisions, Trigger
from libs.core.fit import fits
from libs.core.policy import PolicyBook, demand_milli
from libs.core.quota import WAITING_FOR_QUOTA
from libs.core.quotas import ANY, QuotaBook
from libs.core.retries import RetryBook

SERVICE = "preemption"
_DEFERRALS = (QuotaDeferred, PlacementDeferred)
WITHIN_QUEUE_PRIORITY = "within_queue_priority"
RECLAIM = "reclaim"
PLACEMENT = "placement"


@dataclass(slots=True)
class Running:
    job_id: str
    queue: str
    priority: int
    preemptible: bool
    demand: int
    started: float
    placements: tuple[ReplicaPlacement, ...]
    flavor: str = ANY
    over_budget: bool = False
    min_runtime_s: float = 0.0
    ends_at: float | None = None  # from its declared duration
    placed_order: int = 0  # breaks ties between jobs started at the same instant: later placed, first out
    checkpoints_on_stop: bool = False  # it saves its state when told to stop: evicting it loses nothing
    last_checkpoint: float | None = None

    def victim_key(self, now: float) -> tuple[int, float, float, int, str]:
        return (self.priority, self.lost(now), -self.started, -self.placed_order, self.job_id)

    def lost(self, now: float) -> float:
        """GPU-time (thousandths of GPU-seconds) an eviction now throws away: nothing for a job that
        checkpoints when stopped, else everything since its last checkpoint (or its start)."""
        if self.checkpoints_on_stop:
            return 0.0
        since = self.started if self.last_checkpoint is None else max(self.started, self.last_checkpoint)
        return (now - since) * self.demand


@dataclass(slots=True)
class Waiting:
    code: str  # the quota deferral's code, or "placement"
    since: float
    grace_checked: bool = False  # considered once its queue's reclaim grace was over?
    queue: str = ""
    priority: int = 0


@dataclass(slots=True)
class PreemptionState:
    specs: dict[str, JobSpec] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    # job -> (queue, flavor, milli) of its quota reservation
    reserved: dict[str, tuple[str, str, int, bool]] = field(default_factory=dict)
    # preemptor -> victims still being evicted; a victim -> its preemptor.
    in_flight: dict[str, list[str]] = field(default_factory=dict)
    victim_of: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    # queue -> priority -> how many of its jobs wait for quota at that priority
    waiting_priorities: dict[str, dict[int, int]] = field(default_factory=dict)
    cancelled: dict[str, None] = field(default_factory=dict)
    # victim -> the jobs it was evicted for: a victim never preempts any of its preemptors back.
    preempted_by: dict[str, dict[str, None]] = field(default_factory=dict)
    # queue -> [(when, GPUs in thousandths)] chosen for eviction, for the blast-radius budget.
    evicted: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    # Indexes of `waiting`, so that clock ticks need not scan every waiting job:
    # queue (of the job's spec) -> [(-priority, job id)] sorted: the queue's first waiting job, fast;
    heads: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    head_of: dict[str, tuple[str, tuple[int, str]]] = field(default_factory=dict)
    # queue -> [(waiting since, job id)] sorted, of the jobs waiting for quota whose reclaim grace has not
    # been checked yet.
    grace: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    grace_of: dict[str, tuple[str, tuple[float, str]]] = field(default_factory=dict)
    # `running` by queue (each queue's victim candidates, without scanning every running job).
    by_queue: dict[str, dict[str, Running]] = field(default_factory=dict)
    # queue -> priority -> how many of its jobs run at that priority
    running_priorities: dict[str, dict[int, int]] = field(default_factory=dict)


class PreemptionDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.policy = PolicyBook()
        self.cluster = Cluster()
        self.s = PreemptionState()
        self.changed = False  # anything folded since the last tick's reconsideration?
        self._placed = 0
        self.retries = RetryBook()

    @property
    def book(self) -> QuotaBook:
        return self.policy.quotas

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned, QueuePolicyChanged,
                PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, QuotaReserved, QuotaReleased,
                QuotaDeferred, JobPlaced, PlacementDeferred, JobCancelled, JobFinished, JobFailed, JobEvicted,
                JobCheckpointed, ClockTick)

    def evolve(self, event: EventBase) -> None:
        if type(event) is QuotaDeferred:  # by far the most frequent input: straight to its case below
            self.changed = True
            if event.code in WAITING_FOR_QUOTA:
                self._wait(event.job_id, event.code, event.ts)
            else:
                self._unwait(event.job_id)
            return
        if isinstance(event, ClockTick):  # no case below names it, and it is no policy event
            self._forget_old_evictions(event.ts)
            return
        self.changed = True
        s = self.s
        # The most frequent events first; policy events (which no case names) last.
        match event:
            case QuotaReserved():
                flavor = event.flavor or ANY
                s.reserved[event.job_id] = (event.queue, flavor, event.gpu_milli, event.over_budget)
                self.book.add(event.queue, flavor, event.gpu_milli, event.over_budget)
                self._unwait(event.job_id)
            case QuotaReleased():
                held_quota = s.reserved.pop(event.job_id, None)
                if held_quota is not None:
                    self.book.add(held_quota[0], held_quota[1], -held_quota[2], held_quota[3])
            case JobPlaced():
                self._unwait(event.job_id)
                self._placed += 1
                spec = s.specs.get(event.job_id)
                _, flavor, _, over_budget = s.reserved.get(event.job_id, ("", ANY, 0, False))
                if spec is None:
                    # Placed after it was cancelled: it holds GPUs until its executor reports it gone.
                    s.cancelled[event.job_id] = None
                    run = Running(job_id=event.job_id, queue="", priority=0, preemptible=False, demand=0,
                                  started=event.ts, placements=event.placements, placed_order=self._placed)
                else:
                    run = Running(job_id=event.job_id, queue=spec.queue, priority=self.policy.priority_of(spec),
                                  preemptible=self.policy.preemptible(spec) or over_budget,
                                  demand=demand_milli(spec), started=event.ts, placements=event.placements,
                                  flavor=flavor, over_budget=over_budget,
                                  min_runtime_s=self.policy.min_runtime_s(spec), placed_order=self._placed,
                                  ends_at=None if spec.duration_s is None else event.ts + spec.duration_s,
                                  checkpoints_on_stop=spec.checkpoint_interval_s is not None)
                held = s.running.get(event.job_id)
                if held is not None:
                    self._unindex_running(held)
                s.running[event.job_id] = run
                s.by_queue.setdefault(run.queue, {})[run.job_id] = run
                prios = s.running_priorities.setdefault(run.queue, {})
                prios[run.priority] = prios.get(run.priority, 0) + 1
                self.cluster.allocate(event.placements)
            case JobSubmitted():
                if event.job_id in s.waiting:  # its spec changes under the indexes
                    grace = event.job_id in s.grace_of
                    self._unindex(event.job_id)
                    s.specs[event.job_id] = event.spec
                    self._index(event.job_id, grace)
                else:
                    s.specs[event.job_id] = event.spec
            case JobFinished() | JobFailed() | JobEvicted():
                again = isinstance(event, JobEvicted) or (
                    isinstance(event, JobFailed)
                    and self.retries.on_failed(event, s.specs.get(event.job_id), self.policy) is not None)
                self._gone(event.job_id, final=not again or event.job_id in s.cancelled)
            case PlacementDeferred():
                self._wait(event.job_id, PLACEMENT, event.ts)
            case QuotaDeferred():
                if event.code in WAITING_FOR_QUOTA:
                    self._wait(event.job_id, event.code, event.ts)
                else:
                    self._unwait(event.job_id)
            case JobCheckpointed() if event.job_id in s.running:
                s.running[event.job_id].last_checkpoint = event.ts
            case PreemptionDecided():
                s.in_flight[event.preemptor_id] = [v.job_id for v in event.victims]
                for v in event.victims:
                    s.victim_of[v.job_id] = event.preemptor_id
                    s.preempted_by.setdefault(v.job_id, {})[event.preemptor_id] = None
                    s.evicted.setdefault(v.queue, []).append((event.ts, v.gpu_milli))
            case JobCancelled():
                self._unwait(event.job_id)
                if event.job_id in s.running:
                    s.cancelled[event.job_id] = None  # still holds its GPUs until its executor stops it
                else:
                    self._gone(event.job_id, final=True)
            case NodeRegistered():
                self.cluster.register(event.node)
            case NodeLost():
                self.cluster.set_online(event.node, False)
            case NodeCordoned() | NodeUncordoned():
                self.cluster.cordon(event.node, isinstance(event, NodeCordoned))
            case GpuHealthChanged():
                self.cluster.set_gpu_health(event.node, event.index, event.healthy)
            case _ if self.policy.apply(event):
                if isinstance(event, PriorityClassesChanged):
                    self._rerank()

    def _wait(self, job_id: str, code: str, now: float) -> None:
        s = self.s
        spec = s.specs.get(job_id)
        if spec is None:
            return  # a deferral logged after the job ended (decisions are published after later inputs)
        held = s.waiting.get(job_id)
        if held is not None:
            self._unwait(job_id)
        since = held.since if held is not None else now
        queue, priority = spec.queue, self.policy.priority_of(spec)
        s.waiting[job_id] = Waiting(code, since, False, queue, priority)
        # _index, inline: the head and (for quota) grace indexes, then the waiting priorities.
        head = (-priority, job_id)
        s.head_of[job_id] = (queue, head)
        bisect.insort(s.heads.setdefault(queue, []), head)
        if code != PLACEMENT:
            entry = (since, job_id)
            s.grace_of[job_id] = (queue, entry)
            bisect.insort(s.grace.setdefault(queue, []), entry)
            prios = s.waiting_priorities.setdefault(queue, {})
            prios[priority] = prios.get(priority, 0) + 1

    def _index(self, job_id: str, grace: bool) -> None:
        """Enter a waiting job into the indexes (`grace`: among those whose reclaim grace is unchecked)."""
        s = self.s
        spec = s.specs[job_id]
        head = (spec.queue, (-self.policy.priority_of(spec), job_id))
        s.head_of[job_id] = head
        bisect.insort(s.heads.setdefault(head[0], []), head[1])
        if grace:
            entry = (spec.queue, (s.waiting[job_id].since, job_id))
            s.grace_of[job_id] = entry
            bisect.insort(s.grace.setdefault(entry[0], []), entry[1])

    def _unindex(self, job_id: str) -> None:
        s = self.s
        head = s.head_of.pop(job_id, None)
        if head is not None:
            keys = s.heads[head[0]]
            keys.pop(bisect.bisect_left(keys, head[1]))
            if not keys:
                del s.heads[head[0]]
        self._ungrace(job_id)

    def _ungrace(self, job_id: str) -> None:
        s = self.s
        entry = s.grace_of.pop(job_id, None)
        if entry is not None:
            keys = s.grace[entry[0]]
            keys.pop(bisect.bisect_left(keys, entry[1]))
            if not keys:
                del s.grace[entry[0]]

    def _rerank(self) -> None:
        """Priority classes changed: running and waiting jobs take their class's new value."""
        s = self.s
        s.running_priorities = {}
        for run in s.running.values():
            spec = s.specs.get(run.job_id)
            if spec is not None:
                run.priority = self.policy.priority_of(spec)
                run.preemptible = self.policy.preemptible(spec) or run.over_budget
            prios = s.running_priorities.setdefault(run.queue, {})
            prios[run.priority] = prios.get(run.priority, 0) + 1
        s.waiting_priorities = {}
        s.heads, s.head_of = {}, {}
        for job_id in list(s.waiting):
            w = s.waiting[job_id]
            w.priority = self.policy.priority_of(s.specs[job_id]) if job_id in s.specs else w.priority
            if w.code != PLACEMENT:
                prios = s.waiting_priorities.setdefault(w.queue, {})
                prios[w.priority] = prios.get(w.priority, 0) + 1
            if job_id in s.specs:
                spec = s.specs[job_id]
                head = (spec.queue, (-self.policy.priority_of(spec), job_id))
                s.head_of[job_id] = head
                s.heads.setdefault(head[0], []).append(head[1])
        for keys in s.heads.values():
            keys.sort()

    def _unwait(self, job_id: str) -> None:
        s = self.s
        held = s.waiting.pop(job_id, None)
        if held is None:
            return
        self._unindex(job_id)
        if held.code != PLACEMENT:
            prios = s.waiting_priorities[held.queue]
            prios[held.priority] -= 1
            if not prios[held.priority]:
                del prios[held.priority]

    def _behind_higher_priority(self, job_id: str, spec: JobSpec) -> bool:
        """Does a job of higher priority of the same queue wait for quota too? Freed quota goes to it first,
        so evicting for this one would serve the other."""
        prios = self.s.waiting_priorities.get(spec.queue, {})
        return bool(prios) and max(prios) > self.policy.priority_of(spec)

    def _gone(self, job_id: str, final: bool) -> None:
        s = self.s
        self._unwait(job_id)
        run = s.running.pop(job_id, None)
        if run is not None:
            self._unindex_running(run)
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
            s.preempted_by.pop(job_id, None)

    def _unindex_running(self, run: Running) -> None:
        jobs = self.s.by_queue[run.queue]
        del jobs[run.job_id]
        if not jobs:
            del self.s.by_queue[run.queue]
        prios = self.s.running_priorities[run.queue]
        prios[run.priority] -= 1
        if not prios[run.priority]:
            del prios[run.priority]
            if not prios:
                del self.s.running_priorities[run.queue]

    def reacts_to(self) -> tuple[type[EventBase], ...]:
        """The inputs `react` may decide something about; to any other it answers [] and changes nothing."""
        return (QuotaDeferred, PlacementDeferred, ClockTick)

    def react(self, trigger: Trigger) -> list[EventBase]:
        event = trigger.event
        if isinstance(event, _DEFERRALS):
            if not self._may_evict_for(event.job_id):
                return []  # the common answer: no decision (and no need to prepare any)
            out = Decisions(SERVICE, trigger, self.evolve, self.chain)
            self._consider(event.job_id, event.ts, out)
        elif isinstance(event, ClockTick):
            out = Decisions(SERVICE, trigger, self.evolve, self.chain)
            # Circumstances change without a new deferral (a victim ended on its own, a job was placed
            # elsewhere, a reclaim grace ran out): on a tick, the first waiting job of each queue, and every
            # job whose reclaim grace just ended, is considered again.
            due = self._grace_ends(event.ts)
            if self.changed or due:
                self.changed = False
                for job_id in dict.fromkeys(self._heads_of_queues() + due):
                    self._consider(job_id, event.ts, out)
        else:
            return []  # nothing else is reacted to
        return out.out

    def _grace_ends(self, now: float) -> list[str]:
        """The waiting jobs whose reclaim grace has run out since they were last considered (so reclaim may
        start for them), in id order. Each job counts once: it is considered on this tick, and marked."""
        s = self.s
        due = []
        for name, keys in s.grace.items():  # per queue, the unchecked jobs by how long they have waited
            queue = self.policy.queues.get(name)
            if queue is None or queue.reclaim_after_s <= 0:
                continue
            for since, job_id in keys:
                if since + queue.reclaim_after_s > now:
                    break
                due.append(job_id)
        due.sort()
        for job_id in due:
            s.waiting[job_id].grace_checked = True
            self._ungrace(job_id)
        return due

    def _heads_of_queues(self) -> list[str]:
        # The first waiting job per queue, not already waiting for its victims to leave: the index keeps each
        # queue's waiting jobs in (-priority, id) order.
        heads = []
        for queue in sorted(self.s.heads):
            for _, job_id in self.s.heads[queue]:
                if job_id not in self.s.in_flight:
                    heads.append(job_id)
                    break
        return heads

    def _eligible(self, r: Running, now: float, preemptor_id: str) -> bool:
        return (r.preemptible and r.job_id not in self.s.victim_of and r.job_id not in self.s.cancelled
                and now - r.started >= r.min_runtime_s
                and (r.ends_at is None or r.ends_at - now > self.policy.settings.preempt_min_remaining_s)
                and r.job_id not in self.s.preempted_by.get(preemptor_id, {})  # never one's preemptor back
                and preemptor_id not in self.s.preempted_by.get(r.job_id, {}))  # nor the same victim twice

    def _forget_old_evictions(self, now: float) -> None:
        """Evictions older than their queue's budget window no longer count."""
        for queue in list(self.s.evicted):
            spec = self.policy.queues.get(queue)
            window = spec.eviction_window_s if spec is not None else 0.0
            entries = self.s.evicted[queue]
            if entries and now - min(entries)[0] < window:
                continue  # not even the oldest has aged out
            kept = [(t, m) for t, m in entries if now - t < window]
            if kept:
                self.s.evicted[queue] = kept
            else:
                del self.s.evicted[queue]

    def budget_left(self, queue: str, now: float) -> int | None:
        """GPUs (thousandths) the queue may still lose to eviction in its window; None: no budget."""
        spec = self.policy.queues.get(queue)
        if spec is None or spec.eviction_budget_gpus is None:
            return None
        recent = sum(m for t, m in self.s.evicted.get(queue, []) if now - t < spec.eviction_window_s)
        return spec.eviction_budget_gpus * 1000 - recent

    def candidates(self, preemptor: JobSpec, preemptor_id: str, now: float) -> list[Running]:
        """Jobs of the preemptor's queue with a lower priority, in victim order."""
        prio = self.policy.priority_of(preemptor)
        cands = [r for r in self.s.by_queue.get(preemptor.queue, {}).values()
                 if r.priority < prio and r.job_id != preemptor_id and self._eligible(r, now, preemptor_id)]
        cands.sort(key=lambda r: r.victim_key(now))
        return cands

    def borrowers(self, preemptor: JobSpec, flavor: str, now: float, preemptor_id: str = "") -> list[Running]:
        """Jobs of other queues of the preemptor's cohort that hold borrowed quota of `flavor` (their queue is
        above its nominal, or they were admitted over budget), in victim order."""
        cohort = self.book.cohort.get(preemptor.queue, "")
        if not cohort:
            return []
        peers = {q for q in self.book.members[cohort] if q != preemptor.queue}
        borrowing = {q for q in peers if self.book.borrowed(q, flavor) > 0}
        cands = [r for q in peers for r in self.s.by_queue.get(q, {}).values()
                 if r.flavor == flavor and (q in borrowing or r.over_budget) and self._eligible(r, now, preemptor_id)]
        cands.sort(key=lambda r: r.victim_key(now))
        return cands

    def _may_evict_for(self, job_id: str) -> bool:
        """Could an eviction serve the job now? Only a waiting job, not already waiting for its victims to
        leave, nor running; and only with candidates: without any there is nobody to evict (Simulation.choose
        would answer []), so no simulation is set up. No job of the queue running at a lower priority: no
        candidate within the queue; no cohort either (or waiting for placement): no borrower to reclaim from."""
        s = self.s
        spec = s.specs.get(job_id)
        waiting = s.waiting.get(job_id)
        if spec is None or waiting is None or job_id in s.in_flight or job_id in s.running:
            return False
        running, prio = s.running_priorities.get(spec.queue), self.policy.priority_of(spec)
        if running is not None and min(running, default=prio) < prio:
            return True
        return waiting.code != PLACEMENT and bool(self.book.cohort.get(spec.queue, ""))

    def _consider(self, job_id: str, now: float, out: Decisions) -> None:
        if not self._may_evict_for(job_id):
            return
        s = self.s
        spec, waiting = s.specs[job_id], s.waiting[job_id]
        # The simulation is only set up once some candidate needs it.
        demand = demand_milli(spec)
        if waiting.code == PLACEMENT:
            held = s.reserved.get(job_id)
            flavor = held[1] if held is not None else ANY
            cands = self.candidates(spec, job_id, now)
            if cands:
                sim = self._simulation(spec, now)
                self._decide(job_id, sim.choose(cands, lambda: sim.fits(flavor)), out)
            return
        if self._behind_higher_priority(job_id, spec):
            return
        flavors = self.book.flavors_for(spec.queue, spec) or [ANY]
        queue = self.policy.queues.get(spec.queue)
        grace = queue.reclaim_after_s if queue is not None else 0.0
        sims: list[Simulation] = []  # the one simulation, once made

        def simulation() -> Simulation:
            if not sims:
                sims.append(self._simulation(spec, now))
            return sims[0]

        for flavor in flavors:
            lim = self.book.limits.get(spec.queue, {}).get(flavor)
            if lim is None or demand > lim.nominal or now < waiting.since + grace:
                continue
            # Reclaim: borrowers' jobs first, then (if the queue itself is above nominal) its own
            # lower-priority jobs of this flavor; minimisation drops whichever turn out not to be needed.
            others = self.borrowers(spec, flavor, now, job_id)
            if not others:
                continue
            own = [r for r in self.candidates(spec, job_id, now) if r.flavor == flavor]

            def reclaimed(flavor: str = flavor, nominal: int = lim.nominal) -> bool:
                return (self.book.usage(spec.queue, flavor) + demand <= nominal
                        and self.book.room(spec.queue, flavor) >= demand and simulation().fits(flavor))

            victims = simulation().choose(others + own, reclaimed, keep_borrowing=True)
            if victims:
                self._decide(job_id, victims, out)
                return
        def within_queue() -> bool:
            return any(self.book.room(spec.queue, f) >= demand and simulation().fits(f) for f in flavors)

        cands = self.candidates(spec, job_id, now)
        if cands:
            self._decide(job_id, simulation().choose(cands, within_queue), out)

    def _simulation(self, spec: JobSpec, now: float) -> Simulation:
        s = self.s
        # Cancelled jobs on their way out leave room nobody has claimed; victims already leaving for another
        # preemptor do not: that room is its.
        leaving = [s.running[j] for j in sorted(s.cancelled) if j in s.running and j not in s.victim_of]
        return Simulation(self, spec, leaving, now)

    def _decide(self, job_id: str, victims: list[Running], out: Decisions) -> None:
        if not victims:
            return
        spec = self.s.specs[job_id]
        now = out.trigger.event.ts
        if sum(v.demand for v in victims) > demand_milli(spec) + self.policy.settings.preemption_slack_gpus * 1000:
            return  # more than the need plus slack: waiting beats such collateral damage
        code = RECLAIM if any(v.queue != spec.queue for v in victims) else WITHIN_QUEUE_PRIORITY
        out.emit(PreemptionDecided, correlation_id=job_id, preemptor_id=job_id, code=code,
                 victims=tuple(Victim(job_id=v.job_id, queue=v.queue, priority=v.priority, gpu_milli=v.demand,
                                      reason=RECLAIM if v.queue != spec.queue else WITHIN_QUEUE_PRIORITY,
                                      lost_gpu_seconds=round(v.lost(now) / 1000, 3), started_at=v.started)
                               for v in victims))

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"running": sorted(self.s.running), "in_flight": self.s.in_flight,
                                    "used": {f"{q}/{f}": u for (q, f), u in sorted(self.book.used.items()) if u},
                                    "waiting": {j: w.code for j, w in sorted(self.s.waiting.items())}})


class Simulation:
    """Evictions tried on the decider's own quota book and cluster, always undone before returning."""

    def __init__(self, decider: PreemptionDecider, spec: JobSpec, leaving: list[Running], now: float = 0.0) -> None:
        self.d = decider
        self.spec = spec
        self.leaving = leaving  # on their way out already: their GPUs count as free
        self.applied: list[Running] = []
        self.now = now

    def _within_budget(self, c: Running) -> bool:
        """Would taking `c` too keep its queue within its blast-radius budget?"""
        left = self.d.budget_left(c.queue, self.now)
        return left is None or c.demand + sum(v.demand for v in self.applied if v.queue == c.queue) <= left

    def fits(self, flavor: str) -> bool:
        spec = self.spec if flavor == ANY else msgspec.structs.replace(self.spec, gpu_models=(flavor,))
        gone = self.leaving + self.applied
        for v in gone:
            self.d.cluster.release(v.placements)
        try:
            return fits(self.d.cluster, spec)
        finally:
            for v in gone:
                self.d.cluster.allocate(v.placements)

    def _apply(self, v: Running, sign: int, at: int | None = None) -> None:
        self.d.book.add(v.queue, v.flavor, -sign * v.demand, v.over_budget)
        if sign < 0:
            self.applied.remove(v)
        else:
            self.applied.insert(len(self.applied) if at is None else at, v)

    def choose(self, candidates: list[Running], enough: Callable[[], bool], keep_borrowing: bool = False
               ) -> list[Running]:
        """Greedy in candidate order until `enough`, then drop each victim (last added first) that is not
        needed. [] when nothing needs to go, or when even every candidate is not enough.

        With `keep_borrowing`, a job of another queue is taken only while that queue is still above nominal.
        When that greedy pass finds no answer (quota comes back but no node has room, the cheap victims being
        spread out), a second pass takes the candidates node by node, cheapest node first, and may take a
        borrowing queue below its nominal where placement needs a whole node; minimisation then gives back
        whatever turned out not to be needed."""
        try:
            if enough():
                return []
            borrowing = {c.queue for c in candidates if c.queue != self.spec.queue
                         and (c.over_budget or self.d.book.borrowed(c.queue, c.flavor) > 0)}
            found = self._greedy(candidates, enough, keep_borrowing)
            if found is None and keep_borrowing:
                by_node = self._node_by_node(candidates)
                found = self._greedy([c for c in by_node if c.queue == self.spec.queue or c.queue in borrowing],
                                     enough, keep_borrowing=False)
            if found is None:
                return []
            for v in reversed(list(self.applied)):
                at = self.applied.index(v)
                self._apply(v, -1)
                if self.applied and enough():
                    continue
                self._apply(v, +1, at)
            return list(self.applied)
        finally:
            for v in list(self.applied):
                self._apply(v, -1)

    def _greedy(self, candidates: list[Running], enough: Callable[[], bool], keep_borrowing: bool
                ) -> list[Running] | None:
        """Apply candidates in order until `enough`; on failure undo them all and return None."""
        for c in candidates:
            if keep_borrowing and c.queue != self.spec.queue and not c.over_budget \
                    and self.d.book.borrowed(c.queue, c.flavor) <= 0:
                continue
            if not self._within_budget(c):
                continue
            self._apply(c, +1)
            if enough():
                return self.applied
        for v in list(self.applied):
            self._apply(v, -1)
        return None

    @staticmethod
    def _node_by_node(candidates: list[Running]) -> list[Running]:
        """The candidates grouped by the node holding the most of them (ties: the least lost work), each
        group in the original order; a job spanning nodes goes with its first."""
        groups: dict[str, list[Running]] = {}
        for c in candidates:
            groups.setdefault(c.placements[0].node if c.placements else "", []).append(c)
        rank = {node: i for i, node in enumerate(groups)}
        order = sorted(groups, key=lambda n: (-sum(c.demand for c in groups[n]), rank[n]))
        return [c for node in order for c in groups[node]]
