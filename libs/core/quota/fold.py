"""The quota decider's fold: how each input and each of its own decisions changes what it knows. A job waits
in its queue's indexes (by priority, user and arrival; by demand and requested models; by how long it has
waited) from its admission until quota is reserved for it, and again whenever its reservation goes back; a
reservation charges its queue's, user's and flavor's usage; placement's and the executors' reports mark
reservations placed and charge budgets; the fleet, the policy and the clock change what the next pass sees.
Nothing is decided here: react (libs/core/quota/decider.py) does that after the fold."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

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
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.quota_math import ANY, reservation_model
from libs.core.kernel.wait_reasons import BUDGET_WAITS, NO_NODE_COULD_HOLD, WAITING_FOR_QUOTA
from libs.core.quota.fit import could_ever_fit, could_hold
from libs.core.quota.fleet import FLEET_EVENTS
from libs.core.quota.state import QuotaJob
from libs.core.quota.timeout import PLACEMENT_TIMEOUT, end_placement_backoffs, placement_backoff_s

if TYPE_CHECKING:
    from libs.core.quota.decider import QuotaDecider

PLACEMENT_REPORTS = (JobPlaced, JobStarted, PlacementDeferred, JobFinished, JobFailed, JobEvicted)


def fold(d: QuotaDecider, event: EventBase) -> None:
    d._left_waiting = None  # the queue of a waiting job this event ended, for react
    d._lapsed = []
    d._backoffs_ended = []
    d._placed_while_pending = None
    if type(event) is QuotaDeferred:  # by far the most frequent: straight to its case below
        note_deferred(d, event)
        return
    if isinstance(event, PLACEMENT_REPORTS):
        placement_report(d, event)
        if not isinstance(event, JobFinished | JobFailed | JobEvicted):
            return
    if isinstance(event, FLEET_EVENTS):
        fleet_version = d.fleet.version
        d.fleet.evolve(event)
        if d.fleet.version != fleet_version:
            d.flavors_epoch += 1
    match event:  # policy events (which no case names) last
        case JobSubmitted():
            d._specs[event.job_id] = event
        case JobAdmitted():
            sub = d._specs.pop(event.job_id, None)
            if sub is None or event.job_id in d.jobs:
                return
            d._arrivals += 1
            spec = sub.spec
            job = QuotaJob(job_id=event.job_id, queue=spec.queue, user=spec.user or spec.team,
                           priority=d.policy.priority_of(spec), arrival=d._arrivals, since=event.ts,
                           demand=demand_milli(spec), spec=spec)
            d.jobs[event.job_id] = job
            enqueue(d, job)
        case QuotaReserved():
            # A fold of the log (the accounting mirror) can see a decision after the input that ended its
            # job (decisions are published after later inputs); the decider itself never does.
            taken = d.jobs.get(event.job_id)
            if taken is None or taken.state != "pending":
                return
            job = taken
            dequeue(d, job)
            job.state, job.flavor, job.reserved_at = "reserved", event.flavor or ANY, event.ts
            job.over_budget = event.over_budget
            job.placed, job.placed_while_pending, job.placement_code = job.placed_while_pending, False, ""
            if not job.placed:
                d.unplaced[job.job_id] = None
            d.reserved.setdefault(job.queue, {})[job.job_id] = None
            use(d, job, +1, event.ts)
            d.deferred.pop(event.job_id, None)
            d.budget_deferred.pop(event.job_id, None)
            d.no_node_deferred.pop(event.job_id, None)
            d.nominated.pop(event.job_id, None)
            # The decider ends a backoff as it reserves; a fold that only reads decisions ends it here.
            d.backing_off.pop(event.job_id, None)
            d.requeued.pop(event.job_id, None)
        case QuotaReleased():
            released(d, event)
        case QuotaDeferred():
            note_deferred(d, event)
        case PreemptionDecided() if event.preemptor_id in d.jobs:
            if d.jobs[event.preemptor_id].state == "pending":  # (one holding its quota already waits for GPUs)
                d.nominated[event.preemptor_id] = event.ts
                touched(d, d.jobs[event.preemptor_id].queue)
            if least_served(event):
                d.las_nominated[event.preemptor_id] = None
            else:
                d.las_nominated.pop(event.preemptor_id, None)
            d.victims_of[event.preemptor_id] = (event.ts, tuple(v.job_id for v in event.victims))
        case NodeRegistered() | NodeUncordoned() | GpuHealthChanged():
            if not isinstance(event, GpuHealthChanged) or event.healthy:
                end_placement_backoffs(d, event.ts)
        case ClockTick():
            for job_id in [j for j, t in d.nominated.items() if event.ts - t > NOMINATION_TTL_S]:
                del d.nominated[job_id]
                lapsed = d.jobs.get(job_id)
                if lapsed is not None and lapsed.state == "pending":
                    d._lapsed.append(lapsed.queue)  # the jobs it held may go now
                    touched(d, lapsed.queue)
        case JobFailed() if event.job_id in d.jobs and d.jobs[event.job_id].state == "reserved":
            delay = d.retries.on_failed(event, d.jobs[event.job_id].spec, d.policy)
            if delay is not None:
                d.retry_in[event.job_id] = delay
        case JobCancelled() | JobFinished() | JobFailed():
            end(d, event.job_id)
        case QueuePolicyChanged() if d.book.cohort.get(event.queue.name, "") != (event.queue.cohort
                                                                                  or event.queue.parent):
            # The queue moves to another cohort: its waiting demands move with it.
            waiting = [d.jobs[j] for users in d.pending.get(event.queue.name, {}).values()
                       for keys in users.values() for _, j in keys]
            for job in waiting:
                count_demand(d, job.queue, job.demand, -1)
            d.waiting_in.get(d.book.cohort.get(event.queue.name, ""), {}).pop(event.queue.name, None)
            d.policy.apply(event)
            policy_applied(d, event)
            for job in waiting:
                count_demand(d, job.queue, job.demand, 1)
        case _ if d.policy.apply(event):
            policy_applied(d, event)


def policy_applied(d: QuotaDecider, event: EventBase) -> None:
    d.policy_version += 1
    d.flavors_epoch += 1
    if isinstance(event, PriorityClassesChanged):
        rerank(d)
    elif isinstance(event, QueuePolicyChanged):
        recharge(d, event.queue.name)
        relevel(d, event.queue.name)


def released(d: QuotaDecider, event: QuotaReleased) -> None:
    """A reservation went back: the job waits again (how, by the reason) or, its run over, is forgotten."""
    freed = d.jobs.get(event.job_id)
    if freed is None or freed.state != "reserved":
        return
    job = freed
    d.reserved[job.queue].pop(job.job_id, None)
    d.unplaced.pop(job.job_id, None)
    use(d, job, -1, event.ts)
    # Its run, if any, is over: a next reservation is for the model its next placement finds, as the other
    # folds of reservations (the preemption decider, the checker) see it.
    job.model = ""
    if event.reason == PLACEMENT_TIMEOUT:
        # Back to its queue in its place in line, its wait toward starvation going on (it never
        # ran), after a backoff that doubles each time.
        job.timeouts += 1
        job.timed_out_flavor = job.flavor
        d.requeued[job.job_id] = event.ts + placement_backoff_s(job.timeouts)
        enqueue(d, job)
    elif event.reason in ("evicted", "retry"):
        # Back to its queue with its original arrival (its place in line); its wait toward
        # starvation starts again. A failed job that runs again waits out its backoff first.
        job.since = event.ts
        if event.reason == "retry":
            d.backing_off[job.job_id] = event.ts + d.retry_in.pop(job.job_id, 0.0)
        enqueue(d, job)
    else:
        job.state = "ended"
        del d.jobs[job.job_id]
        d.budgets.forget(job.job_id)


def touched(d: QuotaDecider, queue: str) -> None:
    """Something of the queue's own changed (its waiting jobs, its usage, what they were told, a nomination):
    what a pass kept of it (quota_heads, quota_reach.quiet) goes stale."""
    d.qver[queue] = d.qver.get(queue, 0) + 1
    cohort = d.book.cohort.get(queue, "")
    if cohort:
        d.stirred.setdefault(cohort, {})[queue] = None


def count_demand(d: QuotaDecider, queue: str, demand: int, sign: int) -> None:
    """The waiting demands of the queue's cohort, counted (quota_reach.no_room asks the smallest), and the
    cohort's waiting queues."""
    cohort = d.book.cohort.get(queue, "")
    if not cohort:
        return
    if sign > 0:
        d.waiting_in.setdefault(cohort, {})[queue] = None
    elif not d.pending.get(queue) and (waiting := d.waiting_in.get(cohort)) is not None:
        waiting.pop(queue, None)
    demands = d.cohort_demands.setdefault(cohort, {})
    left = demands.get(demand, 0) + sign
    if left:
        demands[demand] = left
    else:
        del demands[demand]


