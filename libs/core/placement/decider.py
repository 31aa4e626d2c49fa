"""Placement: where each job with reserved quota runs, all replicas or none.

Capacity is taken at JobPlaced and given back only when an executor reports the job gone (finished,
failed or evicted): between those two facts the GPUs are the job's, whatever else happens.

A preemptor is "nominated" when its victims are chosen: until it is placed (or the nomination expires on
the log's clock), a job of lower priority (for a reclaim: also any job of another queue) is placed only where
it leaves the preemptor room to fit once its victims are gone, so the capacity freed for it is not taken by
the jobs it displaced.

A job that has waited for capacity longer than the settings' starvation limit gets capacity held the same
way, by the starvation rule quota shares (libs/core/kernel/starvation.py, EASY backfill): a job of no higher priority
waits only if it takes GPUs on a node that could hold the starving job and leaves it no room there, unless its
declared runtime ends before the starving job could start anyway (its "shadow" time, from running jobs'
declared ends). The starving job is the longest-waiting job past the limit that the present nodes could hold
with every running job gone (the rule quota picks its own by): one no node could hold holds nobody, and the
next-oldest that could be held starves in its place. The starving job is told that capacity
is held for it, so that quota keeps its reservation; any other job whose quota goes back before it is placed
(quota's placement timeout) is forgotten until quota reserves it again, its wait for capacity going on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

import msgspec

from contracts import (
    RECLAIM,
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
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
    SchedulingSettingsChanged,
)
from libs.core.cluster.job_fit import NO_MODEL_MATCH, Placer, Shortfall, placement_shape
from libs.core.cluster.model import Cluster
from libs.core.cluster.scoring import DEFAULT_POLICY
from libs.core.cluster.shapes import ShapeWindow
from libs.core.kernel.attained_service import least_served
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.policy import PolicyBook, declared_runtime, demand_milli, runtime_bound
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.kernel.starvation import (
    CAPACITY_HELD,
    UNKNOWN_START,
    EmptyInventory,
    Starving,
    find_shadow,
    holds,
    longest_waiting,
    takes_usable_gpus,
)

SERVICE = "placement"
RESERVED_FOR_PREEMPTOR = "reserved_for_preemptor"
HELD_FOR_STARVING_JOB = "held_for_starving_job"
# Deferral codes that name something other than too few free GPUs: a job told one is tried again even when
# the free GPUs cannot hold it, so that it is told the reason that holds now.
_TOLD_ELSE = (NO_MODEL_MATCH, RESERVED_FOR_PREEMPTOR, HELD_FOR_STARVING_JOB)
# Ties between equally good nodes go to the first in one fixed pseudo-random node order: the same order
# for every job consolidates work (random ties per job scatter it: 89.6 % vs 95.3 % allocated under FGD).
NODE_ORDER_SALT = 0
# A nomination lapses after this long on the log's clock, so a preemptor that never gets its quota
# cannot hold capacity back forever.
NOMINATION_TTL_S = 120.0

WaitKey = tuple[int, int, str]  # (-priority, reservation order, job id)


class PlacementDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.policy = PolicyBook()
        self.cluster = Cluster()
        self.placer = Placer(self.cluster)
        # The same nodes with no job on them: who may starve (a job they could not hold never does).
        self.inventory = EmptyInventory()
        # Fragmentation is judged against the shapes recently asked for.
        self.shapes = ShapeWindow()
        self.specs: dict[str, JobSpec] = {}
        # The submitted spec of a job whose spec a reservation narrowed to one GPU model: a later reservation
        # (another flavor, or any model) narrows it afresh from this one.
        self.submitted: dict[str, JobSpec] = {}
        self.waiting: dict[str, WaitKey] = {}
        self.placed: dict[str, tuple[ReplicaPlacement, ...]] = {}
        self.deferred: dict[str, str] = {}
        # preemptor -> (its priority, its victims, when it was nominated, whether it reclaims)
        # preemptor -> (priority, victims, when, a reclaim?, least attained service?)
        self.nominated: dict[str, tuple[int, tuple[str, ...], float, bool, bool]] = {}
        self.cancelled: dict[str, None] = {}
        self._order = 0
        self.lapsed = False  # did the last tick end a nomination?
        self.held_back_free = False  # was a nominee placed since the last tick (so its hold ended)?
        self.waiting_since: dict[str, float] = {}  # job -> when its quota was reserved
        self.ends: dict[str, float] = {}  # placed job -> its declared end
        # The job capacity is held for after waiting too long: (job, priority, shadow time, the running jobs
        # that end by then), set on ticks.
        self.starving: tuple[str, int, float, tuple[str, ...]] | None = None
        self.retries = RetryBook()
        # Inference services' placed replicas: service -> {job: its nodes}, to keep them apart.
        self.service_nodes: dict[str, dict[str, tuple[str, ...]]] = {}
        # Bumped by every event that can change where (or whether) a request fits: capacity taken or given
        # back, nodes and GPUs coming or going, policy, the typical shapes that scoring judges against.
        self.generation = 0
        # A request that did not fit does not fit for an identical request either while the generation stays:
        # failures are remembered per request shape (placement_shape) with the waiting pass that found them
        # (0: none) and whether the answer depended on the cluster alone (see _pure). Within one pass of the
        # waiting jobs a failure always stands; beyond it, only a pure one, and only while the placer is
        # consistent (a placement cache refreshed out of step would make the next try see another cluster).
        self.failed: dict[tuple[object, ...], tuple[Shortfall, int, bool]] = {}
        self.failed_generation = 0
        # The job whose JobPlaced, about to be folded, this decider has allocated already.
        self._allocated: str | None = None
        self._pass = 0
        self._passes = 0
        # The last shadow time computed: (generation, job, its spec) -> (shadow, the running jobs ending by then),
        # kept only when pure.
        # kept only when pure; None as the answer: it could never fit.
        self._shadow: tuple[tuple[int, str, JobSpec], tuple[float, tuple[str, ...]] | None] | None = None

    def _reserved_spec(self, job_id: str, flavor: str) -> JobSpec | None:
        """The spec the job is placed by under a reservation of `flavor` ("" for any model): quota from one GPU
        model's flavor runs the job on that model; always from the submitted spec, so that a reservation of
        another flavor, or of any model once the queue's flavors are gone, does not keep an earlier one's model."""
        spec = self.specs.get(job_id)
        if spec is None:
            return None
        submitted = self.submitted.get(job_id, spec)
        if not flavor or submitted.gpu_models == (flavor,):
            self.submitted.pop(job_id, None)
            self.specs[job_id] = submitted
            return submitted
        self.submitted[job_id] = submitted
        narrowed = self.specs[job_id] = msgspec.structs.replace(submitted, gpu_models=(flavor,))
        return narrowed

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned, QueuePolicyChanged,
                PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, QuotaReserved, JobCancelled,
                JobFinished, JobFailed, JobEvicted, PreemptionDecided, ClockTick, QuotaReleased)

    def evolve(self, event: EventBase) -> None:
        # The most frequent events first; policy events (which no case names) last.
        match event:
            case JobSubmitted():
                self.specs[event.job_id] = event.spec
                if self.shapes.add(event.spec):
                    self.placer.set_typical(self.shapes.typical)
                    self.generation += 1
            case QuotaReserved():
                spec = self._reserved_spec(event.job_id, event.flavor)
                if spec is not None and event.job_id not in self.placed:
                    self._order += 1
                    self.waiting[event.job_id] = (-self.policy.priority_of(spec), self._order, event.job_id)
                    # A job whose quota went back unplaced keeps its wait (see QuotaReleased below).
                    self.waiting_since.setdefault(event.job_id, event.ts)
            case JobPlaced():
                self.waiting.pop(event.job_id, None)
                self.waiting_since.pop(event.job_id, None)
                self.deferred.pop(event.job_id, None)
                self._end_nomination(event.job_id)
                self._left_for_good(event.job_id)
                self.placed[event.job_id] = event.placements
                if self._allocated != event.job_id:  # else: our own decision, allocated when taken (_try_place)
                    self.cluster.allocate(event.placements)
                self.generation += 1
                placed_spec = self.specs.get(event.job_id)
                runtime = None if placed_spec is None else declared_runtime(placed_spec)
                if runtime is not None:
                    self.ends[event.job_id] = event.ts + runtime
                if placed_spec is not None and placed_spec.service:
                    self.service_nodes.setdefault(placed_spec.service, {})[event.job_id] = tuple(
                        p.node for p in event.placements)
                if self.starving is not None and self.starving[0] == event.job_id:
                    self.starving = None
            case JobFinished() | JobFailed() | JobEvicted():
                placements = self.placed.pop(event.job_id, None)
                self.ends.pop(event.job_id, None)
                gone_spec = self.specs.get(event.job_id)
                if gone_spec is not None and gone_spec.service in self.service_nodes:
                    self.service_nodes[gone_spec.service].pop(event.job_id, None)
                if placements is not None:
                    self.cluster.release(placements)
                    self.generation += 1
                again = isinstance(event, JobEvicted) or (
                    isinstance(event, JobFailed)
                    and self.retries.on_failed(event, self.specs.get(event.job_id), self.policy) is not None)
                if not again or event.job_id in self.cancelled:
                    self.specs.pop(event.job_id, None)
                    self.submitted.pop(event.job_id, None)
                    self.cancelled.pop(event.job_id, None)
                    self._end_nomination(event.job_id)
                    # Over for good, even if a report came while its quota was reserved again (an executor's
                    # late word on an earlier run): nothing of it waits any more.
                    self.waiting.pop(event.job_id, None)
                    self.waiting_since.pop(event.job_id, None)
                    self.deferred.pop(event.job_id, None)
            case ClockTick():
                # (never while a victim still leaves: a checkpoint may take longer; the room is the nominee's)
                lapsed = [j for j, n in self.nominated.items()
                          if event.ts - n[2] > NOMINATION_TTL_S and not any(v in self.placed for v in n[1])]
                for job_id in lapsed:
                    del self.nominated[job_id]
                self.lapsed = bool(lapsed) or self.held_back_free
                self.held_back_free = False
            case PlacementDeferred():
                self.deferred[event.job_id] = event.code
            case QuotaReleased() if event.job_id in self.waiting:
                # Its quota went back before it was placed: it is placed only once quota reserves it again.
                self.waiting.pop(event.job_id)
                self.deferred.pop(event.job_id, None)
                self._end_nomination(event.job_id)
                if self.starving is not None and self.starving[0] == event.job_id:
                    self.starving = None
            case PreemptionDecided() if event.preemptor_id in self.specs:
                prio = self.policy.priority_of(self.specs[event.preemptor_id])
                # A reclaim's preemptor holds its room against every other queue's job too: the GPUs it
                # takes back are its queue's nominal quota, not the borrowers' to take again.
                reclaim = any(v.reason == RECLAIM for v in event.victims)
                self.nominated[event.preemptor_id] = (prio, tuple(v.job_id for v in event.victims), event.ts,
                                                      reclaim, least_served(event))
            case JobCancelled():
                self.waiting.pop(event.job_id, None)
                self.waiting_since.pop(event.job_id, None)
                self.deferred.pop(event.job_id, None)
                self._end_nomination(event.job_id)
                if event.job_id in self.placed:
                    self.cancelled[event.job_id] = None  # its executor will report it gone
                else:
                    self.specs.pop(event.job_id, None)
                    self.submitted.pop(event.job_id, None)
            case NodeRegistered() | NodeLost() | NodeCordoned() | NodeUncordoned() | GpuHealthChanged():
                self.cluster.apply_node_event(event)
                self.inventory.evolve(event)
                self.generation += 1
            case _ if self.policy.apply(event):
                self.generation += 1

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        event = trigger.event
        match event:
            case QuotaReserved() if event.job_id in self.waiting:
                self._try_place(event.job_id, out)
            case JobFinished() | JobFailed() | JobEvicted() | NodeRegistered() | NodeUncordoned():
                self._place_waiting(out)
            case GpuHealthChanged() if event.healthy:
                self._place_waiting(out)
            case ClockTick():
                before = self.starving
                self._find_starving(event.ts)
                if before != self.starving or self.lapsed:  # (a hold that ended may have kept it from being told)
                    self._tell_starving(before, out)
                if self.lapsed or before != self.starving:
                    self._place_waiting(out)  # a hold lapsed or moved: what it held back may go now
        return out.out

    def _place_waiting(self, out: Decisions) -> None:
        # A job asking for more than all free GPU share together cannot fit: skip it without a scan.
        free = self.cluster.usable_free_milli()
        self._passes += 1
        self._pass = self._passes
        try:
            for key in sorted(self.waiting.values()):
                job_id = key[2]
                # ... unless it was told no GPU of its models is there, or that capacity is held for another
                # job: the inventory or the hold may have changed, and the reason it waits is then another (too
                # few free), which it is told.
                if demand_milli(self.specs[job_id]) > free and self.deferred.get(job_id) not in _TOLD_ELSE:
                    continue
                if self._try_place(job_id, out):
                    free -= demand_milli(self.specs[job_id])
        finally:
            self._pass = 0

    def _pure(self, spec: JobSpec) -> bool:
        """Would placing `spec` now depend on the cluster's state alone (not on how the placer's caches got
        there)? Gang domains refresh the placer out of step, so requests with a topology never are."""
        return not spec.topology and self.placer.consistent()

    def policy_for(self, spec: JobSpec) -> str:
        """The priority class's placement policy, else the queue's, else the default."""
        cls = self.policy.classes.get(spec.priority)
        queue = self.policy.queues.get(spec.queue)
        return (cls.placement_policy if cls else "") or (queue.placement_policy if queue else "") or DEFAULT_POLICY

    def _try_place(self, job_id: str, out: Decisions) -> bool:
        spec = self.specs[job_id]
        policy = self.policy_for(spec)
        shape = placement_shape(spec, policy)
        if self.failed_generation != self.generation:
            self.failed.clear()
            self.failed_generation = self.generation
        known = self.failed.get(shape)
        result: tuple[ReplicaPlacement, ...] | Shortfall | None = None
        if known is not None and ((known[1] and known[1] == self._pass) or (known[2] and self._pure(spec))):
            result = known[0]
        with self.cluster.what_if() as trial:  # the job placed on the live cluster, kept only if nobody holds it
            if result is None:
                pure = self._pure(spec)
                result = self._apart(spec, policy) or self.placer.place_gang(spec, policy, salt=NODE_ORDER_SALT)
                if isinstance(result, Shortfall):
                    self.failed[shape] = (result, self._pass, pure)
            if isinstance(result, Shortfall):
                if self.starving is not None and self.starving[0] == job_id:
                    return False  # it was told capacity is held for it (see _tell_starving)
                if self.deferred.get(job_id) != result.code:
                    out.emit(PlacementDeferred, correlation_id=job_id, job_id=job_id, code=result.code,
                             message=result.message, shortfall_milli=result.shortfall_milli)
                return False
            blocked = self._starves_nominee(job_id, spec, result)
            # A reclaim's nominee takes the room its victims freed: no starving job holds that against it (the
            # room is its queue's nominal quota, and its eviction would be for nothing), as its hold binds the
            # starving job (_starves_nominee); so does a nominee of least attained service (its victims, of its
            # own queue and priority, left for it, and quota holds their quota for it alone). Another nominee is
            # held like any job of its priority.
            nomination = self.nominated.get(job_id)
            held_for = (None if blocked is not None or (nomination is not None and (nomination[3] or nomination[4]))
                        else self._starves_starving(job_id, spec, result, out.trigger.event.ts))
            if held_for is None and blocked is None:
                trial.keep()
        if held_for is None and blocked is None:
            # Placed: the trial's allocation stands as JobPlaced's (giving it back for its evolve to take it
            # again comes to the same, but for the array views' notice of the change, which `touch` gives).
            self.cluster.touch(result)
            self._allocated = job_id
            try:
                out.emit(JobPlaced, correlation_id=job_id, job_id=job_id, placements=result, policy=policy)
            finally:
                self._allocated = None
            return True
        if held_for is not None:
            if self.deferred.get(job_id) != HELD_FOR_STARVING_JOB:
                out.emit(PlacementDeferred, correlation_id=job_id, job_id=job_id, code=HELD_FOR_STARVING_JOB,
                         message=f"capacity is held for job {held_for}, which has waited too long; only jobs "
                                 "ending before it can start may go first")
            return False
        if self.deferred.get(job_id) != RESERVED_FOR_PREEMPTOR:  # blocked by a nominee
            out.emit(PlacementDeferred, correlation_id=job_id, job_id=job_id, code=RESERVED_FOR_PREEMPTOR,
                     message=f"capacity is held for job {blocked}, which preempted jobs to run")
        return False

    def _apart(self, spec: JobSpec, policy: str) -> tuple[ReplicaPlacement, ...] | None:
        """A service replica that spreads: a placement away from its service's other replicas, if one fits."""
        if not (spec.service and spec.spread):
            return None
        others = self.service_nodes.get(spec.service)
        if not others:
            return None
        avoid = sorted({node for nodes in others.values() for node in nodes})
        return self.placer.place_apart(spec, avoid, policy, salt=NODE_ORDER_SALT)

    def _starves_nominee(self, job_id: str, spec: JobSpec, tentative: tuple[ReplicaPlacement, ...]) -> str | None:
        """With `job_id` tentatively allocated (at `tentative`): the first nominated preemptor of higher priority
        (or, for a reclaim, of another queue; for least attained service, of its own queue) that would fit once its
        victims are gone, but no longer beside the job, or None. Among nominees the earlier nomination goes
        first: a later one never holds it back."""
        if not self.nominated:
            return None
        prio = self.policy.priority_of(spec)
        mine = self.nominated.get(job_id)
        for nominee in sorted(self.nominated):
            nprio, victims, at, reclaim, las = self.nominated[nominee]
            if nominee == job_id or nominee not in self.specs:
                continue
            if mine is not None and (at, nominee) > (mine[2], job_id):
                continue
            same_queue = self.specs[nominee].queue == spec.queue
            # Held back: a job of lower priority; for a reclaim, any job of another queue; for least attained
            # service, a job of its own queue and priority (its victims would take their GPUs back).
            if nprio <= prio and not (reclaim and not same_queue) and not (las and same_queue and nprio == prio):
                continue
            with self.cluster.what_if() as victims_gone:
                for victim in victims:
                    if victim in self.placed:
                        victims_gone.release(self.placed[victim])
                held_back = not self.placer.fits(self.specs[nominee]) and self._fits_without(tentative, nominee)
            if held_back:
                return nominee
        return None

    def _fits_without(self, tentative: tuple[ReplicaPlacement, ...], job_id: str) -> bool:
        """Would the (nominated) job fit with the tentative allocation given back, so that it is what keeps the
        nominee out (one that does not fit anyway holds nothing)?"""
        with self.cluster.what_if() as without:
            without.release(tentative)
            return self.placer.fits(self.specs[job_id])

    def _left_for_good(self, job_id: str) -> None:
        """A victim placed again (elsewhere, or where it left once its preemptor ran) is no longer leaving for its
        preemptor: its new run neither counts as the preemptor's room nor keeps the nomination from lapsing."""
        for nominee, (prio, victims, at, reclaim, las) in list(self.nominated.items()):
            if job_id in victims:
                self.nominated[nominee] = (prio, tuple(v for v in victims if v != job_id), at, reclaim, las)

    def _end_nomination(self, job_id: str) -> None:
        """The job's nomination is over (it is placed, gone, or its quota went back): the jobs it held back wait
        for other reasons now, and are told so at the next tick."""
        if self.nominated.pop(job_id, None) is not None:
            self.held_back_free = True

    def _find_starving(self, now: float) -> None:
        """On a tick: the starving job, by the rule quota shares (starvation.longest_waiting): the job waiting
        longest for capacity, past the starvation limit, that the present nodes could hold with every running
        job gone (one they could not hold is no starving job, and the next-oldest may be); and its shadow time
        (when running jobs' declared ends free enough for it; unknown when they do not say). A nominated
        preemptor has capacity held for it already: then nobody starves besides."""
        limit = self.policy.settings.starvation_after_s
        self.starving = None
        if limit is None or not self.waiting:
            return
        job_id = longest_waiting(self._by_wait(), now, limit,
                                 lambda j: j in self.specs and self.inventory.could_hold(self.specs[j]))
        if job_id is None or job_id in self.nominated:
            return
        spec = self.specs[job_id]
        # The shadow depends on the job's request and on capacity, running jobs and policy, all of which
        # bump the generation when they change: between such changes the last answer stands.
        key = (self.generation, job_id, spec)
        pure = self._pure(spec)
        if pure and self._shadow is not None and self._shadow[0] == key:
            if self._shadow[1] is not None:
                shadow, ending = self._shadow[1]
                self.starving = (job_id, self.policy.priority_of(spec), shadow, ending)
            return
        declared = sorted((e, j) for j, e in self.ends.items() if j in self.placed)
        with self.cluster.what_if() as trial:
            found = find_shadow(now, declared, [j for j in self.placed if j not in self.ends],
                                release=lambda j: trial.release(self.placed[j]), fits=lambda: self.placer.fits(spec))
        answer = None if found is None else (found.at, found.ending)
        self._shadow = (key, answer) if pure else None
        if answer is not None:
            self.starving = (job_id, self.policy.priority_of(spec), *answer)

    def _by_wait(self) -> Iterator[tuple[float, str]]:
        """The waiting jobs, longest waiting first, ordered only as far as they are read (a heap: the walk
        stops at the first job that could starve, or that has not waited long enough)."""
        waits = [(self.waiting_since[j], j) for j in self.waiting]
        heapq.heapify(waits)
        while waits:
            yield heapq.heappop(waits)

    def _tell_starving(self, before: tuple[str, int, float, tuple[str, ...]] | None, out: Decisions) -> None:
        """The starving job changed: the new one is told capacity is held for it (so quota keeps its
        reservation), the one before, still waiting, why it waits again."""
        current = self.starving
        # (one a preemptor's hold keeps waiting is told so, and told this once the nominations are over)
        held_back = current is not None and self.deferred.get(current[0]) == RESERVED_FOR_PREEMPTOR and self.nominated
        if current is not None and self.deferred.get(current[0]) != CAPACITY_HELD and not held_back:
            start = "once running jobs end (they do not say when)" if current[2] == UNKNOWN_START else (
                f"by {current[2]:.0f}")
            out.emit(PlacementDeferred, correlation_id=current[0], job_id=current[0], code=CAPACITY_HELD,
                     message=f"it has waited longer than the starvation limit: capacity is held for it; it could "
                             f"start {start}")
        if before is None or (current is not None and current[0] == before[0]) or before[0] not in self.waiting:
            return
        if self.deferred.get(before[0]) == CAPACITY_HELD:
            short = self.placer.explain(self.specs[before[0]])
            out.emit(PlacementDeferred, correlation_id=before[0], job_id=before[0], code=short.code,
                     message=short.message, shortfall_milli=short.shortfall_milli)

    def _starves_starving(self, job_id: str, spec: JobSpec, tentative: tuple[ReplicaPlacement, ...], now: float
                          ) -> str | None:
        """With `job_id` tentatively allocated (at `tentative`): the starving job it would keep waiting, or
        None, by the starvation rule (libs/core/kernel/starvation.py)."""
        if self.starving is None or self.starving[0] not in self.specs:
            return None
        starving, prio, shadow, ending = self.starving
        rule = Starving(job_id=starving, priority=prio, shadow=shadow)
        held = holds(rule, job_id, self.policy.priority_of(spec), runtime_bound(spec), now,
                     lambda: self._room_effect(tentative, starving, ending))
        return starving if held else None

    def _room_effect(self, tentative: tuple[ReplicaPlacement, ...], starving: str, ending: tuple[str, ...]
                     ) -> tuple[bool, bool]:
        """Does the tentative placement take GPUs the starving job could use (room it would fit in without
        it, or GPUs of its models on a node that could hold one of its replicas), and does the starving job
        still fit beside it once the jobs ending by its shadow time are gone?"""
        with self.cluster.what_if() as at_shadow:
            for job_id in ending:
                if job_id in self.placed:
                    at_shadow.release(self.placed[job_id])
            if self.placer.fits(self.specs[starving]):
                return (True, True)
            # It may not fit at all yet; then the question is whether this job takes what it could use.
            with self.cluster.what_if() as without:
                without.release(tentative)
                room_without = self.placer.fits(self.specs[starving])
            return (room_without or takes_usable_gpus(self.cluster, self.specs[starving], tentative), False)

    def snapshot(self) -> bytes:
        return msgspec.json.encode({
            "placed": self.placed,
            "waiting": self.waiting,
            "free": {n.name: [g.free_milli for g in n.gpus] for n in self.cluster.sorted_nodes()},
        })
