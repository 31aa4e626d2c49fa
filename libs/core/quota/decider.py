"""Quota: which admitted job may take GPU quota now, from which flavor, in fair order.

A scheduling pass runs over a cohort (or a queue without one) whenever its quota or its waiting work
changes. It repeatedly takes the best head among the cohort's queues:
  1. jobs that fit within their queue's nominal quota before jobs that must borrow,
  2. the queue furthest below its fair share: weighted (decayed) usage relative to nominal, compared level
     by level down the queue tree (Slurm's Fair Tree),
  3. priority, then arrival, then id.
Inside a queue the order is priority, then the user holding the fewest GPUs in that queue, then arrival.

A job that does not get quota holds back the jobs of lower priority in its queue, in the flavors it could use (so
quota freed for it, e.g. by preemption, is not taken by the jobs it displaced); jobs of its own priority may use
what is left, and lower ones any other flavor. While a queue under its nominal quota waits for quota of a flavor
lent to borrowers, with a job that quota could serve (not one held by its own user limit), no borrower of that
flavor grows (libs/core/quota/reclaim.py). A queue's reservations follow its flavors when its policy
changes (QuotaBook.recharge). A job that cannot be preempted (its class says so) uses only its queue's own nominal
quota, never borrowed quota: its lender could never get that back. A parent queue's quota bounds its whole subtree
(QuotaBook.parent_room). A preemptor whose victims were chosen comes first and holds the quota they free until it
is reserved or its nomination lapses (libs/core/quota/nomination.py). A job waiting longer than the starvation
limit gets the quota it could use held for it (libs/core/kernel/starvation.py: the rule placement shares). A job its
queue can no longer hold at all (its quota was lowered, or its flavor removed) is told so and waits holding
nothing; so does one no node present could hold, even with every running job gone, told so as nodes go, shrink (a
node registering again smaller, or with MIG on) or lose GPUs (it holds no job below it, freezes no borrower, and
nobody reclaims for it), though it still takes quota that is free. Per-user limits and GPU-hour budgets (charged
for run time: accounting/budgets.py) are checked per job. A reservation that placement has not placed within the
settings' placement timeout goes back, and its job waits again after a backoff. Each waiting job gets one
QuotaDeferred per reason, which the preemption service uses to reclaim quota.

The decider's parts, one job each: quota_fold (the fold of inputs and decisions into its state), quota_pass
(the scheduling pass), quota_walk (a queue's next job worth trying), quota_reserve (trying one job), quota_order
(the fair order), quota_fit (where a job could fit), quota_reasons (why a job waits, and telling it),
quota_starvation, quota_nomination, quota_reclaim, quota_timeout (reservations placement does not place in
time) and quota_fleet (the GPU models present). What keeps a pass's cost flat as queues grow, deciding exactly
what the long way would: quota_reach (queues a pass need not look at), quota_heads (each queue's head and order
key kept between passes) and quota_calm (a cohort's calm queues kept ranked).
"""

from __future__ import annotations

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
    QuotaReleased,
    SchedulingSettingsChanged,
)
from libs.core.accounting.budgets import BudgetBook
from libs.core.kernel.attained_service import AttainedService
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.fairness import DecayedUsage
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.quota_math import QuotaBook
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.kernel.wait_reasons import (
    BACKING_OFF,
    BEHIND_HIGHER_PRIORITY,
    BUDGET_SPENT,
    BUDGET_WAITS,
    COHORT_QUOTA_EXHAUSTED,
    EXCEEDS_QUEUE_QUOTA,
    HELD_FOR_PREEMPTOR,
    HELD_FOR_STARVING_JOB,
    NO_NODE_COULD_HOLD,
    NOMINAL_QUOTA_ONLY,
    OVER_BUDGET_WAITS,
    PARENT_QUOTA_EXHAUSTED,
    PLACEMENT_TIMED_OUT,
    PREEMPTION_MAY_HELP,
    QUEUE_QUOTA_EXHAUSTED,
    QUOTA_LENT_OUT,
    RETRY_BACKOFF,
    USER_LIMIT,
    WAITING_FOR_QUOTA,
    WAITING_OR_HELD,
)
from libs.core.quota.fit import group_of, groups
from libs.core.quota.fleet import Fleet
from libs.core.quota.fold import fold
from libs.core.quota.order import fair_share as queue_fair_share
from libs.core.quota.reasons import tell_new, tell_no_node
from libs.core.quota.scheduling_pass import schedule
from libs.core.quota.state import QuotaJob
from libs.core.quota.timeout import (
    PLACEMENT_BACKOFF_MAX_S,
    PLACEMENT_BACKOFF_S,
    PLACEMENT_TIMEOUT,
    give_back_unplaced,
    placement_backoff_s,
    take_back,
)

