"""Preemption: whom to evict so that a waiting job can run.

Triggered when quota or placement defers a job for a reason eviction can cure, and re-considered on clock
ticks. Two kinds of victims:
  - reclaim (libs/core/preemption/reclaim.py): a queue under its nominal quota takes back quota its cohort lent to
    borrowers, once the queue's reclaim grace has passed, and a job holding quota within its nominal takes
    back the GPUs borrowers of the cohort hold (of any flavor) when it finds none. Only what they borrow: a
    reclaim never takes a queue below its nominal quota.
  - within the queue: jobs of lower priority in the preemptor's own queue.
Jobs of non-preemptible classes, jobs that have not yet run their class's minimum runtime, and jobs expected
to end within the settings' preempt_min_remaining_s anyway are never victims (quota lets a job that cannot be
preempted use only its queue's nominal quota, so no lender waits for one), except that a reclaim may take a
borrower whatever its class: one that borrows though it cannot be preempted became so through a policy change
after it started (its class made non-preemptible, its queue's nominal quota lowered under it). A queue's
blast-radius budget (`eviction_budget_gpus` per `eviction_window_s`) caps the evictions for priority within
that queue; a reclaim of lent quota is neither limited by it nor counted against it. The victims are a minimal set,
the least harm first (victim_sets.py), that a simulation (simulation.py) says makes
room by quota's and placement's own rules, counting the evictions already decided as done. No fit in
simulation, no eviction.

A clock tick looks again (circumstances change without a new deferral): at the first waiting job of each
queue when anything changed, at every job whose reclaim grace just ended, and, when a protection ran out
with time (a running job's minimum runtime, a queue's eviction budget growing back), at every waiting job
that could evict there. So a queue inside its nominal quota waits for borrowers no longer than its reclaim
grace plus the longest minimum runtime that protects them (and the tick after).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import msgspec

from contracts import (
    LEAST_ATTAINED_SERVICE,
    RECLAIM,
    WITHIN_QUEUE_PRIORITY,
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
    SchedulingSettingsChanged,
    Victim,
)
from libs.core.cluster.job_fit import placement_shape
from libs.core.cluster.model import Cluster
from libs.core.kernel.attained_service import threshold_milli_s
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.policy import PolicyBook, declared_runtime, demand_milli
from libs.core.kernel.quota_math import ANY, QuotaBook, reservation_model
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.kernel.starvation import CAPACITY_HELD
from libs.core.kernel.wait_reasons import BUDGET_WAITS, RETRY_BACKOFF, USER_LIMIT, WAITING_FOR_QUOTA
from libs.core.preemption.reclaim import borrowers, placement_victims, reclaim_victims
from libs.core.preemption.simulation import Simulation, smallest_waiting
from libs.core.preemption.state import OVERRUN_S, PLACEMENT, PreemptionState, Running, Waiting

__all__ = ["PLACEMENT", "RECLAIM", "SERVICE", "WITHIN_QUEUE_PRIORITY", "PreemptionDecider", "PreemptionState",
           "Running", "Simulation", "Waiting"]

SERVICE = "preemption"
# Quota deferrals of a job held by its own circumstances, not by others' use of quota or GPUs: its reclaim
# grace starts again once it waits for quota again.
HELD_BY_ITS_OWN = BUDGET_WAITS | {USER_LIMIT, RETRY_BACKOFF}
_DEFERRALS = (QuotaDeferred, PlacementDeferred)


class PreemptionDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
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
            self._quota_deferred(event)
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
                s.reserved_at[event.job_id] = event.ts
                s.capacity_held.pop(event.job_id, None)
                self.book.add(event.queue, flavor, event.gpu_milli, event.over_budget)
                s.unwait(event.job_id)
                s.ended.pop(event.job_id, None)
            case QuotaReleased():
                held_quota = s.reserved.pop(event.job_id, None)
                s.reserved_at.pop(event.job_id, None)
                s.capacity_held.pop(event.job_id, None)
                s.ended.pop(event.job_id, None)
                if held_quota is not None:
                    self.book.add(held_quota[0], held_quota[1], -held_quota[2], held_quota[3])
            case JobPlaced():
                s.unwait(event.job_id)
                s.pending_since.pop(event.job_id, None)
                self._placed += 1
                self._recharge_placed(event)
                run = self._run_of(event)
                s.run(run)
                s.attained.started(run.job_id, run.started, run.demand)
                self._watch_service(run)
                self.cluster.allocate(event.placements)
            case JobSubmitted():
                waiting = s.waiting.get(event.job_id)
                if waiting is not None:  # its spec changes under the indexes
                    grace = event.job_id in s.grace_of
                    s.unindex(event.job_id)
                    s.specs[event.job_id] = event.spec
                    s.index(event.job_id, event.spec.queue, self.policy.priority_of(event.spec), grace)
                else:
                    s.specs[event.job_id] = event.spec
            case JobFinished() | JobFailed() | JobEvicted():
                again = self.retries.runs_again(event, s.specs.get(event.job_id), self.policy)
                s.attained.stopped(event.job_id, event.ts)
                self._gone(event.job_id, final=not again or event.job_id in s.cancelled)
            case PlacementDeferred():
                self._wait(event.job_id, PLACEMENT, event.ts)
                if event.code == CAPACITY_HELD:
                    s.capacity_held[event.job_id] = None
                else:
                    s.capacity_held.pop(event.job_id, None)
            case QuotaDeferred():
                self._quota_deferred(event)
            case JobCheckpointed() if event.job_id in s.running:
                s.running[event.job_id].last_checkpoint = event.ts
            case PreemptionDecided():
                s.in_flight[event.preemptor_id] = [v.job_id for v in event.victims]
                for v in event.victims:
                    s.victim_of[v.job_id] = event.preemptor_id
                    s.preempted_by.setdefault(v.job_id, {})[event.preemptor_id] = None
                    if v.reason != RECLAIM:  # a reclaim of lent quota is outside the budget (Simulation.choose)
                        s.evicted.setdefault(v.queue, []).append((event.ts, v.gpu_milli))
            case JobCancelled():
                s.unwait(event.job_id)
                if event.job_id in s.running:
                    s.cancelled[event.job_id] = None  # still holds its GPUs until its executor stops it
                else:
                    self._gone(event.job_id, final=True)
            case NodeRegistered() | NodeLost() | NodeCordoned() | NodeUncordoned() | GpuHealthChanged():
                self.cluster.apply_node_event(event)
            case _ if self.policy.apply(event):
                if isinstance(event, PriorityClassesChanged):
                    s.rerank(self.policy)
                elif isinstance(event, QueuePolicyChanged):
                    self._recharge(event.queue.name)
                    for run in self.s.by_queue.get(event.queue.name, {}).values():
                        self._watch_service(run)  # (ordering by least attained service, maybe from now on)

    def _recharge(self, queue: str) -> None:
        """The queue's reservations follow its current flavors, as quota's do (QuotaBook.recharge), and so do
        its running jobs' flavors: a reclaim finds borrowed quota where quota charges it."""
        s = self.s
        for job_id, (held_queue, flavor, milli, over_budget) in list(s.reserved.items()):
            if held_queue != queue:
                continue
            run = s.running.get(job_id)
            placed = next((r.model for r in run.placements if r.model), "") if run is not None else ""
            target = self.book.recharge(queue, flavor, reservation_model(flavor, placed, s.specs.get(job_id)),
                                        milli, over_budget)
            if target != flavor:
                s.reserved[job_id] = (held_queue, target, milli, over_budget)
                if run is not None:
                    run.flavor = target

    def _recharge_placed(self, event: JobPlaced) -> None:
        """Its model now known, a reservation charged to a flavor its queue no longer has follows it (as quota's
        does, QuotaBook.recharge_placed): its run is then indexed under the flavor a reclaim looks in."""
        held = self.s.reserved.get(event.job_id)
        if held is None:
            return
        queue, flavor, milli, over_budget = held
        model = next((r.model for r in event.placements if r.model), "")
        target = self.book.recharge_placed(queue, flavor, model, milli, over_budget)
        if target != flavor:
            self.s.reserved[event.job_id] = (queue, target, milli, over_budget)

    def _run_of(self, event: JobPlaced) -> Running:
        s = self.s
        spec = s.specs.get(event.job_id)
        if spec is None:
            # Placed after it was cancelled: it holds GPUs until its executor reports it gone.
            s.cancelled[event.job_id] = None
            return Running(job_id=event.job_id, queue="", priority=0, preemptible=False, demand=0,
                           started=event.ts, placements=event.placements, placed_order=self._placed)
        _, flavor, _, over_budget = s.reserved.get(event.job_id, ("", ANY, 0, False))
        return Running(job_id=event.job_id, queue=spec.queue, priority=self.policy.priority_of(spec),
                       preemptible=self.policy.preemptible(spec) or over_budget,
                       demand=demand_milli(spec), started=event.ts, placements=event.placements,
                       flavor=flavor, over_budget=over_budget,
                       min_runtime_s=self.policy.min_runtime_s(spec), placed_order=self._placed,
                       ends_at=None if (runtime := declared_runtime(spec)) is None else event.ts + runtime,
                       checkpoints_on_stop=spec.checkpoint_interval_s is not None)

    def _quota_deferred(self, event: QuotaDeferred) -> None:
        if event.code in WAITING_FOR_QUOTA:
            self._wait(event.job_id, event.code, event.ts)
            return
        self.s.unwait(event.job_id)
        if event.code in HELD_BY_ITS_OWN:  # its user's limit, a budget, a failure's backoff: no reclaim could
            self.s.pending_since.pop(event.job_id, None)  # serve it, so no reclaim grace runs meanwhile

    def _wait(self, job_id: str, code: str, now: float) -> None:
        spec = self.s.specs.get(job_id)
        if spec is None:
            return  # a deferral logged after the job ended (decisions are published after later inputs)
        self.s.pending_since.setdefault(job_id, now)
        self.s.wait(job_id, spec.queue, self.policy.priority_of(spec), code, now)

    def _behind_higher_priority(self, job_id: str, spec: JobSpec) -> bool:
        """Does a job of higher priority of the same queue wait for quota too? Freed quota goes to it first,
        so evicting for this one would serve the other."""
        prios = self.s.waiting_priorities.get(spec.queue, {})
        return bool(prios) and max(prios) > self.policy.priority_of(spec)

    def _gone(self, job_id: str, final: bool) -> None:
        s = self.s
        s.unwait(job_id)
        s.capacity_held.pop(job_id, None)
        s.pending_since.pop(job_id, None)
        run = s.running.pop(job_id, None)
        if run is not None:
            s.unindex_running(run)
            self.cluster.release(run.placements)
            if job_id in s.reserved:
                s.ended[job_id] = None
        preemptor = s.victim_of.pop(job_id, None)
        if preemptor is not None:
            left = [v for v in s.in_flight.get(preemptor, []) if v != job_id]
            if left:
                s.in_flight[preemptor] = left
            else:
                s.in_flight.pop(preemptor, None)
        if final:
            s.attained.forget(job_id)
            s.specs.pop(job_id, None)
            s.in_flight.pop(job_id, None)
            s.cancelled.pop(job_id, None)
            s.preempted_by.pop(job_id, None)

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
            due = self._grace_ends(event.ts)
            unprotected = self.s.unprotected(event.ts)
            if self.changed or due or unprotected:
                self.changed = False
                jobs = self._heads_of_queues() + self._placement_waiters() + due + self._could_evict_in(unprotected)
                # Waiting jobs alike to the deciders (alike_key) find victims alike: once one found none, with
                # nothing decided since, the others would not either (a queue of many alike jobs waits often).
                came_to_nothing: set[tuple[object, ...]] = set()
                preemptors = {p for ps in self.s.preempted_by.values() for p in ps}
                for job_id in dict.fromkeys(jobs):
                    key = self._alike_key(job_id, event.ts, preemptors)
                    if key is not None and key in came_to_nothing:
                        continue
                    decided = len(out.out)
                    self._consider(job_id, event.ts, out)
                    if len(out.out) != decided:
                        came_to_nothing.clear()
                    elif key is not None:
                        came_to_nothing.add(key)
        else:
            return []  # nothing else is reacted to
        return out.out

    def _alike_key(self, job_id: str, now: float, preemptors: set[str]) -> tuple[object, ...] | None:
        """What `_consider` reads of a job waiting for quota besides its id: its queue, class, request (as
        placement sees it), whether its reclaim grace is over and whether it is below its queue's LAS threshold.
        None for one whose id matters too: a preemptor or a victim of earlier evictions (never each other's
        victims again), one waiting for placement (its own reservation and timeout), one not waiting."""
        s = self.s
        spec, waiting = s.specs.get(job_id), s.waiting.get(job_id)
        if spec is None or waiting is None or waiting.code == PLACEMENT or job_id in preemptors or (
                job_id in s.preempted_by):
            return None
        queue = self.policy.queues.get(spec.queue)
        grace_over = now >= waiting.since + (queue.reclaim_after_s if queue is not None else 0.0)
        return (spec.queue, placement_shape(spec, ""), grace_over, self._las_level(spec.queue, job_id, now) is None)

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
            s.ungrace(job_id)
        return due

    def _heads_of_queues(self) -> list[str]:
        """The first waiting job per queue (the index keeps each queue's waiting jobs in (-priority, id)
        order), not already waiting for its victims to leave; where that one can never reclaim (it waits for
        placement, or is above its queue's nominal quota in every flavor), also the first of its priority
        that can: it may reclaim while the first waits."""
        heads = []
        for queue in sorted(self.s.heads):
            first = None
            for key in self.s.heads[queue]:
                if key[1] in self.s.in_flight:
                    continue
                if first is None:
                    first = key[0]
                    heads.append(key[1])
                    if not self.book.cohort.get(queue, "") or self._may_reclaim(key[1]):
                        break
                elif key[0] != first:
                    break
                elif self._may_reclaim(key[1]):
                    heads.append(key[1])
                    break
        return heads

    def _placement_waiters(self) -> list[str]:
        """The jobs holding quota that wait for a place (few: placement places most at once), in id order: any
        of them may reclaim GPUs from borrowers, wherever it stands in its queue (reclaim.placement_victims)."""
        return sorted(j for j in self.s.placing if j not in self.s.in_flight)

    def _may_reclaim(self, job_id: str) -> bool:
        """Does the waiting job wait for quota and fit its queue's nominal quota of some flavor it may use?"""
        spec, waiting = self.s.specs.get(job_id), self.s.waiting.get(job_id)
        if spec is None or waiting is None or waiting.code == PLACEMENT:
            return False
        demand, limits = demand_milli(spec), self.book.limits.get(spec.queue, {})
        return any(demand <= limits[f].nominal for f in self.book.flavors_for(spec.queue, spec))

    def _could_evict_in(self, queues: list[str]) -> list[str]:
        """Every waiting job that could evict jobs of `queues`: theirs (within the queue) and their cohorts'
        (reclaim), by queue, then in each queue's (-priority, id) order."""
        targets: dict[str, None] = {}
        for queue in queues:
            targets[queue] = None
            targets.update(dict.fromkeys(self.book.members.get(self.book.cohort.get(queue, ""), ())))
        return [job_id for queue in sorted(targets) for _, job_id in self.s.heads.get(queue, ())
                if job_id not in self.s.in_flight]

    def eligible(self, r: Running, now: float, preemptor_id: str, reclaim: bool = False) -> bool:
        """May `r` be evicted for the preemptor now? A reclaim (`reclaim`) may take a borrower whatever its class:
        quota never lets a job that cannot be preempted borrow, so one that borrows became a borrower, or lost
        its preemptibility, through a policy change after it started, and the lender is owed that quota back."""
        return ((r.preemptible or reclaim) and r.job_id not in self.s.victim_of and r.job_id not in self.s.cancelled
                and now - r.started >= r.min_runtime_s
                and not self._about_to_end(r, now)
                and r.job_id not in self.s.preempted_by.get(preemptor_id, {})  # never one's preemptor back
                and preemptor_id not in self.s.preempted_by.get(r.job_id, {}))  # nor the same victim twice

    def _about_to_end(self, r: Running, now: float) -> bool:
        """Will the job end within preempt_min_remaining_s by its declared runtime? One still running OVERRUN_S
        past its declared end overran its estimate: nobody knows when it ends (a tick then looks again:
        PreemptionState.unprotected)."""
        return r.ends_at is not None and -OVERRUN_S < r.ends_at - now <= self.policy.settings.preempt_min_remaining_s

    def _forget_old_evictions(self, now: float) -> None:
        """Evictions older than their queue's budget window no longer count: where a budget caps them, the
        queue may lose more again (a tick looks for victims there)."""
        for queue in list(self.s.evicted):
            spec = self.policy.queues.get(queue)
            window = spec.eviction_window_s if spec is not None else 0.0
            entries = self.s.evicted[queue]
            if entries and now - min(entries)[0] < window:
                continue  # not even the oldest has aged out
            if spec is not None and spec.eviction_budget_gpus is not None:
                self.s.budget_freed[queue] = None
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
        """Jobs of the preemptor's queue with a lower priority, in victim order; in a queue of least attained
        service (kernel/attained_service.py), also those of its priority above the threshold while it is not."""
        prio = self.policy.priority_of(preemptor)
        las = self._las_level(preemptor.queue, preemptor_id, now)
        attained = self.s.attained
        cands = [r for r in self.s.by_queue.get(preemptor.queue, {}).values()
                 if (r.priority < prio or (las is not None and r.priority == prio and attained.of(r.job_id, now) > las))
                 and r.job_id != preemptor_id and self.eligible(r, now, preemptor_id)]
        cands.sort(key=lambda r: r.victim_key(now))
        return cands

    def _las_level(self, queue: str, job_id: str, now: float) -> float | None:
        """The queue's LAS threshold when the job has held no more than it (so it may preempt jobs of its
        priority that have held more); None otherwise."""
        threshold = threshold_milli_s(self.policy.queues.get(queue))
        if threshold is None or self.s.attained.of(job_id, now) > threshold:
            return None
        return threshold

    def _watch_service(self, run: Running) -> None:
        """In a queue of least attained service, a tick looks again once the run passes the threshold: the
        queue's waiting jobs may then preempt it (PreemptionState.unprotected)."""
        threshold = threshold_milli_s(self.policy.queues.get(run.queue))
        if threshold is None:
            return
        at = self.s.attained.crosses_at(run.job_id, threshold)
        if at is not None:
            heapq.heappush(self.s.protected_until, (at, run.job_id))

    def borrowers(self, preemptor: JobSpec, flavor: str, now: float, preemptor_id: str = "") -> list[Running]:
        return borrowers(self, preemptor, flavor, now, preemptor_id)

    def _may_evict_for(self, job_id: str) -> bool:
        """Could an eviction serve the job now? Only a waiting job, not already waiting for its victims to
        leave, nor running; and only with candidates: without any there is nobody to evict, so no simulation
        is set up. No job of the queue running at a lower priority: no candidate within the queue; no cohort
        either: no borrower to reclaim from."""
        s = self.s
        spec = s.specs.get(job_id)
        waiting = s.waiting.get(job_id)
        if spec is None or waiting is None or job_id in s.in_flight or job_id in s.running:
            return False
        running, prio = s.running_priorities.get(spec.queue), self.policy.priority_of(spec)
        if running is not None and min(running, default=prio) < prio:
            return True
        if running and threshold_milli_s(self.policy.queues.get(spec.queue)) is not None:
            return True  # least attained service: jobs of its own priority may be candidates
        return bool(self.book.cohort.get(spec.queue, ""))

    def _consider(self, job_id: str, now: float, out: Decisions) -> None:
        if not self._may_evict_for(job_id):
            return
        s = self.s
        spec, waiting = s.specs[job_id], s.waiting[job_id]
        queue = self.policy.queues.get(spec.queue)
        grace_over = now >= waiting.since + (queue.reclaim_after_s if queue is not None else 0.0)
        if waiting.code == PLACEMENT:  # it holds its quota: only room on the GPUs is missing
            if self._giving_back(job_id, now):
                return  # quota gives its reservation back now: what an eviction freed would go to others
            held = s.reserved.get(job_id)
            flavor = held[1] if held is not None else ANY
            cands = self.candidates(spec, job_id, now)
            reclaims = grace_over and held is not None
            if not (cands or reclaims):
                return
            with self._simulation(spec, job_id, now) as sim:
                victims = sim.choose(cands, lambda: sim.fits(flavor)) if cands else []
                if not victims and reclaims and held is not None:
                    victims = placement_victims(self, sim, held, job_id)
            self._decide(job_id, victims, out)
            return
        if self._behind_higher_priority(job_id, spec):
            return
        flavors = self.book.flavors_for(spec.queue, spec) or [ANY]
        with self._simulation(spec, job_id, now) as sim:
            victims = reclaim_victims(self, sim, flavors, job_id) if grace_over else []
            cands = [] if victims else self.candidates(spec, job_id, now)
            if cands:

                def admitted_and_placed() -> bool:
                    flavor = sim.quota_flavor(flavors)
                    return flavor is not None and sim.fits(flavor)

                victims = sim.choose(cands, admitted_and_placed, placed=lambda: any(sim.fits(f) for f in flavors))
        self._decide(job_id, victims, out)

    def _giving_back(self, job_id: str, now: float) -> bool:
        """Is the job's placement timeout over, so that quota gives its reservation back (as quota_timeout does:
        unless capacity is held for it)? It is reserved again later, and may evict then."""
        timeout = self.policy.settings.placement_timeout_s
        reserved_at = self.s.reserved_at.get(job_id)
        if timeout is None or reserved_at is None or now - reserved_at < timeout:
            return False
        return job_id not in self.s.capacity_held or self._lender_waits(job_id)

    def _lender_waits(self, job_id: str) -> bool:
        """Does another queue of the job's cohort wait for quota it lent, of the flavor the job borrows (as
        quota_reclaim.lender_waits asks)? Then quota gives a starving borrower's reservation back all the same."""
        held = self.s.reserved.get(job_id)
        if held is None:
            return False
        queue, flavor, _, over_budget = held
        cohort = self.book.cohort.get(queue, "")
        if not cohort or (not over_budget and self.book.borrowed(queue, flavor) <= 0):
            return False
        smallest = smallest_waiting(self.s, flavor)
        return any(q != queue and q in smallest and self.book.waits_for_lent_quota(q, flavor, smallest[q])
                   for q in self.book.members[cohort])

    def _simulation(self, spec: JobSpec, job_id: str, now: float) -> Simulation:
        s = self.s

        def unclaimed(job_id: str) -> bool:
            preemptor = s.victim_of.get(job_id)
            return preemptor is None or preemptor in s.running or preemptor not in s.specs

        # Jobs on their way out (cancelled, or victims of a preemptor that runs already or is gone) leave room
        # nobody has claimed; victims leaving for a preemptor still waiting do not: that room is its.
        leaving = [s.running[j] for j in sorted({**s.cancelled, **s.victim_of}) if j in s.running and unclaimed(j)]
        return Simulation(self, spec, leaving, now, job_id)

    def _decide(self, job_id: str, victims: list[Running], out: Decisions) -> None:
        if not victims:
            return
        spec = self.s.specs[job_id]
        now = out.trigger.event.ts
        prio = self.policy.priority_of(spec)

        def why(v: Running) -> str:
            if v.queue != spec.queue:
                return RECLAIM
            return WITHIN_QUEUE_PRIORITY if v.priority < prio else LEAST_ATTAINED_SERVICE

        reasons = [why(v) for v in victims]
        # The decision's code: the first of reclaim, priority, least attained service that one victim has.
        code = next(c for c in (RECLAIM, WITHIN_QUEUE_PRIORITY, LEAST_ATTAINED_SERVICE) if c in reasons)
        out.emit(PreemptionDecided, correlation_id=job_id, preemptor_id=job_id, code=code,
                 victims=tuple(Victim(job_id=v.job_id, queue=v.queue, priority=v.priority, gpu_milli=v.demand,
                                      reason=reason, lost_gpu_seconds=round(v.lost(now) / 1000, 3),
                                      started_at=v.started)
                               for v, reason in zip(victims, reasons, strict=True)))

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"running": sorted(self.s.running), "in_flight": self.s.in_flight,
                                    "used": {f"{q}/{f}": u for (q, f), u in sorted(self.book.used.items()) if u},
                                    "waiting": {j: w.code for j, w in sorted(self.s.waiting.items())}})
