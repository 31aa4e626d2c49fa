"""The quota decider's fold: how each input and each of its own decisions changes what it knows. A job waits
in its queue's indexes (by priority, user and arrival; by demand and requested models; by how long it has
waited) from its admission until quota is reserved for it, and again whenever its reservation goes back; a
reservation charges its queue's, user's and flavor's usage; placement's and the executors' reports mark
reservations placed and charge budgets; the fleet, the policy and the clock change what the next pass sees.
Nothing is decided here: react (libs/core/quota/decider.py) does that after the fold."""

from __future__ import annotations

import bisect

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
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.kernel.attained_service import DEMOTED, least_served, threshold_milli_s
from libs.core.kernel.fairness import DecayedUsage
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.quota_math import ANY, reservation_model
from libs.core.quota.fit import could_ever_fit, could_hold
from libs.core.quota.fleet import FLEET_EVENTS
from libs.core.quota.nomination import NOMINATION_TTL_S
from libs.core.quota.reasons import BUDGET_WAITS, NO_NODE_COULD_HOLD, WAITING_FOR_QUOTA
from libs.core.quota.state import QuotaJob, QuotaState
from libs.core.quota.timeout import PLACEMENT_TIMEOUT, end_placement_backoffs, placement_backoff_s

PLACEMENT_REPORTS = (JobPlaced, JobStarted, PlacementDeferred, JobFinished, JobFailed, JobEvicted)


def fold(state: QuotaState, event: EventBase) -> None:
    state.left_waiting = None  # the queue of a waiting job this event ended, for react
    state.lapsed = []
    state.backoffs_ended = []
    state.placed_while_waiting = None
    if type(event) is QuotaDeferred:  # by far the most frequent: straight to its case below
        note_deferred(state, event)
        return
    if isinstance(event, PLACEMENT_REPORTS):
        placement_report(state, event)
        if not isinstance(event, JobFinished | JobFailed | JobEvicted):
            return
    if isinstance(event, FLEET_EVENTS):
        fleet_version = state.fleet.version
        state.fleet.fold(event)
        if state.fleet.version != fleet_version:
            state.flavors_epoch += 1
    match event:  # policy events (which no case names) last
        case JobSubmitted():
            state.submitted[event.job_id] = event
        case JobAdmitted():
            sub = state.submitted.pop(event.job_id, None)
            if sub is None or event.job_id in state.jobs:
                return
            state.arrivals += 1
            spec = sub.spec
            job = QuotaJob(job_id=event.job_id, queue=spec.queue, user=spec.user or spec.team,
                           priority=state.policy.priority_of(spec), arrival=state.arrivals, since=event.ts,
                           demand=demand_milli(spec), spec=spec)
            state.jobs[event.job_id] = job
            enqueue(state, job)
        case QuotaReserved():
            # A fold of the log (the accounting mirror) can see a decision after the input that ended its
            # job (decisions are published after later inputs); the decider itself never does.
            taken = state.jobs.get(event.job_id)
            if taken is None or taken.state != "pending":
                return
            job = taken
            dequeue(state, job)
            job.state, job.flavor, job.reserved_at = "reserved", event.flavor or ANY, event.ts
            job.over_budget = event.over_budget
            job.placed, job.placed_while_pending, job.placement_code = job.placed_while_pending, False, ""
            if not job.placed:
                state.unplaced[job.job_id] = None
            state.reserved.setdefault(job.queue, {})[job.job_id] = None
            use(state, job, +1, event.ts)
            state.deferred.pop(event.job_id, None)
            state.budget_deferred.pop(event.job_id, None)
            state.no_node_deferred.pop(event.job_id, None)
            state.nominated.pop(event.job_id, None)
            # The decider ends a backoff as it reserves; a fold that only reads decisions ends it here.
            state.backing_off.pop(event.job_id, None)
            state.requeued.pop(event.job_id, None)
        case QuotaReleased():
            released(state, event)
        case QuotaDeferred():
            note_deferred(state, event)
        case PreemptionDecided() if event.preemptor_id in state.jobs:
            if state.jobs[event.preemptor_id].state == "pending":  # (one holding its quota already waits for GPUs)
                state.nominated[event.preemptor_id] = event.ts
                queue_changed(state, state.jobs[event.preemptor_id].queue)
            if least_served(event):
                state.las_nominated[event.preemptor_id] = None
            else:
                state.las_nominated.pop(event.preemptor_id, None)
            state.victims_of[event.preemptor_id] = (event.ts, tuple(v.job_id for v in event.victims))
        case NodeRegistered() | NodeUncordoned() | GpuHealthChanged():
            if not isinstance(event, GpuHealthChanged) or event.healthy:
                end_placement_backoffs(state, event.ts)
        case ClockTick():
            for job_id in [j for j, t in state.nominated.items() if event.ts - t > NOMINATION_TTL_S]:
                del state.nominated[job_id]
                lapsed = state.jobs.get(job_id)
                if lapsed is not None and lapsed.state == "pending":
                    state.lapsed.append(lapsed.queue)  # the jobs it held may go now
                    queue_changed(state, lapsed.queue)
        case JobFailed() if event.job_id in state.jobs and state.jobs[event.job_id].state == "reserved":
            delay = state.retries.on_failed(event, state.jobs[event.job_id].spec, state.policy)
            if delay is not None:
                state.retry_in[event.job_id] = delay
        case JobCancelled() | JobFinished() | JobFailed():
            end(state, event.job_id)
        case QueuePolicyChanged() if state.book.cohort.get(event.queue.name, "") != (event.queue.cohort
                                                                                  or event.queue.parent):
            # The queue moves to another cohort: its waiting demands move with it.
            waiting = [state.jobs[j] for users in state.pending.get(event.queue.name, {}).values()
                       for keys in users.values() for _, j in keys]
            for job in waiting:
                count_demand(state, job.queue, job.demand, -1)
            state.waiting_in.get(state.book.cohort.get(event.queue.name, ""), {}).pop(event.queue.name, None)
            state.policy.apply(event)
            policy_applied(state, event)
            for job in waiting:
                count_demand(state, job.queue, job.demand, 1)
        case _ if state.policy.apply(event):
            policy_applied(state, event)