def enqueue(d: QuotaDecider, job: QuotaJob) -> None:
    job.state = "pending"
    touched(d, job.queue)
    count_demand(d, job.queue, job.demand, 1)
    las = threshold_milli_s(d.policy.queues.get(job.queue))
    if las is not None and job.arrival < DEMOTED and d.attained.held.get(job.job_id, 0.0) > las:
        job.arrival += DEMOTED  # least attained service: behind every job of its priority that held less
    users = d.pending.setdefault(job.queue, {}).setdefault(job.priority, {})
    bisect.insort(users.setdefault(job.user, []), (job.arrival, job.job_id))
    demands = d.demands.setdefault((job.queue, job.priority), {})
    demands[job.demand] = demands.get(job.demand, 0) + 1
    models = d.models.setdefault((job.queue, job.priority), {})
    models[job.spec.gpu_models] = models.get(job.spec.gpu_models, 0) + 1
    by_models = d.demands_by_models.setdefault(job.queue, {}).setdefault(job.spec.gpu_models, {})
    by_models[job.demand] = by_models.get(job.demand, 0) + 1
    bisect.insort(d.by_wait, (job.since, job.arrival, job.job_id))
    bisect.insort(d.by_wait_in.setdefault(job.queue, []), (job.since, job.arrival, job.job_id))
    holdable = d._holdable.get(job.queue)
    if holdable is not None and holdable[2] and not could_hold(d, job):
        d._holdable[job.queue] = (*holdable[:2], False)
    fitting = d._fitting.get(job.queue)
    if fitting is not None and fitting[2] and not could_ever_fit(d, job):
        d._fitting[job.queue] = (*fitting[:2], False)
    if d.deferred.get(job.job_id) not in WAITING_FOR_QUOTA:
        d.loud.setdefault(job.queue, {})[job.job_id] = None


