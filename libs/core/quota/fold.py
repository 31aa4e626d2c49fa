"""The quota decider's fold: one handler per event type, each saying how that input, or one of the decider's own
decisions, changes the state (libs/core/quota/state.py). A job waits in its queue's indexes
(libs/core/quota/waiting.py) from its admission until quota is reserved for it, and again whenever its
reservation goes back; a reservation charges its queue's, user's and flavor's usage (libs/core/quota/usage.py);
placement's and the executors' reports mark reservations placed and charge budgets; the fleet, the policy and
the clock change what the next cycle sees. Nothing is decided here: react (libs/core/quota/decider.py) does that
after the fold, reading what the last event left for it (`left_waiting`, `lapsed`, `backoffs_ended`,
`returned`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.kernel.attained_service import least_served
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.quota_figures import budget_period
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.wait_reasons import BUDGET_WAITS, NO_NODE_COULD_HOLD, RESERVATION_RETURNED, WAITING_FOR_QUOTA
from libs.core.quota.state import QuotaJob, QuotaState
from libs.core.quota.timeout import PLACEMENT_TIMEOUT, end_placement_backoffs, placement_backoff_s
from libs.core.quota.usage import charge, recharge, usage_changed
from libs.core.quota.waiting import count_demand, dequeue, enqueue, queue_changed, relevel, rerank


def fold(state: QuotaState, event: EventBase) -> None:
    """Fold one event into the state. An event of a type no handler names changes nothing (unless the policy
    takes it)."""
    # What the last event left for react, cleared before each.
    state.left_waiting = None
    state.lapsed = []
    state.backoffs_ended = []
    state.budget_turned = []
    state.returned = None
    FOLDS.get(type(event), fold_policy)(state, event)


# --- jobs ------------------------------------------------------------------------------------------------


def fold_submitted(state: QuotaState, event: JobSubmitted) -> None:
    state.submitted[event.job_id] = event  # its spec, for when it is admitted


def fold_admitted(state: QuotaState, event: JobAdmitted) -> None:
    submission = state.submitted.pop(event.job_id, None)
    if submission is None or event.job_id in state.jobs:
        return
    state.arrivals += 1
    spec = submission.spec
    job = QuotaJob(job_id=event.job_id, queue=spec.queue, user=spec.user or spec.team,
                   priority=state.policy.priority_of(spec), arrival=state.arrivals, since=event.ts,
                   demand=demand_milli(spec), spec=spec)
    state.jobs[event.job_id] = job
    enqueue(state, job)


def fold_cancelled(state: QuotaState, event: JobCancelled) -> None:
    end(state, event.job_id)


def end(state: QuotaState, job_id: str) -> None:
    """The job is over: forget what waited on it; a waiting one leaves its queue (react cycles over its queue)."""
    job = state.jobs.get(job_id)
    if job is None:
        return
    state.deferred.pop(job_id, None)
    state.budget_deferred.pop(job_id, None)
    state.judged_on_nodes.pop(job_id, None)
    state.nominated.pop(job_id, None)
    state.attained.forget(job_id)
    state.las_nominated.pop(job_id, None)
    state.victims_of.pop(job_id, None)
    state.recalled.pop(job_id, None)
    state.backing_off.pop(job_id, None)
    state.requeued.pop(job_id, None)
    if job.state == "pending":
        dequeue(state, job)
        del state.jobs[job_id]
        state.budgets.forget(job_id)
        state.left_waiting = job.queue


# --- the decider's own decisions ------------------------------------------------------------------------


def fold_reserved(state: QuotaState, event: QuotaReserved) -> None:
    # A fold of the log (the accounting mirror) can see a decision after the input that ended its job
    # (decisions are published after later inputs); the decider itself never does.
    job = state.jobs.get(event.job_id)
    if job is None or job.state != "pending":
        return
    dequeue(state, job)
    job.state, job.flavor, job.reserved_at = "reserved", event.flavor or ANY, event.ts
    job.over_budget = event.over_budget
    job.placed, job.placement_code = False, ""
    state.unplaced[job.job_id] = None
    state.reserved.setdefault(job.queue, {})[job.job_id] = None
    charge(state, job, +1, event.ts)
    state.deferred.pop(event.job_id, None)
    state.budget_deferred.pop(event.job_id, None)
    state.judged_on_nodes.pop(event.job_id, None)
    state.nominated.pop(event.job_id, None)
    # The decider ends a backoff as it reserves; a fold that only reads decisions ends it here.
    state.backing_off.pop(event.job_id, None)
    state.requeued.pop(event.job_id, None)


def fold_released(state: QuotaState, event: QuotaReleased) -> None:
    """A reservation went back: the job waits again (how, by the reason) or, its run over, is forgotten."""
    job = state.jobs.get(event.job_id)
    if job is None or job.state != "reserved":
        return
    state.reserved[job.queue].pop(job.job_id, None)
    state.unplaced.pop(job.job_id, None)
    state.recalled.pop(job.job_id, None)
    charge(state, job, -1, event.ts)
    # Its run, if any, is over: a next reservation is for the model its next placement finds, as the other
    # folds of reservations (the preemption decider, the checker) see it.
    job.model = ""
    if event.reason == PLACEMENT_TIMEOUT:
        # Back to its queue in its place in line, its wait toward starvation going on (it never
        # ran), after a backoff that doubles each time.
        job.timeouts += 1
        job.timed_out_flavor = job.flavor
        state.requeued[job.job_id] = event.ts + placement_backoff_s(job.timeouts)
        enqueue(state, job)
    elif event.reason in ("evicted", "retry"):
        # Back to its queue with its original arrival (its place in line); its wait toward
        # starvation starts again. A failed job that runs again waits out its backoff first.
        job.since = event.ts
        if event.reason == "retry":
            state.backing_off[job.job_id] = event.ts + state.retry_in.pop(job.job_id, 0.0)
        enqueue(state, job)
    else:
        job.state = "ended"
        del state.jobs[job.job_id]
        state.budgets.forget(job.job_id)


def fold_recalled(state: QuotaState, event: QuotaRecalled) -> None:
    """Its reservation was asked back: it is not asked again, and goes back once placement lets the job go."""
    job = state.jobs.get(event.job_id)
    if job is not None and job.state == "reserved" and not job.placed:
        state.recalled[event.job_id] = None


def fold_deferred(state: QuotaState, event: QuotaDeferred) -> None:
    """What the job was told: a job told it waits for quota has nothing new to hear from a cycle."""
    state.deferred[event.job_id] = event.code
    job = state.jobs.get(event.job_id)
    if job is not None and job.state == "pending":
        queue_changed(state, job.queue, job)
        if event.code in WAITING_FOR_QUOTA:
            if (untold := state.untold.get(job.queue)) is not None:
                untold.pop(job.job_id, None)
        else:
            state.untold.setdefault(job.queue, {})[job.job_id] = None
    if event.code in BUDGET_WAITS:
        state.budget_deferred[event.job_id] = None
    else:
        state.budget_deferred.pop(event.job_id, None)
    if event.code == NO_NODE_COULD_HOLD:
        state.judged_on_nodes[event.job_id] = None
    else:
        state.judged_on_nodes.pop(event.job_id, None)


def fold_preemption_decided(state: QuotaState, event: PreemptionDecided) -> None:
    """Victims were chosen for the preemptor: the quota they free is its (libs/core/quota/nomination.py)."""
    preemptor = state.jobs.get(event.preemptor_id)
    if preemptor is None:
        return
    if preemptor.state == "pending":  # (one holding its quota already waits for GPUs)
        state.nominated[event.preemptor_id] = event.ts
        queue_changed(state, preemptor.queue)
    if least_served(event):
        state.las_nominated[event.preemptor_id] = None
    else:
        state.las_nominated.pop(event.preemptor_id, None)
    state.victims_of[event.preemptor_id] = (event.ts, tuple(v.job_id for v in event.victims))


# --- placement's and the executors' reports --------------------------------------------------------------


def fold_placement_deferred(state: QuotaState, event: PlacementDeferred) -> None:
    job = state.jobs.get(event.job_id)
    if job is None or job.state != "reserved" or job.placed:
        return
    if event.code != RESERVATION_RETURNED:
        job.placement_code = event.code
    elif event.job_id in state.recalled:  # placement let it go: react releases its reservation
        state.returned = event.job_id


def fold_placed(state: QuotaState, event: JobPlaced) -> None:
    job = state.jobs.get(event.job_id)
    if job is None:
        return
    state.attained.started(job.job_id, event.ts, job.demand)
    state.budgets.placed(job.job_id, event.placements)
    job.model = next((r.model for r in event.placements if r.model), "")
    if job.state == "reserved":
        job.placed, job.placement_code = True, ""
        state.unplaced.pop(job.job_id, None)
        state.recalled.pop(job.job_id, None)  # placed before placement read the ask: it keeps its quota
        # Now its model is known: charged to a flavor its queue no longer has, it moves to its model's.
        flavor = state.book.recharge_placed(job.queue, job.flavor, job.model, job.demand, job.over_budget)
        if flavor != job.flavor:
            job.flavor = flavor
            usage_changed(state, job.queue)  # (the book moves usage only with the flavor: its rooms changed)
            queue_changed(state, job.queue)  # its usage moved between its flavors


def fold_started(state: QuotaState, event: JobStarted) -> None:
    job = state.jobs.get(event.job_id)
    if job is not None:
        state.budgets.started(job.job_id, job.queue, job.demand / 1000, event.ts,
                              budget_period(state.policy, job.queue))


def fold_finished(state: QuotaState, event: JobFinished) -> None:
    run_stopped(state, event)
    end(state, event.job_id)


def fold_failed(state: QuotaState, event: JobFailed) -> None:
    """A reserved job that failed may run again (its retry backoff, applied as its quota goes back)."""
    run_stopped(state, event)
    job = state.jobs.get(event.job_id)
    if job is None or job.state != "reserved":
        end(state, event.job_id)
        return
    delay = state.retries.on_failed(event, job.spec, state.policy)
    if delay is not None:
        state.retry_in[event.job_id] = delay


def fold_evicted(state: QuotaState, event: JobEvicted) -> None:
    run_stopped(state, event)  # (its quota goes back by the QuotaReleased react decides)


def run_stopped(state: QuotaState, event: JobFinished | JobFailed | JobEvicted) -> None:
    """The job's run is over: it holds no GPU time from now on, nor spends its queue's budget."""
    job = state.jobs.get(event.job_id)
    if job is not None:
        state.attained.stopped(job.job_id, event.ts)
        state.budgets.stopped(job.job_id, event.ts, budget_period(state.policy, job.queue))


# --- the fleet and the clock ------------------------------------------------------------------------------


def fold_fleet(state: QuotaState, event: NodeRegistered | NodeLost | NodeCordoned | NodeUncordoned
               | GpuHealthChanged) -> None:
    """The GPU models present changed (or not): each job's flavors go stale when they did."""
    fleet_version = state.fleet.version
    state.fleet.fold(event)
    if state.fleet.version != fleet_version:
        state.flavors_epoch += 1