def policy_applied(state: QuotaState, event: EventBase) -> None:
    state.policy_version += 1
    state.flavors_epoch += 1
    if isinstance(event, PriorityClassesChanged):
        rerank(state)
    elif isinstance(event, QueuePolicyChanged):
        recharge(state, event.queue.name)
        relevel(state, event.queue.name)


def released(state: QuotaState, event: QuotaReleased) -> None:
    """A reservation went back: the job waits again (how, by the reason) or, its run over, is forgotten."""
    freed = state.jobs.get(event.job_id)
    if freed is None or freed.state != "reserved":
        return
    job = freed
    state.reserved[job.queue].pop(job.job_id, None)
    state.unplaced.pop(job.job_id, None)
    use(state, job, -1, event.ts)
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


def queue_changed(state: QuotaState, queue: str) -> None:
    """Something of the queue's own changed (its waiting jobs, its usage, what they were told, a nomination):
    what a pass kept of it (quota_heads, quota_reach.quiet) goes stale."""
    state.queue_version[queue] = state.queue_version.get(queue, 0) + 1
    cohort = state.book.cohort.get(queue, "")
    if cohort:
        state.changed_queues.setdefault(cohort, {})[queue] = None


def count_demand(state: QuotaState, queue: str, demand: int, sign: int) -> None:
    """The waiting demands of the queue's cohort, counted (quota_reach.no_room asks the smallest), and the
    cohort's waiting queues."""
    cohort = state.book.cohort.get(queue, "")
    if not cohort:
        return
    if sign > 0:
        state.waiting_in.setdefault(cohort, {})[queue] = None
    elif not state.pending.get(queue) and (waiting := state.waiting_in.get(cohort)) is not None:
        waiting.pop(queue, None)
    demands = state.cohort_demands.setdefault(cohort, {})
    left = demands.get(demand, 0) + sign
    if left:
        demands[demand] = left
    else:
        del demands[demand]


