"""Quota: which admitted job may take GPU quota now, from which flavor, in fair order.

A scheduling pass runs over a cohort (or a queue without one) whenever its quota or its waiting work
changes. It repeatedly takes the best head among the cohort's queues:
  1. jobs that fit within their queue's nominal quota before jobs that must borrow,
  2. the queue furthest below its fair share: weighted (decayed) usage relative to nominal, compared level
     by level down the queue tree (Slurm's Fair Tree),
  3. priority, then arrival, then id.
Inside a queue the order is priority, then the user holding the fewest GPUs in that queue, then arrival.

A job that does not get quota holds back the jobs of lower priority in its queue, in the flavors it could use
(so quota freed for it, e.g. by preemption, is not taken by the jobs it displaced); jobs of its own priority
may use what is left, and lower ones any other flavor. While a queue under its nominal quota waits for quota of
a flavor lent to borrowers, with a job that quota could serve (not one held by its own user limit), no borrower
of that flavor grows, and borrowers of it reserved but holding no capacity give it back at once
(libs/core/quota_reclaim.py). A queue's reservations follow its flavors when its policy changes
(QuotaBook.recharge). A job that cannot be preempted (its class says so) uses only its queue's own nominal
quota, never borrowed quota: its lender could never get that back. A parent queue's quota bounds its whole
subtree (QuotaBook.parent_room). A preemptor whose victims were chosen comes first and holds the quota they
free until it is reserved or its nomination lapses (libs/core/quota_nomination.py). A job waiting longer than
the starvation limit gets the quota it could use held for it (libs/core/starvation.py: the rule placement
shares). A job its queue can no longer hold at all (its quota was lowered, or its flavor removed) is told so
and waits holding nothing; so does one no node present could hold, even with every running job gone (it holds
no job below it, freezes no borrower, and nobody reclaims for it), though it still takes quota that is free.
Per-user limits and GPU-hour budgets (charged for run time: libs/core/budgets.py) are checked per job. A
reservation that placement has not placed within the settings' placement timeout goes back, and its job waits
again after a backoff. Each waiting job gets one QuotaDeferred per reason, which the preemption service uses to
reclaim quota.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobAdmitted,
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
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.budgets import BudgetBook
from libs.core.decider import Chain, Decisions, Trigger
from libs.core.fairness import DecayedUsage
from libs.core.policy import PolicyBook, demand_milli
from libs.core.quota_fleet import FLEET_EVENTS, Fleet
from libs.core.quota_nomination import HELD_FOR_PREEMPTOR, holding_nominee, nominees
from libs.core.quota_order import Order
from libs.core.quota_reclaim import (
    RECLAIMED_UNPLACED,
    holds_no_capacity,
    lender_need,
    releasable_unplaced,
    unplaced_borrowers,
)
from libs.core.quota_starvation import reservation_effect, reservations_shadow
from libs.core.quota_state import Pass, QuotaJob
from libs.core.quotas import ANY, UNLIMITED, QuotaBook, flavor_name, reservation_model
from libs.core.retries import RetryBook
from libs.core.runs import CurrentRuns
from libs.core.starvation import CAPACITY_HELD, RoomEffect, Starving, holds, longest_waiting

SERVICE = "quota"
QUEUE_QUOTA_EXHAUSTED = "queue_quota_exhausted"  # at nominal (plus borrowing limit, in a cohort)
COHORT_QUOTA_EXHAUSTED = "cohort_quota_exhausted"  # must borrow; the cohort has nothing idle to lend
QUOTA_LENT_OUT = "quota_lent_out"  # fits its nominal, but borrowers hold the lendable part: reclaim
BEHIND_HIGHER_PRIORITY = "behind_higher_priority"
USER_LIMIT = "user_limit"
BUDGET_SPENT = "budget_spent"
HELD_FOR_STARVING_JOB = "held_for_starving_job"
OVER_BUDGET_WAITS = "over_budget_waits_for_idle_quota"
RETRY_BACKOFF = "retry_backoff"
EXCEEDS_QUEUE_QUOTA = "exceeds_queue_quota"  # more than its queue could ever hold, as its quota is now
PARENT_QUOTA_EXHAUSTED = "parent_quota_exhausted"  # its queue has room, its parent's subtree does not
NOMINAL_QUOTA_ONLY = "nominal_quota_only"  # a job that cannot be preempted never borrows: its queue is at nominal
# No node present could hold it, not even with every running job gone: it is no starving job (it holds nobody
# for starvation) until a node that could hold it registers or comes back.
NO_NODE_COULD_HOLD = "no_node_could_hold"
PLACEMENT_TIMED_OUT = "placement_timed_out"  # no node held it in time: its quota went back; it waits a backoff
PLACEMENT_TIMEOUT = "placement_timeout"  # the QuotaReleased reason of such a job
# A job whose reservation timed out waits this long before it may take quota again, doubling each time (as
# Kueue's requeuing backoff), so that an unplaceable job does not take and give back quota at every tick.
PLACEMENT_BACKOFF_S = 60.0
PLACEMENT_BACKOFF_MAX_S = 3600.0
BACKING_OFF = frozenset({RETRY_BACKOFF, PLACEMENT_TIMED_OUT})
# Capacity that may let a job placement could not place go: the wait after a placement timeout ends on these.
_CAPACITY_GREW = (NodeRegistered, NodeUncordoned, GpuHealthChanged)
# Inputs on which placement may place waiting jobs at once: quota gives back no unplaced borrower's reservation
# on them (placement may be placing it right then); the next clock tick does (_lenders_of_unplaced).
_CAPACITY_FREED = (JobFinished, JobFailed, JobEvicted, *_CAPACITY_GREW)
_PLACEMENT_REPORTS = (JobPlaced, JobStarted, PlacementDeferred, JobFinished, JobFailed, JobEvicted)
# Deferrals that evicting other jobs can cure: the preemption service acts on these.
# A preemptor's claim on the quota its victims free lapses after this long (as placement's nomination).
NOMINATION_TTL_S = 120.0
PREEMPTION_MAY_HELP = frozenset({QUEUE_QUOTA_EXHAUSTED, COHORT_QUOTA_EXHAUSTED, QUOTA_LENT_OUT, PARENT_QUOTA_EXHAUSTED,
                                 NOMINAL_QUOTA_ONLY})
WAITING_FOR_QUOTA = PREEMPTION_MAY_HELP | {BEHIND_HIGHER_PRIORITY}
# Who may be the starving job, by its last reason: one told no node could hold it too, as that may have changed
# since (a node came back) with nothing to tell it yet; the inventory is asked again (_inventory_could_hold).
WAITING_OR_HELD = WAITING_FOR_QUOTA | {HELD_FOR_STARVING_JOB, NO_NODE_COULD_HOLD}
BUDGET_WAITS = frozenset({BUDGET_SPENT, OVER_BUDGET_WAITS})


def placement_backoff_s(timeouts: int) -> float:
    """How long a job waits after its reservation went back unplaced for the `timeouts`-th time."""
    return min(PLACEMENT_BACKOFF_MAX_S, PLACEMENT_BACKOFF_S * 2 ** (timeouts - 1))


class QuotaDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.policy = PolicyBook()
        self.jobs: dict[str, QuotaJob] = {}
        # queue -> priority -> user -> [(arrival, job id)] sorted
        self.pending: dict[str, dict[int, dict[str, list[tuple[int, str]]]]] = {}
        # (queue, priority) -> pending demand -> count: the smallest demand of a level, fast
        self.demands: dict[tuple[str, int], dict[int, int]] = {}
        # (queue, priority) -> allowed GPU models -> count: is the level all one kind of request?
        self.models: dict[tuple[str, int], dict[tuple[str, ...], int]] = {}
        # queue -> allowed GPU models -> pending demand -> count: the smallest request a flavor could serve
        self.demands_by_models: dict[str, dict[tuple[str, ...], dict[int, int]]] = {}
        # Pending jobs by how long they have waited: (since, arrival, job id), for starvation.
        self.by_wait: list[tuple[float, int, str]] = []
        self.by_wait_in: dict[str, list[tuple[float, int, str]]] = {}  # the same, per queue
        self.reserved: dict[str, dict[str, None]] = {}  # queue -> jobs holding quota
        self.queue_used: dict[str, int] = {}
        self.user_used: dict[tuple[str, str], int] = {}
        self.decayed: dict[str, DecayedUsage] = {}
        self.budgets = BudgetBook()
        # Reserved jobs placement has not placed yet (in reservation order): the placement timeout looks at these.
        self.unplaced: dict[str, None] = {}
        self._placed_while_pending: str | None = None  # the job whose JobPlaced, just folded, found it waiting
        self.deferred: dict[str, str] = {}
        # The deferred jobs waiting for a budget (BUDGET_SPENT, OVER_BUDGET_WAITS): clock ticks look at these.
        self.budget_deferred: dict[str, None] = {}
        # The jobs told no node could hold them: capacity that grows may let them be told their quota reason.
        self.no_node_deferred: dict[str, None] = {}
        self._arrivals = 0
        self._specs: dict[str, JobSubmitted] = {}
        self.policy_version = 0  # bumps on every policy event: cached per-job answers go stale
        self.fleet = Fleet()  # the GPU models the cluster has: a flavor none of its nodes could serve is passed over
        self.flavors_epoch = 0  # bumps with the policy or the fleet: each job's cached flavors go stale
        self.retries = RetryBook()
        self.retry_in: dict[str, float] = {}  # job that failed and runs again -> its backoff
        self.backing_off: dict[str, float] = {}  # job -> not before
        # job whose reservation went back unplaced -> not before (kept apart: a retry is work still to come,
        # this is a job waiting for the cluster to change)
        self.requeued: dict[str, float] = {}
        # preemptor -> when its victims were chosen: quota they free goes to it first (until it lapses)
        self.nominated: dict[str, float] = {}
        # preemptor -> (when its victims were chosen, their job ids): its placement timeout waits for them to leave
        self.victims_of: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._left_waiting: str | None = None
        self._may_give_back_unplaced = True  # False while reacting to an input on which placement may place
        self._lapsed: list[str] = []  # the queues of nominations this clock tick let lapse, for react
        self._backoffs_ended: list[str] = []  # the queues of jobs whose placement backoff new capacity ended
        # (queue, demand, flavors) -> could the queue ever hold that much (_could_ever_fit), at policy version
        self._ever_fits: dict[tuple[str, int, tuple[str, ...]], bool] = {}
        self._ever_fits_version = -1
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        # queue -> (inventory version, flavors epoch, could the present nodes hold each of its waiting jobs)
        self._holdable: dict[str, tuple[int, int, bool]] = {}

    def input_types(self) -> Iterable[type[EventBase]]:
        return (QueuePolicyChanged, PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, JobAdmitted,
                JobCancelled, JobFinished, JobFailed, JobEvicted, PreemptionDecided, ClockTick, JobPlaced, JobStarted,
                PlacementDeferred, NodeLost, NodeCordoned, *_CAPACITY_GREW)

    def reacts_to(self) -> tuple[type[EventBase], ...]:
        """The inputs `react` may decide something about; to any other (a submission, a preemption) it answers
        [] and changes nothing."""
        return (JobAdmitted, JobFinished, JobFailed, JobCancelled, JobEvicted, QueuePolicyChanged,
                PriorityClassesChanged, SchedulingSettingsChanged, ClockTick, JobPlaced, *_CAPACITY_GREW, NodeLost,
                NodeCordoned)

    @property
    def book(self) -> QuotaBook:
        return self.policy.quotas

    # --- state -----------------------------------------------------------------------------------

    def _enqueue(self, job: QuotaJob) -> None:
        job.state = "pending"
        users = self.pending.setdefault(job.queue, {}).setdefault(job.priority, {})
        bisect.insort(users.setdefault(job.user, []), (job.arrival, job.job_id))
        demands = self.demands.setdefault((job.queue, job.priority), {})
        demands[job.demand] = demands.get(job.demand, 0) + 1
        models = self.models.setdefault((job.queue, job.priority), {})
        models[job.spec.gpu_models] = models.get(job.spec.gpu_models, 0) + 1
        by_models = self.demands_by_models.setdefault(job.queue, {}).setdefault(job.spec.gpu_models, {})
        by_models[job.demand] = by_models.get(job.demand, 0) + 1
        bisect.insort(self.by_wait, (job.since, job.arrival, job.job_id))
        bisect.insort(self.by_wait_in.setdefault(job.queue, []), (job.since, job.arrival, job.job_id))
        holdable = self._holdable.get(job.queue)
        if holdable is not None and holdable[2] and not self._inventory_could_hold(job):
            self._holdable[job.queue] = (*holdable[:2], False)

    def _dequeue(self, job: QuotaJob) -> None:
        levels = self.pending[job.queue]
        users = levels[job.priority]
        keys = users[job.user]
        keys.pop(bisect.bisect_left(keys, (job.arrival, job.job_id)))
        if not keys:
            del users[job.user]
            if not users:
                del levels[job.priority]
        demands = self.demands[(job.queue, job.priority)]
        demands[job.demand] -= 1
        if not demands[job.demand]:
            del demands[job.demand]
            if not demands:
                del self.demands[(job.queue, job.priority)]
        models = self.models[(job.queue, job.priority)]
        models[job.spec.gpu_models] -= 1
        if not models[job.spec.gpu_models]:
            del models[job.spec.gpu_models]
            if not models:
                del self.models[(job.queue, job.priority)]
        of_queue = self.demands_by_models[job.queue]
        by_models = of_queue[job.spec.gpu_models]
        by_models[job.demand] -= 1
        if not by_models[job.demand]:
            del by_models[job.demand]
            if not by_models:
                del of_queue[job.spec.gpu_models]
        if (holdable := self._holdable.get(job.queue)) is not None and not holdable[2]:
            del self._holdable[job.queue]  # it may have been the one no node could hold
        key = (job.since, job.arrival, job.job_id)
        for waits in (self.by_wait, self.by_wait_in.get(job.queue, [])):
            i = bisect.bisect_left(waits, key)
            if i < len(waits) and waits[i] == key:
                waits.pop(i)

    def _rerank(self) -> None:
        """Priority classes changed: every job takes its class's new value, waiting ones their new place."""
        for job in self.jobs.values():
            priority = self.policy.priority_of(job.spec)
            if priority == job.priority:
                continue
            if job.state == "pending":
                self._dequeue(job)
                job.priority = priority
                self._enqueue(job)
            else:
                job.priority = priority

    def _use(self, job: QuotaJob, sign: int, now: float) -> None:
        """Usage of the job's queue, user and flavor changes by its demand."""
        half_life = self.policy.settings.fair_share_half_life_s
        self.decayed.setdefault(job.queue, DecayedUsage(since=now)).advance(self.queue_used.get(job.queue, 0),
                                                                            now, half_life)
        self.queue_used[job.queue] = self.queue_used.get(job.queue, 0) + sign * job.demand
        key = (job.queue, job.user)
        self.user_used[key] = self.user_used.get(key, 0) + sign * job.demand
        self.book.add(job.queue, job.flavor, sign * job.demand, job.over_budget)

    def evolve(self, event: EventBase) -> None:
        self._left_waiting = None  # the queue of a waiting job this event ended, for react
        self._lapsed = []
        self._backoffs_ended = []
        self._placed_while_pending = None
        if type(event) is QuotaDeferred:  # by far the most frequent: straight to its case below
            self._deferred(event)
            return
        if isinstance(event, _PLACEMENT_REPORTS):
            self._placement_report(event)
            if not isinstance(event, JobFinished | JobFailed | JobEvicted):
                return
        if isinstance(event, FLEET_EVENTS):
            fleet_version = self.fleet.version
            self.fleet.evolve(event)
            if self.fleet.version != fleet_version:
                self.flavors_epoch += 1
        match event:  # policy events (which no case names) last
            case JobSubmitted():
                self._specs[event.job_id] = event
            case JobAdmitted():
                sub = self._specs.pop(event.job_id, None)
                if sub is None or event.job_id in self.jobs:
                    return
                self._arrivals += 1
                spec = sub.spec
                job = QuotaJob(job_id=event.job_id, queue=spec.queue, user=spec.user or spec.team,
                               priority=self.policy.priority_of(spec), arrival=self._arrivals, since=event.ts,
                               demand=demand_milli(spec), spec=spec)
                self.jobs[event.job_id] = job
                self._enqueue(job)
            case QuotaReserved():
                # A fold of the log (the accounting mirror) can see a decision after the input that ended its
                # job (decisions are published after later inputs); the decider itself never does.
                taken = self.jobs.get(event.job_id)
                if taken is None or taken.state != "pending":
                    return
                job = taken
                self._dequeue(job)
                job.state, job.flavor, job.reserved_at = "reserved", event.flavor or ANY, event.ts
                job.over_budget = event.over_budget
                job.placed, job.placed_while_pending, job.placement_code = job.placed_while_pending, False, ""
                if not job.placed:
                    self.unplaced[job.job_id] = None
                self.reserved.setdefault(job.queue, {})[job.job_id] = None
                self._use(job, +1, event.ts)
                self.deferred.pop(event.job_id, None)
                self.budget_deferred.pop(event.job_id, None)
                self.no_node_deferred.pop(event.job_id, None)
                self.nominated.pop(event.job_id, None)
            case QuotaReleased():
                freed = self.jobs.get(event.job_id)
                if freed is None or freed.state != "reserved":
                    return
                job = freed
                self.reserved[job.queue].pop(job.job_id, None)
                self.unplaced.pop(job.job_id, None)
                self._use(job, -1, event.ts)
                if event.reason == PLACEMENT_TIMEOUT:
                    # Back to its queue in its place in line, its wait toward starvation going on (it never
                    # ran), after a backoff that doubles each time.
                    job.timeouts += 1
                    job.timed_out_flavor = job.flavor
                    self.requeued[job.job_id] = event.ts + placement_backoff_s(job.timeouts)
                    self._enqueue(job)
                elif event.reason == RECLAIMED_UNPLACED:
                    # Its lender took the quota back before any node held it: back in line at once, its wait
                    # going on (it never ran); the lender-first rule keeps it from borrowing meanwhile.
                    self._enqueue(job)
                elif event.reason in ("evicted", "retry"):
                    # Back to its queue with its original arrival (its place in line); its wait toward
                    # starvation starts again. A failed job that runs again waits out its backoff first.
                    job.since = event.ts
                    if event.reason == "retry":
                        self.backing_off[job.job_id] = event.ts + self.retry_in.pop(job.job_id, 0.0)
                    self._enqueue(job)
                else:
                    job.state = "ended"
                    del self.jobs[job.job_id]
                    self.budgets.forget(job.job_id)
            case QuotaDeferred():
                self._deferred(event)
            case PreemptionDecided() if event.preemptor_id in self.jobs:
                self.nominated[event.preemptor_id] = event.ts
                self.victims_of[event.preemptor_id] = (event.ts, tuple(v.job_id for v in event.victims))
            case NodeRegistered() | NodeUncordoned() | GpuHealthChanged():
                if not isinstance(event, GpuHealthChanged) or event.healthy:
                    self._end_placement_backoffs(event.ts)
            case ClockTick():
                for job_id in [j for j, t in self.nominated.items() if event.ts - t > NOMINATION_TTL_S]:
                    del self.nominated[job_id]
                    lapsed = self.jobs.get(job_id)
                    if lapsed is not None and lapsed.state == "pending":
                        self._lapsed.append(lapsed.queue)  # the jobs it held may go now
            case JobFailed() if event.job_id in self.jobs and self.jobs[event.job_id].state == "reserved":
                delay = self.retries.on_failed(event, self.jobs[event.job_id].spec, self.policy)
                if delay is not None:
                    self.retry_in[event.job_id] = delay
            case JobCancelled() | JobFinished() | JobFailed():
                self._end(event.job_id)
            case _ if self.policy.apply(event):
                self.policy_version += 1
                self.flavors_epoch += 1
                if isinstance(event, PriorityClassesChanged):
                    self._rerank()
                elif isinstance(event, QueuePolicyChanged):
                    self._recharge(event.queue.name)

    def _recharge(self, queue: str) -> None:
        """The queue's reservations follow its current flavors (QuotaBook.recharge): usage reserved under a
        flavor the queue no longer has moves to the one that covers its job's model now, so that what the
        queue borrows stays where a lender can reclaim it."""
        for job_id in self.reserved.get(queue, {}):
            job = self.jobs[job_id]
            job.flavor = self.book.recharge(queue, job.flavor, reservation_model(job.flavor, job.model, job.spec),
                                            job.demand, job.over_budget)

    def _end_placement_backoffs(self, now: float) -> None:
        """Capacity grew (a node registered or came back, a GPU is healthy again): a job that waits out its backoff
        after a placement timeout waited for the cluster to change, and it has: it may take quota again now (its
        backoff still doubles if placement again cannot place it), so that no GPU sits idle while it waits."""
        for job_id in self.requeued:
            self.requeued[job_id] = min(self.requeued[job_id], now)
            self._backoffs_ended.append(self.jobs[job_id].queue)

    def _placement_report(self, event: JobPlaced | JobStarted | PlacementDeferred | JobFinished | JobFailed
                          | JobEvicted) -> None:
        """What placement and the executors say about a job: whether its reservation is placed, and its runs."""
        job = self.jobs.get(event.job_id)
        if job is None:
            return
        match event:
            case PlacementDeferred():
                if job.state == "reserved" and not job.placed:
                    job.placement_code = event.code
            case JobPlaced():
                self.budgets.placed(job.job_id, event.placements)
                job.model = next((r.model for r in event.placements if r.model), "")
                if job.state == "reserved":
                    job.placed, job.placement_code = True, ""
                    self.unplaced.pop(job.job_id, None)
                else:  # placed before placement read that its quota went back: react takes the quota again
                    job.placed_while_pending = True
                    self._placed_while_pending = job.job_id
            case JobStarted():
                self.budgets.started(job.job_id, job.queue, job.demand / 1000, event.ts, self._budget_period(job.queue))
            case _:
                self.budgets.stopped(job.job_id, event.ts, self._budget_period(job.queue))

    def _budget_period(self, queue: str) -> str | None:
        spec = self.policy.queues.get(queue)
        return None if spec is None or spec.budget_gpu_hours is None else spec.budget_period

    def _deferred(self, event: QuotaDeferred) -> None:
        self.deferred[event.job_id] = event.code
        if event.code in BUDGET_WAITS:
            self.budget_deferred[event.job_id] = None
        else:
            self.budget_deferred.pop(event.job_id, None)
        if event.code == NO_NODE_COULD_HOLD:
            self.no_node_deferred[event.job_id] = None
        else:
            self.no_node_deferred.pop(event.job_id, None)

    def _end(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        self.deferred.pop(job_id, None)
        self.budget_deferred.pop(job_id, None)
        self.no_node_deferred.pop(job_id, None)
        self.nominated.pop(job_id, None)
        self.victims_of.pop(job_id, None)
        if job.state == "pending":
            self._dequeue(job)
            del self.jobs[job_id]
            self.backing_off.pop(job_id, None)
            self.requeued.pop(job_id, None)
            self.budgets.forget(job_id)
            self._left_waiting = job.queue

    # --- budgets ---------------------------------------------------------------------------------

    def budget_left_s(self, queue: str, now: float) -> float | None:
        """GPU-seconds left in the queue's budget period: what its jobs ran in it, runs going on up to now."""
        spec = self.policy.queues.get(queue)
        if spec is None or spec.budget_gpu_hours is None:
            return None
        return spec.budget_gpu_hours * 3600 - self.budgets.spent_s(queue, now, spec.budget_period)

    # --- decisions -------------------------------------------------------------------------------

    def react(self, trigger: Trigger) -> list[EventBase]:
        event = trigger.event
        if (isinstance(event, ClockTick) and not self.budget_deferred and not self.backing_off and not self.requeued
                and not self.unplaced and not self._lapsed):
            return []  # no job waits for time to pass (see the case below)
        if isinstance(event, JobPlaced) and self._placed_while_pending is None:
            return []
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        now = event.ts
        left_waiting = self._left_waiting  # read first: folding our own decisions resets it
        self._may_give_back_unplaced = not isinstance(event, _CAPACITY_FREED)
        lapsed = self._lapsed
        backoffs_ended = self._backoffs_ended
        placed_while_pending = self._placed_while_pending
        match event:
            case JobPlaced() if placed_while_pending is not None:
                self._take_back(self.jobs[placed_while_pending], out)
            case JobAdmitted():
                job = self.jobs.get(event.job_id)
                if job is not None and job.state == "pending":
                    self._schedule(self._group(job.queue), now, out)
                    if job.state == "pending" and job.job_id not in self.deferred:
                        self._tell_new(job, now, out)
            case JobFinished() | JobFailed() | JobCancelled() | JobEvicted():
                self._release(event, out)
                if left_waiting is not None:
                    # A waiting job left: jobs it held back may go now.
                    self._schedule(self._group(left_waiting), now, out)
            case NodeRegistered() | NodeUncordoned() | GpuHealthChanged():
                # Also the queues of jobs no node could hold: a node that can may be back, and they may
                # starve again (their reason is told anew by the pass).
                grew = {*backoffs_ended, *(self.jobs[j].queue for j in self.no_node_deferred if j in self.jobs)}
                if isinstance(event, GpuHealthChanged) and not event.healthy:
                    grew.update(self._tell_no_node(out))
                for group in self._groups() if grew else ():
                    if not grew.isdisjoint(group):
                        self._schedule(group, now, out)
            case NodeLost() | NodeCordoned():
                shrank = self._tell_no_node(out)
                for group in self._groups() if shrank else ():
                    if not shrank.isdisjoint(group):
                        self._schedule(group, now, out)
            case QueuePolicyChanged() | PriorityClassesChanged() | SchedulingSettingsChanged():
                for group in self._groups():
                    self._schedule(group, now, out)
            case ClockTick():
                # Time alone can change a verdict: a new budget period opens, a backoff ends, a reservation
                # that placement could not place in time goes back, a preemptor's nomination lapses.
                waiting = {self.jobs[j].queue for j in self.budget_deferred}
                waiting.update(lapsed)
                waiting.update(self._give_back_unplaced(now, out))
                waiting.update(self._lenders_of_unplaced())
                for backoffs in (self.backing_off, self.requeued):
                    waiting.update(self.jobs[j].queue for j, t in backoffs.items() if t <= now and j in self.jobs)
                for group in self._groups() if waiting else ():
                    if waiting.intersection(group):
                        self._schedule(group, now, out)
        return out.out

    def _tell_no_node(self, out: Decisions) -> set[str]:
        """Nodes went (lost, cordoned, a GPU sick): a job waiting for quota that no node present could hold any
        more is told so (preemption then stops acting for it), and holds nobody from now on. The queues of the
        jobs that may have held others (those waiting for quota, or for idle quota over budget), for a pass."""
        queues: set[str] = set()
        for job_id, code in list(self.deferred.items()):
            job = self.jobs.get(job_id)
            if (code not in WAITING_FOR_QUOTA and code != OVER_BUDGET_WAITS) or job is None or job.state != "pending":
                continue
            if not self._inventory_could_hold(job):
                queues.add(job.queue)
                if code in WAITING_FOR_QUOTA:
                    self._defer(job, *self._reason(job), out)
        return queues

    def _release(self, event: JobFinished | JobFailed | JobCancelled | JobEvicted, out: Decisions) -> None:
        job = self.jobs.get(event.job_id)
        if job is None or job.state != "reserved":
            return
        reason = "retry" if event.job_id in self.retry_in else type(event).__name__.removeprefix("Job").lower()
        out.emit(QuotaReleased, correlation_id=event.job_id, job_id=event.job_id, queue=job.queue,
                 gpu_milli=job.demand, reason=reason)
        self._schedule(self._group(job.queue), event.ts, out)
        if job.state == "pending" and job.job_id not in self.deferred:
            self._tell_new(job, event.ts, out)  # evicted back into its queue, and not reached by the pass

    def _give_back_unplaced(self, now: float, out: Decisions) -> list[str]:
        """Release the reservations placement deferred and has not placed within the placement timeout, unless
        placement holds capacity for the job (it starves there) or the job's preemption victims are still leaving
        (a checkpoint may take longer than the timeout: the room they free is the job's); the queues that got
        quota back."""
        timeout = self.policy.settings.placement_timeout_s
        if timeout is None or not self.unplaced:
            return []
        expired = [job for j in self.unplaced if (job := self.jobs[j]).placement_code
                   and job.placement_code != CAPACITY_HELD and now - job.reserved_at >= timeout
                   and not self._victims_leaving(j)]
        for job in expired:
            out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                     gpu_milli=job.demand, reason=PLACEMENT_TIMEOUT)
            again = self.requeued.get(job.job_id, now)
            self._defer(job, PLACEMENT_TIMED_OUT, f"no node could hold it within {timeout:g} s of its quota "
                        f"reservation (placement: {job.placement_code or 'deferred'}); its quota went back and it "
                        f"waits again from {again:.0f}", 0, out)
        return [job.queue for job in expired]

    def _victims_leaving(self, job_id: str) -> bool:
        """Does a victim chosen for the job still run the run it was chosen in (it holds the quota it held then)?"""
        decided = self.victims_of.get(job_id)
        if decided is None:
            return False
        at, victims = decided
        return any((v := self.jobs.get(victim)) is not None and v.state == "reserved" and v.reserved_at < at
                   for victim in victims)

    def _take_back(self, job: QuotaJob, out: Decisions) -> None:
        """Placement placed the job before it read that the job's quota went back: the job runs, so it holds
        its quota again, in the flavor it had (the preemption service reclaims what this overdraws)."""
        if job.state != "pending":
            return
        self.requeued.pop(job.job_id, None)
        nominal_left = self.book.nominal_left(job.queue, job.flavor)
        borrowed = job.demand if job.over_budget else max(0, job.demand - nominal_left)
        out.emit(QuotaReserved, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue, gpu_milli=job.demand,
                 flavor=flavor_name(job.flavor), borrowed_milli=borrowed, over_budget=job.over_budget)

    def _group(self, queue: str) -> list[str]:
        cohort = self.book.cohort.get(queue, "")
        return self.book.members[cohort] if cohort else [queue]

    def _groups(self) -> list[list[str]]:
        seen: dict[str, list[str]] = {}
        for queue in sorted(self.pending):
            cohort = self.book.cohort.get(queue, "")
            seen.setdefault(cohort or f"queue:{queue}", self._group(queue))
        return [seen[k] for k in sorted(seen)]

    # --- the fair order ----------------------------------------------------------------------------

    def fair_share(self, queue: str, now: float) -> float:
        """Weighted (decayed) usage relative to nominal quota: 1.0 is exactly the queue's share."""
        spec = self.policy.queues.get(queue)
        half_life = self.policy.settings.fair_share_half_life_s
        used = self._subtree_used(queue, now, half_life)
        nominal = max(self.book.nominal_of(queue), 1)
        return used / nominal / (spec.weight if spec is not None else 1.0)

    def _subtree_used(self, queue: str, now: float, half_life: float) -> float:
        current = self.queue_used.get(queue, 0)
        decayed = self.decayed.get(queue)
        own = (current + decayed.value(current, now, half_life)) / 2 if decayed is not None else current / 2
        return own + sum(self._subtree_used(c, now, half_life) for c in self.book.children.get(queue, ()))

    def _fair_key(self, queue: str, now: float) -> tuple[float, ...]:
        """The queue's fair shares level by level, from the root of its tree down to it."""
        path = [queue]
        while (parent := self.policy.queues[path[-1]].parent if path[-1] in self.policy.queues else ""):
            path.append(parent)
        return tuple(self.fair_share(q, now) for q in reversed(path))

    def _ordered(self, queue: str) -> Order:
        return Order(self, queue)

    # --- the pass ------------------------------------------------------------------------------------

    def _schedule(self, group: list[str], now: float, out: Decisions) -> None:
        p = Pass(now=now)
        p.nominees = nominees(self, group, now)
        self._find_starving(group, p)
        self._lent_out(group, p)
        given_back = self._reclaim_unplaced(group, p, out) if self.unplaced and self._may_give_back_unplaced else []
        self._pass(group, p, out)
        for job in given_back:
            if job.state == "pending" and job.job_id not in self.deferred:
                self._tell_new(job, now, out)  # back in its queue, and not reached by the pass

    def _pass(self, group: list[str], p: Pass, out: Decisions) -> None:
        orders = {q: self._ordered(q) for q in group if self.pending.get(q)}
        if len(orders) == 1:  # one queue waits: its own order is the pass's
            ((queue, order),) = orders.items()
            while (head := self._next_head(queue, order, p, out)) is not None:
                if self._try_reserve(head, p, out):
                    p.reserved()
            return
        heads: dict[str, QuotaJob] = {}
        while orders:
            for q in list(orders):
                if q not in heads:
                    head = self._next_head(q, orders[q], p, out)
                    if head is None:
                        del orders[q]
                    else:
                        heads[q] = head
            if not heads:
                break
            if len(heads) == 1:  # nothing to compare (the order key has no effect but caching)
                best = next(iter(heads.values()))
            else:
                best = min(heads.values(), key=lambda j: self._order_key(j, p))
            del heads[best.queue]
            if self._try_reserve(best, p, out):
                p.reserved()

    def _order_key(self, job: QuotaJob, p: Pass) -> tuple[object, ...]:
        """A job that preempted others goes first: the quota its victims free is its. A queue whose head
        must borrow still ranks as entitled when a smaller job of the head's priority fits its nominal
        quota: that job comes right after the head fails, and quota freed for it (say by a reclaim) must not
        go to a borrower meanwhile."""
        key = p.keys.get(job.job_id)
        if key is None:
            key = p.keys[job.job_id] = (job.job_id not in self.nominated,
                                        not (self._entitled(job, p) or self._level_entitled(job, p)),
                                        self._pass_fair_key(job.queue, p), -job.priority, job.arrival, job.job_id)
        return key

    def _pass_fair_key(self, queue: str, p: Pass) -> tuple[float, ...]:
        key = p.fair.get(queue)
        if key is None:
            key = p.fair[queue] = self._fair_key(queue, p.now)
        return key

    def _level_entitled(self, job: QuotaJob, p: Pass) -> bool:
        if self._over_budget(job.queue, p) or not self.book.governed(job.queue):
            return False
        smallest = min(self.demands.get((job.queue, job.priority), {job.demand: 0}))
        return any(self.book.nominal_left(job.queue, f) >= smallest for f in self._flavors(job))

    def _lent_out(self, group: list[str], p: Pass) -> None:
        """Flavors in which a queue's smallest job that the flavor could serve would fit the queue's own
        nominal quota but not the room its cohort left it: that quota is lent out, so no borrower of the
        flavor grows this pass, whichever of the queue's jobs comes first in its own order. A job held by its
        own user limit or backing off waits for neither, so it freezes nothing."""
        book = self.book
        for q in group:
            levels = self.pending.get(q)
            if not levels or not book.governed(q) or self._over_budget(q, p):
                continue
            lent = [(f, left, room) for f in book.limits[q]
                    if (left := book.nominal_left(q, f)) > (room := book.room(q, f))]
            if not lent:
                continue
            smallest = self._smallest_servable(q, [f for f, _, _ in lent], p.now)
            for f, left, room in lent:
                need = smallest.get(f)
                if need is not None and left >= need > room:
                    p.no_borrowing.add(f)

    def _lenders_of_unplaced(self) -> set[str]:
        """The queues under their nominal quota of a flavor lent to a borrower holding no capacity: a clock tick
        gives it back to them (when the input that made them wait freed capacity, it was left to placement)."""
        book = self.book
        found: set[str] = set()
        for job_id in self.unplaced:
            job = self.jobs[job_id]
            if not holds_no_capacity(self, job):
                continue
            found.update(q for q in self._group(job.queue) if q != job.queue and self.pending.get(q)
                         and book.nominal_left(q, job.flavor) > book.room(q, job.flavor))
        return found

    def _reclaim_unplaced(self, group: list[str], p: Pass, out: Decisions) -> list[QuotaJob]:
        """A queue under its nominal quota whose first job the flavor could serve fits that nominal but not its
        room gets the quota lent to borrowers that hold no capacity back at once (libs/core/quota_reclaim.py);
        no borrower of the flavor grows this pass. The jobs given back."""
        book = self.book
        given_back: list[QuotaJob] = []
        for q in group:
            if not self.pending.get(q) or not book.governed(q) or self._over_budget(q, p):
                continue
            for f in book.limits[q]:
                left = book.nominal_left(q, f)
                if left <= book.room(q, f) or not unplaced_borrowers(self, q, f):
                    continue
                need = lender_need(self, q, f, p.now)
                if need is None:
                    continue
                released = releasable_unplaced(self, q, f, need)
                for job in released:
                    out.emit(QuotaReleased, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                             gpu_milli=job.demand, reason=RECLAIMED_UNPLACED)
                if released:
                    given_back.extend(released)
                    p.no_borrowing.add(f)
                    p.reserved()  # usage changed: what the pass cached goes stale
        return given_back

    def _smallest_servable(self, queue: str, flavors: list[str], now: float) -> dict[str, int]:
        """Per flavor, the smallest waiting job of the queue that flavor could serve now (a job no node present
        could hold is served by none: it holds nobody). Without a user limit, a job backing off or a job no node
        could hold, the index of pending demands per requested models answers it."""
        spec = self.policy.queues.get(queue)
        limit = spec.user_max_gpus if spec is not None else None
        smallest: dict[str, int] = {}
        if limit is None and not any(self.jobs[j].queue == queue for backoffs in (self.backing_off, self.requeued)
                                     for j in backoffs if j in self.jobs) and self._all_holdable(queue):
            for models, demands in self.demands_by_models.get(queue, {}).items():
                need = min(demands)
                for f in flavors:
                    if (f == ANY or not models or f in models) and need < smallest.get(f, UNLIMITED):
                        smallest[f] = need
            return smallest
        for users in self.pending.get(queue, {}).values():
            for user, keys in users.items():
                held = self.user_used.get((queue, user), 0)
                for _, job_id in keys:
                    job = self.jobs[job_id]
                    if max(self.backing_off.get(job_id, now), self.requeued.get(job_id, now)) > now or (
                            limit is not None and held + job.demand > limit * 1000) or (
                            not self._inventory_could_hold(job)):
                        continue
                    for f in flavors:
                        if (f == ANY or not job.spec.gpu_models or f in job.spec.gpu_models) \
                                and job.demand < smallest.get(f, UNLIMITED):
                            smallest[f] = job.demand
        return smallest

    def _all_holdable(self, queue: str) -> bool:
        """Could the present nodes hold every waiting job of the queue (each with every running job gone)? Kept
        until the inventory or the jobs' flavors change; a job that waits anew is checked as it comes
        (_enqueue), and the answer for a queue with a job they could not hold is asked afresh once one leaves."""
        versions = (self.fleet.inventory.version, self.flavors_epoch)
        known = self._holdable.get(queue)
        if known is not None and known[:2] == versions:
            return known[2]
        able = all(self._inventory_could_hold(self.jobs[j]) for users in self.pending.get(queue, {}).values()
                   for keys in users.values() for _, j in keys)
        self._holdable[queue] = (*versions, able)
        return able

    def _next_head(self, queue: str, order: Order, p: Pass, out: Decisions) -> QuotaJob | None:
        """The next job of the queue worth trying; jobs that cannot fit are told why (once) on the way."""
        backing_off = self.backing_off
        requeued = self.requeued
        # None of these changes while the queue's next head is looked for (only trying a head does).
        held = p.held_below.get(queue)
        held_all = p.held_all.get(queue)
        failures = p.failed
        deferred = self.deferred
        version = self.flavors_epoch
        waiting_for_quota = WAITING_FOR_QUOTA
        # The last flavors (interned: see _flavors) and level seen, with what the pass knows of them.
        seen_flavors: tuple[str, ...] | None = None
        seen_failed: int | None = None
        seen_level = -1
        level_skips = False
        for job in order.walk:
            if backing_off or requeued:
                backoffs = backing_off if job.job_id in backing_off else requeued
                not_before = backoffs.get(job.job_id)
                if not_before is not None:
                    if not_before > p.now:
                        if deferred.get(job.job_id) not in BACKING_OFF:
                            self._defer(job, RETRY_BACKOFF, f"it failed and runs again after {not_before:.0f}", 0,
                                        out)
                        continue
                    del backoffs[job.job_id]
            if held is not None and ((held_all is not None and job.priority < held_all)
                                     or not self._usable_flavors(job, p)):
                if held_all is not None and job.priority < held_all and deferred.get(job.job_id) in WAITING_FOR_QUOTA:
                    return None  # everything after it is of lower priority still, held in every flavor, and told
                if self._tells(job, BEHIND_HIGHER_PRIORITY):
                    self._defer(job, BEHIND_HIGHER_PRIORITY,
                                f"a job of higher priority waits for queue {queue}'s quota first", 0, out)
                continue
            if failures:
                flavors = job.flavors if job.flavors_version == version else self._flavors(job)
                if flavors is not seen_flavors:
                    seen_flavors, seen_failed, seen_level = flavors, failures.get((queue, flavors)), -1
                failed = seen_failed
                if failed is not None and job.demand >= failed:
                    if deferred.get(job.job_id) in waiting_for_quota:
                        if job.priority != seen_level:
                            seen_level = job.priority
                            level = (queue, seen_level)
                            smallest = p.smallest.get(level)
                            if smallest is None:
                                smallest = p.smallest[level] = min(self.demands[level])
                            # Nothing of this level is smaller or asks for other models: skip the level.
                            level_skips = failed <= smallest and len(self.models[level]) == 1
                        if level_skips:
                            order.skip_level()
                        continue
                    self._defer(job, *self._quota_reason(job, p), out)
                    continue
            return job
        return None

    def _usable_flavors(self, job: QuotaJob, p: Pass) -> tuple[str, ...]:
        """The flavors the job may take quota of in this pass: its own, less those a job of higher priority
        of its queue waits for (which holds lower jobs back there)."""
        flavors = self._flavors(job) if self.book.governed(job.queue) else (ANY,)
        held = p.held_below.get(job.queue)
        if not held:
            return flavors
        return tuple(f for f in flavors if held.get(f, job.priority) <= job.priority)

    def _flavors(self, job: QuotaJob) -> tuple[str, ...]:
        """The queue's flavors the job may use, in the queue's order, less those of a model no node of the cluster
        could hold it on while another could (quota of a model the cluster lacks would never be placed)."""
        if job.flavors_version != self.flavors_epoch:
            flavors = self.fleet.servable(tuple(self.book.flavors_for(job.queue, job.spec)), job.spec, job.demand)
            job.flavors = self._interned.setdefault(flavors, flavors)  # one object per value: compared by identity
            job.flavors_version = self.flavors_epoch
        return job.flavors

    def _entitled(self, job: QuotaJob, p: Pass) -> bool:
        """Would the job fit within its queue's own nominal quota (lent out or not)? A queue over budget is
        never entitled: it only borrows."""
        if not self.book.governed(job.queue):
            return True
        flavors = self._flavors(job)
        key = (job.queue, job.demand, flavors)
        within = p.within.get(key)
        if within is None:
            within = False
            if not self._over_budget(job.queue, p):
                for f in flavors:
                    if self._quota_left(job.queue, f, p)[0] >= job.demand:
                        within = True
                        break
            p.within[key] = within
        return within

    def _try_reserve(self, job: QuotaJob, p: Pass, out: Decisions) -> bool:
        queue = self.policy.queues.get(job.queue)
        limit = queue.user_max_gpus if queue is not None else None
        # (Codes that do not wait for quota are told whenever they are new: see _tells.)
        if limit is not None and self.user_used.get((job.queue, job.user), 0) + job.demand > limit * 1000:
            if self.deferred.get(job.job_id) != USER_LIMIT:
                self._defer(job, USER_LIMIT, f"user {job.user} already holds "
                            f"{self.user_used.get((job.queue, job.user), 0) / 1000:g} GPUs in queue {job.queue} "
                            f"(limit {limit})", 0, out)
            return False
        over_budget = p.over_budget.get(job.queue)
        if over_budget is None:
            over_budget = self._over_budget(job.queue, p)
        if over_budget and queue is not None and queue.over_budget == "wait":
            if self.deferred.get(job.job_id) != BUDGET_SPENT:
                self._defer(job, BUDGET_SPENT, f"queue {job.queue} spent its {queue.budget_gpu_hours:g} GPU-hour "
                            f"{queue.budget_period}ly budget; it waits for the next period", 0, out)
            return False
        if not self._could_ever_fit(job):
            # Its queue can no longer hold it at all (quota lowered, flavor removed): it waits, holding nothing.
            if self._tells(job, EXCEEDS_QUEUE_QUOTA):
                self._defer(job, *self._reason(job), out)
            return False
        flavors = self._usable_flavors(job, p)
        if job.timed_out_flavor is not None and len(flavors) > 1 and job.timed_out_flavor in flavors:
            # Placement could not place its last reservation of that flavor: another with room is tried first.
            flavors = (*(f for f in flavors if f != job.timed_out_flavor), job.timed_out_flavor)
        held_for_starving = False
        held_by: QuotaJob | None = None  # the preemptor the quota it could take is held for
        borrows = self._may_borrow(job)
        for flavor in flavors:
            nominal_left, room = self._quota_left(job.queue, flavor, p)
            if flavor in p.no_borrowing and (over_budget or job.demand > nominal_left):
                continue  # a queue under nominal waits for lent quota: no borrower grows meanwhile
            if over_budget:  # only what peers lend, never its own nominal
                room = self.book.borrow_only_room(job.queue, flavor)
            elif not borrows:  # it could never give borrowed quota back: its queue's own nominal only
                room = min(room, nominal_left)
            if job.demand > room:
                continue
            if p.rule is not None and self._held_for_starving(job, flavor, nominal_left, over_budget, p):
                held_for_starving = True
                continue
            if p.nominees and (nominee := holding_nominee(self, p.nominees, job, flavor, over_budget,
                                                          p.nominee_effects)) is not None:
                held_by = nominee
                continue
            borrowed = job.demand if over_budget else max(0, job.demand - nominal_left)
            out.emit(QuotaReserved, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue,
                     gpu_milli=job.demand, flavor=flavor_name(flavor), borrowed_milli=borrowed,
                     over_budget=over_budget)
            return True
        if held_by is not None:
            if self.deferred.get(job.job_id) != HELD_FOR_PREEMPTOR:
                at = self.nominated[held_by.job_id]
                self._defer(job, HELD_FOR_PREEMPTOR, f"quota freed by preemption is held for job {held_by.job_id} "
                            f"(its victims chosen at {at:.0f}) until it is reserved, at the latest until "
                            f"{at + NOMINATION_TTL_S:.0f}", 0, out)
            return False
        if held_for_starving:
            starving = p.starving
            if starving is not None and self.deferred.get(job.job_id) != HELD_FOR_STARVING_JOB:
                if not p.held_message:
                    p.held_message = (f"quota is held for job {starving.job_id}, waiting since {starving.since:.0f}; "
                                      "only jobs ending before it can start, or leaving it its room, may go first")
                self._defer(job, HELD_FOR_STARVING_JOB, p.held_message, 0, out)
            return False
        entitled = self._entitled(job, p)
        if borrows:  # (one that may not borrow failing says nothing of those that may)
            key = (job.queue, self._flavors(job))
            p.failed[key] = min(p.failed.get(key, UNLIMITED), job.demand)
        # A job no node present could hold, even with every running job gone, holds nobody: quota kept for it
        # could not start it, so neither the jobs below it nor borrowers wait for it (nor does anyone reclaim
        # for it: it is told so, which preemption does not act on).
        holds_others = self._inventory_could_hold(job)
        if holds_others:
            self._hold_below(job, p)
        if over_budget:
            # Only idle quota of its peers may serve it; evicting anyone for it would be wrong.
            if self._tells(job, OVER_BUDGET_WAITS):
                self._defer(job, OVER_BUDGET_WAITS, f"queue {job.queue} spent its GPU-hour budget; the job waits "
                            "for idle quota its cohort lends", 0, out)
            return False
        # Every quota reason waits for quota: a job told it waits for quota is not told again (see _defer).
        tell = self.deferred.get(job.job_id) not in WAITING_FOR_QUOTA or not holds_others
        if tell:
            code, message, shortfall = self._quota_reason(job, p)
            if p.no_borrowing and code == COHORT_QUOTA_EXHAUSTED:
                message = ("a queue under its nominal quota waits for quota lent out first; no queue borrows more "
                           "meanwhile")
        if entitled and holds_others:
            # It fits its own nominal, yet no room: that quota is lent out. No borrower of it grows now.
            p.no_borrowing.update(f for f in flavors if self._quota_left(job.queue, f, p)[0] >= job.demand)
        if tell:
            self._defer(job, code, message, shortfall, out)
        return False

    def _may_borrow(self, job: QuotaJob) -> bool:
        """May the job use quota its queue borrows? Not a job that cannot be preempted: the lender would never
        get that quota back while it runs (as KAI Scheduler keeps such jobs within their queue's quota)."""
        return self.policy.preemptible(job.spec)

    def _hold_below(self, job: QuotaJob, p: Pass) -> None:
        """The job did not get quota: lower jobs of its queue wait behind it in the flavors it could use."""
        held = p.held_below.setdefault(job.queue, {})
        for f in self._flavors(job) if self.book.governed(job.queue) else (ANY,):
            if held.get(f, job.priority) <= job.priority:
                held[f] = job.priority
        everywhere = [held.get(f) for f in (self.book.limits.get(job.queue) or (ANY,))]
        if all(prio is not None for prio in everywhere):
            p.held_all[job.queue] = min(prio for prio in everywhere if prio is not None)

    def _quota_left(self, queue: str, flavor: str, p: Pass) -> tuple[int, int]:
        """What is left of the queue's nominal quota of the flavor, and its room; kept until the pass reserves."""
        key = (queue, flavor)
        left = p.quota.get(key)
        if left is None:
            left = p.quota[key] = (self.book.nominal_left(queue, flavor), self.book.room(queue, flavor))
        return left

    def _over_budget(self, queue: str, p: Pass) -> bool:
        if queue not in p.over_budget:
            left = self.budget_left_s(queue, p.now)
            p.over_budget[queue] = left is not None and left <= 0
        return p.over_budget[queue]

    def _quota_reason(self, job: QuotaJob, p: Pass | None = None) -> tuple[str, str, int]:
        """Why the job's queue cannot take it now (by its first flavor), with the shortfall. Within a pass
        (`p`) the answer is kept until the next reservation."""
        if p is None:
            return self._reason(job)
        key = (job.queue, job.demand if self._may_borrow(job) else -job.demand, self._flavors(job),
               self._inventory_could_hold(job))  # (two jobs alike to quota may differ in shape, hence to the nodes)
        reason = p.reasons.get(key)
        if reason is None:
            reason = p.reasons[key] = self._reason(job)
        return reason

    def _reason(self, job: QuotaJob) -> tuple[str, str, int]:
        borrows = self._may_borrow(job)
        if not self._could_ever_fit(job):
            flavors = self._flavors(job)
            most = max((self.book.ceiling(job.queue, f, borrows) for f in flavors), default=0)
            models = ", ".join(job.spec.gpu_models) or "any model"
            what = "borrowing included" if borrows else "within its nominal quota (the job cannot be preempted)"
            held = (f"can hold at most {most / 1000:g} GPUs of {models}, {what}" if flavors
                    else f"has no quota for {models} any more")
            return (EXCEEDS_QUEUE_QUOTA, f"the job needs {job.demand / 1000:g} GPUs; queue {job.queue} {held}: it "
                    "waits, holding nothing, until the queue's quota can hold it", job.demand - most)
        if not self._inventory_could_hold(job):
            return (NO_NODE_COULD_HOLD, f"the job needs {job.demand / 1000:g} GPUs and no node present (registered, "
                    "healthy, not cordoned) could hold it even with every running job gone: it holds no quota for "
                    "itself, and waits until a node that could hold it registers", job.demand)
        flavor = (self._flavors(job) or (ANY,))[0]
        lim = self.book.limits.get(job.queue, {}).get(flavor)
        nominal = lim.nominal if lim is not None else 0
        used = self.book.usage(job.queue, flavor)
        room = self.book.room(job.queue, flavor)
        shortfall = max(0, job.demand - room)
        where = f"queue {job.queue}" + (f" ({flavor})" if flavor != ANY else "")
        ceiling = self.book.ceiling(job.queue, flavor)
        if not borrows and used + job.demand > nominal:
            return (NOMINAL_QUOTA_ONLY, f"{where} holds {used / 1000:g} of its nominal {nominal / 1000:g} GPUs; the "
                    f"job needs {job.demand / 1000:g} and, as it cannot be preempted, never borrows",
                    used + job.demand - nominal)
        if used + job.demand > ceiling:
            return (QUEUE_QUOTA_EXHAUSTED, f"{where} holds {used / 1000:g} of at most {ceiling / 1000:g} GPUs "
                    f"(nominal {nominal / 1000:g}); the job needs {job.demand / 1000:g}", shortfall)
        parent_room = self.book.parent_room(job.queue, flavor)
        if parent_room < job.demand:
            return (PARENT_QUOTA_EXHAUSTED, f"{where} has room, but its parent's quota bounds the queues under it and "
                    f"leaves {parent_room / 1000:g} GPUs; the job needs {job.demand / 1000:g}",
                    job.demand - parent_room)
        if used + job.demand <= nominal:
            return (QUOTA_LENT_OUT, f"{where} is under its nominal quota but {shortfall / 1000:g} GPUs of it are "
                    f"lent to other queues of its cohort", shortfall)
        return (COHORT_QUOTA_EXHAUSTED, f"{where} must borrow {shortfall / 1000:g} more GPUs and its cohort has "
                "no idle quota to lend", shortfall)

    def _tell_new(self, job: QuotaJob, now: float, out: Decisions) -> None:
        levels = self.pending.get(job.queue)
        if levels and max(levels) > job.priority:
            self._defer(job, BEHIND_HIGHER_PRIORITY,
                        f"a job of higher priority waits for queue {job.queue}'s quota first", 0, out)
        else:
            self._defer(job, *self._quota_reason(job), out)

    def _tells(self, job: QuotaJob, code: str) -> bool:
        """Would deferring the job with `code` tell it something new (see _defer)?"""
        told = self.deferred.get(job.job_id)
        return told != code and not (told in WAITING_FOR_QUOTA and code in WAITING_FOR_QUOTA)

    def _defer(self, job: QuotaJob, code: str, message: str, shortfall: int, out: Decisions) -> None:
        """Tell the job why it waits, unless it was told so already. Waiting for quota (whichever limit
        binds, or behind a job of higher priority) counts as one reason here: which one applies shifts with
        every reservation, and re-telling each waiting job every time would flood the log without changing
        what anyone does about it."""
        told = self.deferred.get(job.job_id)
        if told != code and not (told in WAITING_FOR_QUOTA and code in WAITING_FOR_QUOTA):
            out.emit(QuotaDeferred, correlation_id=job.job_id, job_id=job.job_id, queue=job.queue, code=code,
                     message=message, shortfall_milli=shortfall)

    # --- starvation ----------------------------------------------------------------------------------

    def _find_starving(self, group: list[str], p: Pass) -> None:
        """The group's starving job, by the rule placement shares (starvation.longest_waiting): its longest-waiting
        job past the limit that may starve (_may_starve), and when its quota frees up by the reserved jobs'
        declared runtimes (the shadow time backfill must end by; unknown when they do not say: then no job
        backfills)."""
        limit = self.policy.settings.starvation_after_s
        if limit is None or not self.by_wait or p.now - self.by_wait[0][0] < limit:
            return
        # The group's waiting jobs, longest waiting first (as in by_wait).
        waits = [w for q in group if (w := self.by_wait_in.get(q))]
        oldest = longest_waiting(((since, self.jobs[job_id]) for since, _, job_id in
                                  (waits[0] if len(waits) == 1 else heapq.merge(*waits))), p.now, limit,
                                 self._may_starve)
        if oldest is None:
            return
        flavors = self._flavors(oldest) or (ANY,)
        holding = [j for q in group for j_id in self.reserved.get(q, {}) if (j := self.jobs[j_id]).flavor in flavors]
        shadow = reservations_shadow(self.book, oldest, flavors, holding, p.now)
        if shadow is None:
            return  # it could not fit even with every reservation gone: it holds nobody
        p.starving = oldest
        p.rule = Starving(job_id=oldest.job_id, priority=oldest.priority, shadow=shadow.at)
        p.ending = shadow.ending

    def _may_starve(self, job: QuotaJob) -> bool:
        """May the job, past the starvation limit, be the starving job? Only one waiting for quota (not for its
        user limit or budget) that its queue could ever hold and a node present could hold (the shared rule)."""
        return (self.deferred.get(job.job_id) in WAITING_OR_HELD and self._could_ever_fit(job)
                and self._inventory_could_hold(job))

    def _inventory_could_hold(self, job: QuotaJob) -> bool:
        """Could the present nodes (healthy GPUs, registered, not lost nor cordoned) hold the job with every
        running job gone, by placement's fit? A job they could not hold is no starving job: holding quota for
        it would keep idle GPUs idle for a job that cannot start (libs/core/starvation.py)."""
        return self.fleet.could_place(self._flavors(job) or (ANY,), job.spec)

    def _could_ever_fit(self, job: QuotaJob) -> bool:
        if not self.book.governed(job.queue):
            return True
        # Ceilings change with policy alone: the answers are kept per policy version.
        if self._ever_fits_version != self.policy_version:
            self._ever_fits.clear()
            self._ever_fits_version = self.policy_version
        borrows = self._may_borrow(job)
        key = (job.queue, job.demand if borrows else -job.demand, self._flavors(job))  # one key per borrowing rule
        fits = self._ever_fits.get(key)
        if fits is None:
            fits = self._ever_fits[key] = any(self.book.ceiling(job.queue, f, borrows) >= job.demand for f in key[2])
        return fits

    def _held_for_starving(self, job: QuotaJob, flavor: str, nominal_left: int, over_budget: bool, p: Pass) -> bool:
        """Must the job, about to take quota of `flavor`, wait for the starving job (libs/core/starvation.py)?
        A job of another queue within its own queue's nominal quota never does: that quota is its queue's,
        whoever starves elsewhere."""
        starving = p.starving
        if starving is None or (job.queue != starving.queue and not over_budget and job.demand <= nominal_left):
            return False
        return holds(p.rule, job.job_id, job.priority, job.spec.duration_s, p.now,
                     lambda: self._room_effect(job, flavor, over_budget, p))

    def _room_effect(self, job: QuotaJob, flavor: str, over_budget: bool, p: Pass) -> RoomEffect:
        """Would reserving the job in `flavor` shrink the room the starving job could use, and would the
        starving job still fit beside it at its shadow time (the reservations ending by then gone)?"""
        key = (job.queue, flavor, job.demand, over_budget)
        effect = p.effects.get(key)
        if effect is not None:
            return effect
        starving = p.starving
        if starving is None:
            return (False, False)
        effect = p.effects[key] = reservation_effect(self.book, starving, self._flavors(starving) or (ANY,),
                                                     p.ending, job, flavor, over_budget)
        return effect

    def snapshot(self) -> bytes:
        return msgspec.json.encode({
            "used": {q: u for q, u in sorted(self.queue_used.items()) if u},
            "book": {f"{q}/{f}": u for (q, f), u in sorted(self.book.used.items()) if u},
            "pending": {q: sorted(j for users in levels.values() for keys in users.values() for _, j in keys)
                        for q, levels in sorted(self.pending.items()) if levels},
            "jobs": {k: (j.queue, j.state, j.demand) for k, j in sorted(self.jobs.items())},
        })