def dequeue(d: QuotaDecider, job: QuotaJob) -> None:
    touched(d, job.queue)
    levels = d.pending[job.queue]
    users = levels[job.priority]
    keys = users[job.user]
    keys.pop(bisect.bisect_left(keys, (job.arrival, job.job_id)))
    if not keys:
        del users[job.user]
        if not users:
            del levels[job.priority]
    count_demand(d, job.queue, job.demand, -1)
    demands = d.demands[(job.queue, job.priority)]
    demands[job.demand] -= 1
    if not demands[job.demand]:
        del demands[job.demand]
        if not demands:
            del d.demands[(job.queue, job.priority)]
    models = d.models[(job.queue, job.priority)]
    models[job.spec.gpu_models] -= 1
    if not models[job.spec.gpu_models]:
        del models[job.spec.gpu_models]
        if not models:
            del d.models[(job.queue, job.priority)]
    of_queue = d.demands_by_models[job.queue]
    by_models = of_queue[job.spec.gpu_models]
    by_models[job.demand] -= 1
    if not by_models[job.demand]:
        del by_models[job.demand]
        if not by_models:
            del of_queue[job.spec.gpu_models]
    if (holdable := d._holdable.get(job.queue)) is not None and not holdable[2]:
        del d._holdable[job.queue]  # it may have been the one no node could hold
    if (fitting := d._fitting.get(job.queue)) is not None and not fitting[2]:
        del d._fitting[job.queue]  # it may have been the one its queue could not hold
    if (loud := d.loud.get(job.queue)) is not None:
        loud.pop(job.job_id, None)
    key = (job.since, job.arrival, job.job_id)
    for waits in (d.by_wait, d.by_wait_in.get(job.queue, [])):
        i = bisect.bisect_left(waits, key)
        if i < len(waits) and waits[i] == key:
            waits.pop(i)


def rerank(d: QuotaDecider) -> None:
    """Priority classes changed: every job takes its class's new value, waiting ones their new place."""
    for job in d.jobs.values():
        priority = d.policy.priority_of(job.spec)
        if priority == job.priority:
            continue
        if job.state == "pending":
            dequeue(d, job)
            job.priority = priority
            enqueue(d, job)
        else:
            job.priority = priority


def relevel(d: QuotaDecider, queue: str) -> None:
    """The queue's policy changed: its waiting jobs take their place by least attained service anew (demoted
    when it orders so and they held more than its threshold, in arrival order when it does not)."""
    las = threshold_milli_s(d.policy.queues.get(queue))
    jobs = [d.jobs[j] for users in d.pending.get(queue, {}).values() for keys in users.values() for _, j in keys]
    for job in jobs:
        demoted = las is not None and d.attained.held.get(job.job_id, 0.0) > las
        if demoted != (job.arrival >= DEMOTED):
            dequeue(d, job)
            job.arrival += DEMOTED if demoted else -DEMOTED
            enqueue(d, job)