def enqueue(state: QuotaState, job: QuotaJob) -> None:
    job.state = "pending"
    queue_changed(state, job.queue)
    count_demand(state, job.queue, job.demand, 1)
    las = threshold_milli_s(state.policy.queues.get(job.queue))
    if las is not None and job.arrival < DEMOTED and state.attained.held.get(job.job_id, 0.0) > las:
        job.arrival += DEMOTED  # least attained service: behind every job of its priority that held less
    users = state.pending.setdefault(job.queue, {}).setdefault(job.priority, {})
    bisect.insort(users.setdefault(job.user, []), (job.arrival, job.job_id))
    demands = state.demands.setdefault((job.queue, job.priority), {})
    demands[job.demand] = demands.get(job.demand, 0) + 1
    models = state.models.setdefault((job.queue, job.priority), {})
    models[job.spec.gpu_models] = models.get(job.spec.gpu_models, 0) + 1
    by_models = state.demands_by_models.setdefault(job.queue, {}).setdefault(job.spec.gpu_models, {})
    by_models[job.demand] = by_models.get(job.demand, 0) + 1
    bisect.insort(state.by_wait, (job.since, job.arrival, job.job_id))
    bisect.insort(state.by_wait_in.setdefault(job.queue, []), (job.since, job.arrival, job.job_id))
    holdable = state.holdable.get(job.queue)
    if holdable is not None and holdable[2] and not could_hold(state, job):
        state.holdable[job.queue] = (*holdable[:2], False)
    fitting = state.fitting.get(job.queue)
    if fitting is not None and fitting[2] and not could_ever_fit(state, job):
        state.fitting[job.queue] = (*fitting[:2], False)
    if state.deferred.get(job.job_id) not in WAITING_FOR_QUOTA:
        state.untold.setdefault(job.queue, {})[job.job_id] = None


def dequeue(state: QuotaState, job: QuotaJob) -> None:
    queue_changed(state, job.queue)
    levels = state.pending[job.queue]
    users = levels[job.priority]
    keys = users[job.user]
    keys.pop(bisect.bisect_left(keys, (job.arrival, job.job_id)))
    if not keys:
        del users[job.user]
        if not users:
            del levels[job.priority]
    count_demand(state, job.queue, job.demand, -1)
    demands = state.demands[(job.queue, job.priority)]
    demands[job.demand] -= 1
    if not demands[job.demand]:
        del demands[job.demand]
        if not demands:
            del state.demands[(job.queue, job.priority)]
    models = state.models[(job.queue, job.priority)]
    models[job.spec.gpu_models] -= 1
    if not models[job.spec.gpu_models]:
        del models[job.spec.gpu_models]
        if not models:
            del state.models[(job.queue, job.priority)]
    of_queue = state.demands_by_models[job.queue]
    by_models = of_queue[job.spec.gpu_models]
    by_models[job.demand] -= 1
    if not by_models[job.demand]:
        del by_models[job.demand]
        if not by_models:
            del of_queue[job.spec.gpu_models]
    if (holdable := state.holdable.get(job.queue)) is not None and not holdable[2]:
        del state.holdable[job.queue]  # it may have been the one no node could hold
    if (fitting := state.fitting.get(job.queue)) is not None and not fitting[2]:
        del state.fitting[job.queue]  # it may have been the one its queue could not hold
    if (untold := state.untold.get(job.queue)) is not None:
        untold.pop(job.job_id, None)
    key = (job.since, job.arrival, job.job_id)
    for waits in (state.by_wait, state.by_wait_in.get(job.queue, [])):
        i = bisect.bisect_left(waits, key)
        if i < len(waits) and waits[i] == key:
            waits.pop(i)


def rerank(state: QuotaState) -> None:
    """Priority classes changed: every job takes its class's new value, waiting ones their new place."""
    for job in state.jobs.values():
        priority = state.policy.priority_of(job.spec)
        if priority == job.priority:
            continue
        if job.state == "pending":
            dequeue(state, job)
            job.priority = priority
            enqueue(state, job)
        else:
            job.priority = priority


def relevel(state: QuotaState, queue: str) -> None:
    """The queue's policy changed: its waiting jobs take their place by least attained service anew (demoted
    when it orders so and they held more than its threshold, in arrival order when it does not)."""
    las = threshold_milli_s(state.policy.queues.get(queue))
    jobs = [state.jobs[j] for users in state.pending.get(queue, {}).values()
            for keys in users.values() for _, j in keys]
    for job in jobs:
        demoted = las is not None and state.attained.held.get(job.job_id, 0.0) > las
        if demoted != (job.arrival >= DEMOTED):
            dequeue(state, job)
            job.arrival += DEMOTED if demoted else -DEMOTED
            enqueue(state, job)