def fold_capacity_back(state: QuotaState, event: NodeRegistered | NodeUncordoned) -> None:
    fold_fleet(state, event)
    end_placement_backoffs(state, event.ts)


def fold_gpu_health(state: QuotaState, event: GpuHealthChanged) -> None:
    fold_fleet(state, event)
    if event.healthy:
        end_placement_backoffs(state, event.ts)


def fold_tick(state: QuotaState, event: ClockTick) -> None:
    """Nominations past their time lapse: the jobs they held may go now. A budget spent by runs going on (or
    back with a new period) turns its queue's answer to "over budget" with time alone: noted, for react."""
    budgets_turned(state, event.ts)
    for job_id in [j for j, t in state.nominated.items() if event.ts - t > NOMINATION_TTL_S]:
        del state.nominated[job_id]
        lapsed = state.jobs.get(job_id)
        if lapsed is not None and lapsed.state == "pending":
            state.lapsed.append(lapsed.queue)
            queue_changed(state, lapsed.queue)


def budgets_turned(state: QuotaState, now: float) -> None:
    for queue, spec in state.policy.queues.items():
        if spec.budget_gpu_hours is None:
            continue
        left = state.budget_left_s(queue, now)
        over = left is not None and left <= 0
        if over != state.over_budget_at_tick.get(queue, False):
            state.over_budget_at_tick[queue] = over
            state.budget_turned.append(queue)