def use(d: QuotaDecider, job: QuotaJob, sign: int, now: float) -> None:
    """Usage of the job's queue, user and flavor changes by its demand."""
    touched(d, job.queue)
    half_life = d.policy.settings.fair_share_half_life_s
    d.decayed.setdefault(job.queue, DecayedUsage(since=now)).advance(d.queue_used.get(job.queue, 0), now, half_life)
    d.queue_used[job.queue] = d.queue_used.get(job.queue, 0) + sign * job.demand
    key = (job.queue, job.user)
    d.user_used[key] = d.user_used.get(key, 0) + sign * job.demand
    d.book.add(job.queue, job.flavor, sign * job.demand, job.over_budget)


def recharge(d: QuotaDecider, queue: str) -> None:
    """The queue's reservations follow its current flavors (QuotaBook.recharge): usage reserved under a
    flavor the queue no longer has moves to the one that covers its job's model now, so that what the
    queue borrows stays where a lender can reclaim it."""
    for job_id in d.reserved.get(queue, {}):
        job = d.jobs[job_id]
        job.flavor = d.book.recharge(queue, job.flavor, reservation_model(job.flavor, job.model, job.spec),
                                     job.demand, job.over_budget)


def placement_report(d: QuotaDecider, event: JobPlaced | JobStarted | PlacementDeferred | JobFinished | JobFailed
                     | JobEvicted) -> None:
    """What placement and the executors say about a job: whether its reservation is placed, and its runs."""
    job = d.jobs.get(event.job_id)
    if job is None:
        return
    match event:
        case PlacementDeferred():
            if job.state == "reserved" and not job.placed:
                job.placement_code = event.code
        case JobPlaced():
            d.attained.started(job.job_id, event.ts, job.demand)
            d.budgets.placed(job.job_id, event.placements)
            job.model = next((r.model for r in event.placements if r.model), "")
            if job.state == "reserved":
                job.placed, job.placement_code = True, ""
                d.unplaced.pop(job.job_id, None)
                # Now its model is known: charged to a flavor its queue no longer has, it moves to its model's.
                flavor = d.book.recharge_placed(job.queue, job.flavor, job.model, job.demand, job.over_budget)
                if flavor != job.flavor:
                    job.flavor = flavor
                    touched(d, job.queue)  # its usage moved between its flavors
            else:  # placed before placement read that its quota went back: react takes the quota again
                job.placed_while_pending = True
                d._placed_while_pending = job.job_id
        case JobStarted():
            d.budgets.started(job.job_id, job.queue, job.demand / 1000, event.ts, budget_period(d, job.queue))
        case _:
            d.attained.stopped(job.job_id, event.ts)
            d.budgets.stopped(job.job_id, event.ts, budget_period(d, job.queue))


def budget_period(d: QuotaDecider, queue: str) -> str | None:
    spec = d.policy.queues.get(queue)
    return None if spec is None or spec.budget_gpu_hours is None else spec.budget_period


def note_deferred(d: QuotaDecider, event: QuotaDeferred) -> None:
    d.deferred[event.job_id] = event.code
    job = d.jobs.get(event.job_id)
    if job is not None and job.state == "pending":
        touched(d, job.queue)
        if event.code in WAITING_FOR_QUOTA:
            if (loud := d.loud.get(job.queue)) is not None:
                loud.pop(job.job_id, None)
        else:
            d.loud.setdefault(job.queue, {})[job.job_id] = None
    if event.code in BUDGET_WAITS:
        d.budget_deferred[event.job_id] = None
    else:
        d.budget_deferred.pop(event.job_id, None)
    if event.code == NO_NODE_COULD_HOLD:
        d.no_node_deferred[event.job_id] = None
    else:
        d.no_node_deferred.pop(event.job_id, None)


def end(d: QuotaDecider, job_id: str) -> None:
    job = d.jobs.get(job_id)
    if job is None:
        return
    d.deferred.pop(job_id, None)
    d.budget_deferred.pop(job_id, None)
    d.no_node_deferred.pop(job_id, None)
    d.nominated.pop(job_id, None)
    d.attained.forget(job_id)
    d.las_nominated.pop(job_id, None)
    d.victims_of.pop(job_id, None)
    d.backing_off.pop(job_id, None)
    d.requeued.pop(job_id, None)
    if job.state == "pending":
        dequeue(d, job)
        del d.jobs[job_id]
        d.budgets.forget(job_id)
        d._left_waiting = job.queue
