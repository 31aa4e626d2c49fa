"""Whether a job can ever be admitted: every reason it never could, each with its own code. The same check
answers the HTTP request at once and decides the logged outcome, so the API and the log never disagree about
what is acceptable.

Refused is only what no policy change could ever serve:
- a malformed request (replicas, GPUs or fraction, CPU and memory, durations, a MIG profile or topology that
  names nothing);
- a reference that names nothing the job could be judged by, each refused rather than kept waiting for a policy
  that might one day name it: an unknown team (a team is the caller's identity; a team with no queue has no
  quota, no fair share, nothing a job could be ranked by), an unknown queue or priority class (a name that
  matches nothing is a mistake to hear of at once, not a wait: a queue created later under that name could be
  another team's, and a job without a class has no priority, preemptibility or protection to be judged by), a
  queue that groups others (it takes no jobs; the caller must choose one of its leaves, which a quota change
  never does for them), a queue of another team (authorisation: a job may only spend its own team's quota, and
  a later move of the queue must not carry a job across teams);
- more than the cluster as registered could ever give (capacity.py): any node, any GPU, any GPU model, MIG
  profile or topology domain it knows.
What a policy change could serve is admitted and waits, holding nothing, told why at once: more than its
queue's ceiling or no quota of its models as the quota is now, more than its queue lets one user hold
(libs/core/kernel/inadmissible.py, whose `waits_by_policy` the HTTP API answers a submission with)."""

from __future__ import annotations

from contracts import JobSpec
from libs.core.admission.capacity import Inventory, Rejection, capacity_rejection, spec_problem
from libs.core.kernel.policy import PolicyBook


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
    return spec_problem(spec) or capacity_rejection(spec, inventory)
