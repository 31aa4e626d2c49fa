"""Quota: which admitted job may take GPU quota now, from which flavor, in fair order.

A scheduling cycle runs over a cohort (or a queue without one) whenever its quota or its waiting work
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
settings' placement timeout is asked back (QuotaRecalled) and goes back once placement lets its job go, and
its job waits again after a backoff. Each waiting job gets one
QuotaDeferred per reason, which the preemption service uses to reclaim quota.

The package's parts (libs/core/quota/), one job each: state (the decider's state as data), fold (one handler
per event type), waiting and usage (the waiting jobs' indexes, the usage reservations charge), reactions (what
each trigger decides), cycle (the scheduling cycle), next_head (a queue's next job worth trying), reserve
(trying one job), order (the fair order and a queue's order), fit (where a job could fit), reasons (why a job
waits, and telling it), starvation, nomination, reclaim, timeout (reservations placement does not place in
time) and fleet (the GPU models present). What keeps a cycle's cost flat as queues grow, deciding exactly what
the long way would, lives apart in shortcuts/: skipped_queues (queues a cycle need not look at), kept_heads
(each queue's head and order key kept between cycles), ranked_queues (a cohort's queues kept ranked),
repeated_holds (a job that would only be held for the starving job again), kept_shadow (the starving job's
shadow kept while the usage it reads stays) and request_shapes (answers shared by jobs asking alike).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from contracts import (
    ClockTick,
    EventBase,
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
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    SchedulingSettingsChanged,
)
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.dependencies import PassDependencies, Reads
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.quota_figures import fair_share
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
from libs.core.quota.fold import fold
from libs.core.quota.reactions import CAPACITY_GREW, REACTIONS, after_fold, decides_nothing
from libs.core.quota.state import QuotaState
from libs.core.quota.timeout import PLACEMENT_BACKOFF_MAX_S, PLACEMENT_BACKOFF_S, PLACEMENT_TIMEOUT, placement_backoff_s

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
# What a quota pass reads; its triggers follow (libs/core/kernel/dependencies.py), and REACTIONS answers each.
PASS = PassDependencies(
    reads=(Reads.QUEUES | Reads.CLASSES | Reads.SETTINGS | Reads.NODES | Reads.FREED | Reads.SUBMISSIONS
           | Reads.ARRIVALS | Reads.HELD | Reads.RESERVED | Reads.DEFERRALS | Reads.NOMINATIONS | Reads.RUNS
           | Reads.CLOCK | Reads.RECALLS),
    not_triggered={
        Reads.SUBMISSIONS: "a submission is only kept until its admission, which triggers a pass",
        Reads.DEFERRALS: "a deferral (its own, or placement's word on a reservation) frees no quota; a reservation "
                         "placement cannot place is asked back on a tick (the placement timeout), and goes back "
                         "on placement's answer (RECALLS)",
        Reads.NOMINATIONS: "a nomination only puts its preemptor first and holds others back; the quota its victims "
                           "free comes back with their end, a trigger, and a lapse is noted on a tick",
        Reads.RUNS: "GPU time spent changes a verdict only as it accrues: a tick notes a budget that ran out "
                    "(fold.budgets_turned)",
    })


class QuotaDecider:
    """The quota decider: its state (QuotaState, `state`), folded by libs/core/quota/fold.py, and its react, which
    hands each trigger to its reaction (libs/core/quota/reactions.py): scheduling cycles (libs/core/quota/cycle.py)
    over the groups of queues the trigger may change."""

    name = SERVICE

    def __init__(self) -> None:
        self.state = QuotaState()
        self.chain = Chain()

    @property
    def runs(self) -> CurrentRuns:
        """The state's book of current runs: executors' reports about runs that are over never reach it
        (run_decider)."""
        return self.state.runs

    def input_types(self) -> Iterable[type[EventBase]]:
        return (QueuePolicyChanged, PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, JobAdmitted,
                JobCancelled, JobFinished, JobFailed, JobEvicted, PreemptionDecided, ClockTick, JobPlaced, JobStarted,
                PlacementDeferred, NodeLost, NodeCordoned, *CAPACITY_GREW)

    def reacts_to(self) -> tuple[type[EventBase], ...]:
        """The inputs `react` may decide something about: those that change what a pass reads (PASS); to any
        other (a submission, a preemption) it answers [] and changes nothing."""
        return PASS.triggers(self.input_types())

    def fold(self, event: EventBase) -> None:
        fold(self.state, event)  # (the kernel's name for the fold)

    def fair_share(self, queue: str, now: float) -> float:
        """Weighted (decayed) usage relative to nominal quota: 1.0 is exactly the queue's share."""
        return fair_share(self.state, queue, now)

    def react(self, trigger: Trigger) -> list[EventBase]:
        event = trigger.event
        reaction = REACTIONS.get(type(event))
        state = self.state
        if reaction is None or decides_nothing(state, event):
            return []
        after = after_fold(state)  # read first: folding the decisions made below clears it
        out = Decisions(SERVICE, trigger, self.fold, self.chain)
        reaction(state, event, after, out)
        return out.out

    def snapshot(self) -> bytes:
        state = self.state
        return msgspec.json.encode({
            "used": {q: u for q, u in sorted(state.queue_used.items()) if u},
            "book": {f"{q}/{f}": u for (q, f), u in sorted(state.book.used.items()) if u},
            "pending": {q: sorted(j for users in levels.values() for keys in users.values() for _, j in keys)
                        for q, levels in sorted(state.pending.items()) if levels},
            "jobs": {k: (j.queue, j.state, j.demand) for k, j in sorted(state.jobs.items())},
        })
