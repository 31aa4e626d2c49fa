"""The indexes of the waiting jobs, which the fold keeps and the scheduling cycle reads: by queue, priority,
user and arrival (the order of a queue); by demand and requested models (the smallest job a level or a flavor
holds); by how long each has waited (starvation); per cohort, its waiting queues and demands; per queue, the
jobs not told they wait for quota, and a version that bumps whenever anything of the queue's own changes (what
a cycle kept of the queue goes stale)."""

from __future__ import annotations

import bisect

from libs.core.kernel.attained_service import DEMOTED, threshold_milli_s
from libs.core.kernel.wait_reasons import WAITING_FOR_QUOTA
from libs.core.quota.fit import could_ever_fit, could_hold
from libs.core.quota.shortcuts.kept_failures import follow
from libs.core.quota.state import QuotaJob, QuotaState


def queue_changed(state: QuotaState, queue: str, job: QuotaJob | None = None, how: str = "told") -> None:
    """Something of the queue's own changed (its waiting jobs, its usage, what they were told, a nomination):
    what a cycle kept of it (shortcuts: kept_heads, skipped_queues.lent_only) goes stale; kept failures may stand
    when the change is the `job` that joins, leaves or is told something (`how`; shortcuts/kept_failures.py)."""
    version = state.queue_version[queue] = state.queue_version.get(queue, 0) + 1
    if job is not None and state.kept_failures:
        follow(state, queue, version, job, how)
    cohort = state.book.cohort.get(queue, "")
    if cohort:
        state.changed_queues.setdefault(cohort, {})[queue] = None


def count_demand(state: QuotaState, queue: str, demand: int, sign: int) -> None:
    """The waiting demands of the queue's cohort, counted (skipped_queues.cohort_full asks the smallest), and the
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
    count_demand(state, job.queue, job.demand, 1)
    las = threshold_milli_s(state.policy.queues.get(job.queue))
    if las is not None and job.arrival < DEMOTED and state.attained.held.get(job.job_id, 0.0) > las:
        job.arrival += DEMOTED  # least attained service: behind every job of its priority that held less
    queue_changed(state, job.queue, job, "joins")  # (with its place in line as it is from now on)
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
    queue_changed(state, job.queue, job, "leaves")
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