# --- the policy ------------------------------------------------------------------------------------------


def fold_queue_policy(state: QuotaState, event: QueuePolicyChanged) -> None:
    book, name = state.book, event.queue.name
    # The queues whose cohort the change may move: the queue, and below a parent its subtree (a parent without
    # quota pools its children in the cohort it is in itself: kernel/queue_tree.py pooled_in).
    moving = book.subtree_of(name) if name in book.children else [name]
    unmoved = book.cohort.get(name, "") == book.pooled_in(event.queue)
    if (unmoved or not state.pending.get(name)) and not any(state.pending.get(q) for q in moving if q != name):
        fold_policy(state, event)
        return
    # Queues move to another cohort: their waiting demands move with them.
    waiting = [state.jobs[j] for q in moving for users in state.pending.get(q, {}).values()
               for keys in users.values() for _, j in keys]
    for job in waiting:
        count_demand(state, job.queue, job.demand, -1)
    for q in moving:
        state.waiting_in.get(book.cohort.get(q, ""), {}).pop(q, None)
    state.policy.apply(event)
    policy_applied(state, event)
    for job in waiting:
        count_demand(state, job.queue, job.demand, 1)


def fold_policy(state: QuotaState, event: EventBase) -> None:
    if state.policy.apply(event):
        policy_applied(state, event)


