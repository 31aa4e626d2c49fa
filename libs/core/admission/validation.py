"""Whether a job can ever be admitted: every reason it never could, each with its own code (its team, queue and
priority class, its resources, what the cluster could ever offer, its user's limit and its queue's quota). The
same check answers the HTTP request at once and decides the logged outcome, so the API and the log never
disagree about what is acceptable."""

from __future__ import annotations

from contracts import JobSpec
from libs.core.admission.capacity import Inventory, Rejection, capacity_rejection, spec_problem
from libs.core.kernel.policy import PolicyBook, demand_milli, replica_milli


def validate(spec: JobSpec, policy: PolicyBook, inventory: Inventory) -> Rejection | None:
    """Every reason a job can never be admitted, each with its own code; None when acceptable."""
    queue = policy.queues.get(spec.queue)
    if not policy.has_team(spec.team):
        return Rejection("unknown_team", f"team {spec.team!r} has no queue")
    if queue is None:
        return Rejection("unknown_queue", f"queue {spec.queue!r} does not exist")
    if not policy.quotas.is_leaf(spec.queue):
        children = ", ".join(policy.quotas.children.get(spec.queue, []))
        return Rejection("queue_not_leaf", f"queue {spec.queue!r} groups other queues ({children}); submit to one")
    if queue.team != spec.team:
        return Rejection("queue_not_of_team", f"queue {spec.queue!r} belongs to team {queue.team!r}")
    if spec.priority not in policy.classes:
        known = ", ".join(sorted(policy.classes))
        return Rejection("unknown_priority_class", f"priority class {spec.priority!r} unknown ({known})")
    if spec.replicas < 1:
        return Rejection("invalid_replicas", f"replicas must be >= 1, got {spec.replicas}")
    if spec.gpu_milli < 0 or spec.gpu_milli >= 1000:
        return Rejection("gpu_milli_out_of_range", f"gpu_milli must be 1..999, got {spec.gpu_milli}")
    if spec.gpu_milli == 0 and spec.gpus <= 0:
        return Rejection("invalid_resources", f"a job needs at least one GPU or a GPU fraction, got gpus={spec.gpus}")
    if spec.gpu_milli > 0 and spec.gpus > 1:
        return Rejection("invalid_resources", "a GPU fraction is a share of one GPU: gpus must be 0 or 1")
    for name, value in (("cpu_milli", spec.cpu_milli), ("memory_mib", spec.memory_mib),
                        ("gpu_memory_mib", spec.gpu_memory_mib)):
        if value < 0:
            return Rejection("invalid_resources", f"{name} must be >= 0, got {value}")
    for name, maybe in (("duration_s", spec.duration_s), ("max_runtime_s", spec.max_runtime_s)):
        if maybe is not None and maybe <= 0:
            return Rejection("invalid_duration", f"{name} must be > 0, got {maybe}")
    problem = spec_problem(spec) or capacity_rejection(spec, inventory)
    if problem is not None:
        return problem
    if queue.user_max_gpus is not None and demand_milli(spec) > queue.user_max_gpus * 1000:
        return Rejection("exceeds_user_limit", f"the job needs {demand_milli(spec) / 1000:g} GPUs; a user of queue "
                         f"{spec.queue!r} may hold at most {queue.user_max_gpus}")
    book = policy.quotas
    if book.governed(spec.queue):
        flavors = book.flavors_for(spec.queue, spec)
        if not flavors:
            return Rejection("no_quota_for_models", f"queue {spec.queue!r} has no quota for GPU model(s) "
                             f"{', '.join(spec.gpu_models)}")
        borrows = policy.preemptible(spec)  # a job that cannot be preempted never borrows (see quota)
        most = max(book.ceiling(spec.queue, f, borrows) for f in flavors)
        if demand_milli(spec) > most:
            how = "with borrowing" if borrows else "within its nominal quota, as the job cannot be preempted"
            return Rejection("exceeds_queue_quota",
                             f"the job needs {demand_milli(spec) / 1000:g} GPUs; queue {spec.queue!r} can hold at "
                             f"most {most / 1000:g} {how} ({replica_milli(spec) / 1000:g} per replica)")
    return None