def use(state: QuotaState, job: QuotaJob, sign: int, now: float) -> None:
    """Usage of the job's queue, user and flavor changes by its demand."""
    queue_changed(state, job.queue)
    half_life = state.policy.settings.fair_share_half_life_s
    decayed = state.decayed.setdefault(job.queue, DecayedUsage(since=now))
    decayed.advance(state.queue_used.get(job.queue, 0), now, half_life)
    state.queue_used[job.queue] = state.queue_used.get(job.queue, 0) + sign * job.demand
    key = (job.queue, job.user)
    state.user_used[key] = state.user_used.get(key, 0) + sign * job.demand
    state.book.add(job.queue, job.flavor, sign * job.demand, job.over_budget)


def recharge(state: QuotaState, queue: str) -> None:
    """The queue's reservations follow its current flavors (QuotaBook.recharge): usage reserved under a
    flavor the queue no longer has moves to the one that covers its job's model now, so that what the
    queue borrows stays where a lender can reclaim it."""
    for job_id in state.reserved.get(queue, {}):
        job = state.jobs[job_id]
        job.flavor = state.book.recharge(queue, job.flavor, reservation_model(job.flavor, job.model, job.spec),
                                     job.demand, job.over_budget)


def placement_report(state: QuotaState, event: JobPlaced | JobStarted | PlacementDeferred | JobFinished | JobFailed
                     | JobEvicted) -> None:
    """What placement and the executors say about a job: whether its reservation is placed, and its runs."""
    job = state.jobs.get(event.job_id)
    if job is None:
        return
    match event:
        case PlacementDeferred():
            if job.state == "reserved" and not job.placed:
                job.placement_code = event.code
        case JobPlaced():
            state.attained.started(job.job_id, event.ts, job.demand)
            state.budgets.placed(job.job_id, event.placements)
            job.model = next((r.model for r in event.placements if r.model), "")
            if job.state == "reserved":
                job.placed, job.placement_code = True, ""
                state.unplaced.pop(job.job_id, None)
                # Now its model is known: charged to a flavor its queue no longer has, it moves to its model's.
                flavor = state.book.recharge_placed(job.queue, job.flavor, job.model, job.demand, job.over_budget)
                if flavor != job.flavor:
                    job.flavor = flavor
                    queue_changed(state, job.queue)  # its usage moved between its flavors
            else:  # placed before placement read that its quota went back: react takes the quota again
                job.placed_while_pending = True
                state.placed_while_waiting = job.job_id
        case JobStarted():
            state.budgets.started(job.job_id, job.queue, job.demand / 1000, event.ts, budget_period(state, job.queue))
        case _:
            state.attained.stopped(job.job_id, event.ts)
            state.budgets.stopped(job.job_id, event.ts, budget_period(state, job.queue))


def budget_period(state: QuotaState, queue: str) -> str | None:
    spec = state.policy.queues.get(queue)
    return None if spec is None or spec.budget_gpu_hours is None else spec.budget_period


def note_deferred(state: QuotaState, event: QuotaDeferred) -> None:
    state.deferred[event.job_id] = event.code
    job = state.jobs.get(event.job_id)
    if job is not None and job.state == "pending":
        queue_changed(state, job.queue)
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
        state.no_node_deferred[event.job_id] = None
    else:
        state.no_node_deferred.pop(event.job_id, None)


def end(state: QuotaState, job_id: str) -> None:
    job = state.jobs.get(job_id)
    if job is None:
        return
    state.deferred.pop(job_id, None)
    state.budget_deferred.pop(job_id, None)
    state.no_node_deferred.pop(job_id, None)
    state.nominated.pop(job_id, None)
    state.attained.forget(job_id)
    state.las_nominated.pop(job_id, None)
    state.victims_of.pop(job_id, None)
    state.backing_off.pop(job_id, None)
    state.requeued.pop(job_id, None)
    if job.state == "pending":
        dequeue(state, job)
        del state.jobs[job_id]
        state.budgets.forget(job_id)
        state.left_waiting = job.queue
