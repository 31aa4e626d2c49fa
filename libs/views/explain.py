"""Why is my job pending, what would unblock it, and when should it start: one answer, computed from the
read models (pure: the caller passes the views and `now`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from contracts.views import Explanation, JobView, NodeView, QueueView, Reason
from libs.core.kernel.policy import declared_runtime

FULL = 1000
FAMILY = {
    "queue_quota_exhausted": "queue_quota", "cohort_quota_exhausted": "cohort_quota", "quota_lent_out": "reclaim",
    "behind_higher_priority": "priority", "user_limit": "user_limit", "budget_spent": "budget",
    "held_for_starving_job": "starvation_reservation", "exceeds_queue_quota": "queue_ceiling",
    "placement_timed_out": "placement_timeout", "capacity_held_for_it": "starving",
    "insufficient_gpus": "capacity", "no_model_match": "capacity", "insufficient_cpu_memory": "capacity",
    "fragmentation": "fragmentation", "topology": "topology", "gang": "gang",
    "reserved_for_preemptor": "protected_for_preemptor", "held_for_preemptor": "protected_for_preemptor",
    "parent_quota_exhausted": "queue_quota", "nominal_quota_only": "queue_quota", "no_node_could_hold": "no_node",
    "no_quota_for_models": "no_quota_for_models",
}


def demand_milli(job: JobView) -> int:
    spec = job.spec
    if spec is None:
        return 0
    per = spec.gpu_milli if spec.gpu_milli > 0 else spec.gpus * FULL
    return per * spec.replicas


def held_milli(job: JobView) -> int:
    return sum(len(p.gpu_indices) * p.gpu_milli for p in job.placements)


def expected_end(job: JobView, now: float) -> float | None:
    runtime = None if job.spec is None else declared_runtime(job.spec)
    if job.started_at is None or runtime is None:
        return None
    return max(now, job.started_at + runtime)


def _release_schedule(running: Iterable[JobView], now: float) -> list[tuple[float, int, str]]:
    """(expected end, GPU share freed, job) for running jobs with a declared runtime, soonest first."""
    ends = [(end, held_milli(j), j.id) for j in running if (end := expected_end(j, now)) is not None]
    return sorted(ends)


def _when_enough(schedule: list[tuple[float, int, str]], needed: int) -> tuple[float, list[str]] | None:
    freed, jobs = 0, []
    for end, share, job_id in schedule:
        freed += share
        jobs.append(job_id)
        if freed >= needed:
            return end, jobs
    return None


def explain(job: JobView, queue: QueueView | None, queue_running: list[JobView], cluster_running: list[JobView],
            nodes: list[NodeView], now: float) -> Explanation:
    out = Explanation(job_id=job.id, state=job.state, phase=job.phase)
    if job.state == "running":
        out.estimated_start = job.started_at
        return out
    if job.state != "pending":
        if job.reason:
            out.reasons.append(Reason(code=job.reason, message=job.message or job.reason))
        return out
    demand = demand_milli(job)
    code = job.reason or ("waiting_for_placement" if job.phase == "reserved" else "waiting")
    family = FAMILY.get(code, code)
    out.reasons.append(Reason(code=family, message=job.message or _default_message(job)))
    if family in ("queue_quota", "priority", "cohort_quota", "reclaim") and queue is not None:
        _explain_quota(out, job, queue, queue_running, demand, now)
        if family == "cohort_quota":
            out.unblock.append(f"idle quota elsewhere in cohort {queue.cohort or '-'} (it borrows only what peers "
                               "lend), or a higher borrowing limit")
        elif family == "reclaim":
            out.unblock.append("its queue's lent quota is being reclaimed from borrowers (after the queue's "
                               "reclaim grace)")
    elif family == "user_limit":
        out.unblock.append("another job of the same user in this queue ends, or the queue's user_max_gpus rises")
    elif family == "budget" and queue is not None:
        out.unblock.append(f"queue {queue.name}'s GPU-hour budget renews next period, or it is raised "
                           "(gpusched queue set --budget-gpu-hours)")
    elif family == "queue_ceiling" and queue is not None:
        # Its queue can never hold it as its quota is now: only a change of that quota helps.
        out.unblock.append(f"raise queue {queue.name}'s quota (nominal, borrowing limit, or what its cohort "
                           f"lends: a peer's lending limit, a queue joining the cohort) so that it can hold "
                           f"{_gpus(demand)}; until then it waits without holding back other jobs")
    elif family == "no_quota_for_models" and queue is not None:
        models = ", ".join(job.spec.gpu_models) if job.spec is not None and job.spec.gpu_models else "its models"
        out.unblock.append(f"queue {queue.name} is given quota of {models} (a flavor); until then it waits without "
                           "holding back other jobs")
    elif family == "no_node":
        # Even an empty cluster could not hold it: no running job ending helps, only the inventory changing.
        out.unblock.append("a node that could hold it (registered, healthy, not cordoned) joins or comes back; until "
                           "then no quota or capacity is held for it, however long it waits")
    elif family == "placement_timeout":
        out.unblock.append("no node could hold it while its quota was reserved, so the quota went back: after its "
                           "backoff it takes quota again, and runs once a node can hold it")
    elif family == "starvation_reservation":
        out.unblock.append("the job that has waited longest in the cohort starts; short jobs that end before "
                           "it could start still go (declare duration_s or max_runtime_s)")
    elif family in ("capacity", "fragmentation", "gang", "topology", "protected_for_preemptor", "starving"):
        _explain_capacity(out, job, cluster_running, nodes, demand, now)
    elif job.phase in ("preempting", "evicted"):
        out.unblock.append("it was preempted and waits in its queue again, from its last checkpoint")
    return out


def _default_message(job: JobView) -> str:
    return {"submitted": "admission has not decided yet", "admitted": "waiting for its queue's quota",
            "reserved": "quota reserved; waiting for GPUs", "evicted": "evicted; waiting to run again"}.get(
        job.phase, job.phase or "waiting")


def _explain_quota(out: Explanation, job: JobView, queue: QueueView, running: list[JobView], demand: int,
                   now: float) -> None:
    if queue.nominal_gpus is None:
        return
    free = queue.nominal_gpus * FULL - round(queue.reserved_gpus * FULL)
    shortfall = max(job.shortfall_milli, demand - free, 0)
    if shortfall == 0:
        out.unblock.append("higher-priority jobs of the queue are served first; it follows them")
        return
    out.unblock.append(f"raise queue {queue.name}'s nominal quota by {_gpus(shortfall)} "
                       f"(it uses {queue.reserved_gpus:g} of {queue.nominal_gpus})")
    found = _when_enough(_release_schedule(running, now), shortfall)
    if found is not None:
        when, jobs = found
        out.unblock.append(f"{_gpus(shortfall)} of queue {queue.name} free when {_names(jobs)} "
                           f"end at about {_at(when)}")
        out.estimated_start = when


def _explain_capacity(out: Explanation, job: JobView, running: list[JobView], nodes: list[NodeView], demand: int,
                      now: float) -> None:
    models = tuple(job.spec.gpu_models) if job.spec else ()
    eligible = [n for n in nodes if n.online and (not models or set(n.models) & set(models))]
    free = sum(_free_for(job, n) for n in eligible)
    label = ",".join(models) or "any model"
    shortfall = max(job.shortfall_milli, demand - free, 0) or demand
    relevant = [j for j in running if not models or any(p.model in models for p in j.placements)]
    found = _when_enough(_release_schedule(relevant, now), shortfall)
    if found is not None:
        when, jobs = found
        out.unblock.append(f"{_gpus(shortfall)} of {label} free when {_names(jobs)} end at about {_at(when)}")
        out.estimated_start = when
    else:
        out.unblock.append(f"{_gpus(shortfall)} more of {label} (no running job declares when it ends)")


def _free_for(job: JobView, node: NodeView) -> int:
    """The node's free GPU capacity the job could use, in milli: a MIG instance's share is no plain GPU's, and a
    whole-GPU job takes only GPUs that are wholly free (what is left of a split GPU holds fractions only)."""
    modes = node.gpu_modes or ("whole",) * len(node.gpu_free_milli)
    plain = [free for free, mode in zip(node.gpu_free_milli, modes, strict=False) if mode != "mig"]
    spec = job.spec
    if spec is not None and (spec.gpu_milli or spec.mig_profile):
        return sum(plain) if not spec.mig_profile else sum(node.gpu_free_milli)
    return sum(free for free in plain if free == FULL)


def _at(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpus(milli: int) -> str:
    n = milli / FULL
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def _names(jobs: list[str]) -> str:
    return ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