def policy_applied(state: QuotaState, event: EventBase) -> None:
    """Every answer kept per policy or per job's flavors goes stale; new priorities and thresholds re-place the
    waiting jobs, and a queue's reservations follow its flavors."""
    state.policy_version += 1
    state.flavors_epoch += 1
    if isinstance(event, PriorityClassesChanged):
        rerank(state)
    elif isinstance(event, QueuePolicyChanged):
        recharge(state, event.queue.name)
        relevel(state, event.queue.name)


FOLDS: dict[type[EventBase], Callable[[QuotaState, Any], None]] = {
    QuotaDeferred: fold_deferred,  # by far the most frequent
    JobSubmitted: fold_submitted,
    JobAdmitted: fold_admitted,
    JobCancelled: fold_cancelled,
    QuotaReserved: fold_reserved,
    QuotaReleased: fold_released,
    QuotaRecalled: fold_recalled,
    PreemptionDecided: fold_preemption_decided,
    PlacementDeferred: fold_placement_deferred,
    JobPlaced: fold_placed,
    JobStarted: fold_started,
    JobFinished: fold_finished,
    JobFailed: fold_failed,
    JobEvicted: fold_evicted,
    NodeRegistered: fold_capacity_back,
    NodeUncordoned: fold_capacity_back,
    GpuHealthChanged: fold_gpu_health,
    NodeLost: fold_fleet,
    NodeCordoned: fold_fleet,
    ClockTick: fold_tick,
    QueuePolicyChanged: fold_queue_policy,
    PriorityClassesChanged: fold_policy,
    SchedulingSettingsChanged: fold_policy,
}
# The event types the fold keeps something of: the decider's inputs and its own decisions. A reader of quota's
# state that folds the log (the checker) folds these.
FOLDED: tuple[type[EventBase], ...] = tuple(FOLDS)