__all__ = [
    "BACKING_OFF",
    "BEHIND_HIGHER_PRIORITY",
    "BUDGET_SPENT",
    "BUDGET_WAITS",
    "COHORT_QUOTA_EXHAUSTED",
    "EXCEEDS_QUEUE_QUOTA",
    "HELD_FOR_PREEMPTOR",
    "HELD_FOR_STARVING_JOB",
    "NOMINAL_QUOTA_ONLY",
    "NOMINATION_TTL_S",
    "NO_NODE_COULD_HOLD",
    "OVER_BUDGET_WAITS",
    "PARENT_QUOTA_EXHAUSTED",
    "PLACEMENT_BACKOFF_MAX_S",
    "PLACEMENT_BACKOFF_S",
    "PLACEMENT_TIMED_OUT",
    "PLACEMENT_TIMEOUT",
    "PREEMPTION_MAY_HELP",
    "QUEUE_QUOTA_EXHAUSTED",
    "QUOTA_LENT_OUT",
    "RETRY_BACKOFF",
    "SERVICE",
    "USER_LIMIT",
    "WAITING_FOR_QUOTA",
    "WAITING_OR_HELD",
    "QuotaDecider",
    "placement_backoff_s",
]

SERVICE = "quota"
# Capacity that may let a job placement could not place go: the wait after a placement timeout ends on these.
_CAPACITY_GREW = (NodeRegistered, NodeUncordoned, GpuHealthChanged)


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
        self.attained = AttainedService()  # GPU time each job held over its runs (least attained service)
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
        # The preemptors with a victim chosen by least attained service (of their queue and priority): no
        # starving job holds the quota their victims free against them (quota_starvation.held_for_starving).
        self.las_nominated: dict[str, None] = {}
        # preemptor -> (when its victims were chosen, their job ids): its placement timeout waits for them to leave
        self.victims_of: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._left_waiting: str | None = None
        self._lapsed: list[str] = []  # the queues of nominations this clock tick let lapse, for react
        self._backoffs_ended: list[str] = []  # the queues of jobs whose placement backoff new capacity ended
        # (queue, demand, flavors) -> could the queue ever hold that much (quota_fit.could_ever_fit), at policy version
        self._ever_fits: dict[tuple[str, int, tuple[str, ...]], bool] = {}
        self._ever_fits_version = -1
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        # queue -> (inventory version, flavors epoch, could the present nodes hold each of its waiting jobs)
        self._holdable: dict[str, tuple[int, int, bool]] = {}
        # queue -> (policy version, flavors epoch, could the queue ever hold each of its waiting jobs)
        self._fitting: dict[str, tuple[int, int, bool]] = {}
        # queue -> its waiting jobs not told they wait for quota (a pass may have something to tell them)
        self.loud: dict[str, dict[str, None]] = {}
        self.qver: dict[str, int] = {}  # queue -> bumps whenever something of its own changes (quota_fold.touched)
        self.cohort_demands: dict[str, dict[int, int]] = {}  # cohort -> waiting demand -> jobs
        # queue -> (when, its head at the start of a pass, that head's order key): see quota_heads
        self.heads: dict[str, tuple[tuple[object, ...], str, tuple[object, ...]]] = {}
        # The calm queues of each cohort in fair order (libs/core/quota/calm.py): cohort -> its waiting queues,
        # its heap of calm ones, the versions it was ranked at, those touched since a pass looked, and those not
        # calm when last looked at.
        self.waiting_in: dict[str, dict[str, None]] = {}
        self.calm: dict[str, list[tuple[tuple[object, ...], str, tuple[object, ...]]]] = {}
        self.calm_at: dict[str, tuple[object, ...]] = {}
        self.stirred: dict[str, dict[str, None]] = {}
        self.restless: dict[str, dict[str, None]] = {}
        # queue -> (when, is it quiet: see quota_reach.quiet)
        self.quiet: dict[str, tuple[tuple[int, ...], bool]] = {}
        self._cohort_flavors: tuple[int, dict[str, tuple[str, ...]]] = (-1, {})

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

    def evolve(self, event: EventBase) -> None:
        fold(self, event)

    def budget_left_s(self, queue: str, now: float) -> float | None:
        """GPU-seconds left in the queue's budget period: what its jobs ran in it, runs going on up to now."""
        spec = self.policy.queues.get(queue)
        if spec is None or spec.budget_gpu_hours is None:
            return None
        return spec.budget_gpu_hours * 3600 - self.budgets.spent_s(queue, now, spec.budget_period)

    def fair_share(self, queue: str, now: float) -> float:
        """Weighted (decayed) usage relative to nominal quota: 1.0 is exactly the queue's share."""
        return queue_fair_share(self, queue, now)

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
        lapsed = self._lapsed
        backoffs_ended = self._backoffs_ended
        placed_while_pending = self._placed_while_pending
        match event:
            case JobPlaced() if placed_while_pending is not None:
                take_back(self, self.jobs[placed_while_pending], out)
            case JobAdmitted():
                job = self.jobs.get(event.job_id)
                if job is not None and job.state == "pending":
                    schedule(self, group_of(self, job.queue), now, out)
                    if job.state == "pending" and job.job_id not in self.deferred:
                        tell_new(self, job, now, out)
            case JobFinished() | JobFailed() | JobCancelled() | JobEvicted():
                self._release(event, out)
                if left_waiting is not None:
                    # A waiting job left: jobs it held back may go now.
                    schedule(self, group_of(self, left_waiting), now, out)
            case NodeRegistered() | NodeUncordoned() | GpuHealthChanged():
                # Also the queues of jobs no node could hold: a node that can may be back, and they may
                # starve again (their reason is told anew by the pass).
                changed = {*backoffs_ended, *(self.jobs[j].queue for j in self.no_node_deferred if j in self.jobs)}
                if isinstance(event, NodeRegistered) or (isinstance(event, GpuHealthChanged) and not event.healthy):
                    # Capacity may have shrunk too: a GPU turned sick, or a node registered again smaller
                    # (fewer GPUs, MIG on), so a waiting job no node could hold any more holds nobody now.
                    changed.update(tell_no_node(self, out))
                for group in groups(self) if changed else ():
                    if not changed.isdisjoint(group):
                        schedule(self, group, now, out)
            case NodeLost() | NodeCordoned():
                shrank = tell_no_node(self, out)
                for group in groups(self) if shrank else ():
                    if not shrank.isdisjoint(group):
                        schedule(self, group, now, out)
            case QueuePolicyChanged() | PriorityClassesChanged() | SchedulingSettingsChanged():
                for group in groups(self):
                    schedule(self, group, now, out)
            case ClockTick():
                # Time alone can change a verdict: a new budget period opens, a backoff ends, a reservation
                # that placement could not place in time goes back, a preemptor's nomination lapses.
                waiting = {self.jobs[j].queue for j in self.budget_deferred}
                waiting.update(lapsed)
                waiting.update(give_back_unplaced(self, now, out))
                for backoffs in (self.backing_off, self.requeued):
                    waiting.update(self.jobs[j].queue for j, t in backoffs.items() if t <= now and j in self.jobs)
                for group in groups(self) if waiting else ():
                    if waiting.intersection(group):
                        schedule(self, group, now, out)
        return out.out

    def _release(self, event: JobFinished | JobFailed | JobCancelled | JobEvicted, out: Decisions) -> None:
        job = self.jobs.get(event.job_id)
        if job is None or job.state != "reserved":
            return
        reason = "retry" if event.job_id in self.retry_in else type(event).__name__.removeprefix("Job").lower()
        out.emit(QuotaReleased, correlation_id=event.job_id, job_id=event.job_id, queue=job.queue,
                 gpu_milli=job.demand, reason=reason)
        schedule(self, group_of(self, job.queue), event.ts, out)
        if job.state == "pending" and job.job_id not in self.deferred:
            tell_new(self, job, event.ts, out)  # evicted back into its queue, and not reached by the pass

    def snapshot(self) -> bytes:
        return msgspec.json.encode({
            "used": {q: u for q, u in sorted(self.queue_used.items()) if u},
            "book": {f"{q}/{f}": u for (q, f), u in sorted(self.book.used.items()) if u},
            "pending": {q: sorted(j for users in levels.values() for keys in users.values() for _, j in keys)
                        for q, levels in sorted(self.pending.items()) if levels},
            "jobs": {k: (j.queue, j.state, j.demand) for k, j in sorted(self.jobs.items())},
        })
