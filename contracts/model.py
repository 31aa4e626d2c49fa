"""Value objects shared by commands and events: jobs, nodes, queues, priority classes.

Every Struct omits fields equal to their default when encoded: a field added later (always with a
default) leaves the bytes of every older event unchanged, so recorded logs replay byte for byte.
"""

from __future__ import annotations

import msgspec


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a producer asks for. Semantic checks (and their reason codes) live in the admission core,
    so that a bad spec arriving over the bus is rejected with a reason instead of dead-lettered."""

    team: str
    queue: str
    user: str = ""
    # What the GPU time is charged to inside the team (usage reports group by it); "" for none.
    project: str = ""
    name: str = ""
    workload: str = "training"
    priority: str = "training"
    replicas: int = 1
    # Whole GPUs per replica. Ignored when gpu_milli is set.
    gpus: int = 1
    # A fraction of ONE GPU per replica, in thousandths (1..999). 0 means whole GPUs.
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    # The accelerator models a replica may run on: model names ("A100", "Ascend910"), or "gpu:*" / "npu:*" for
    # any model of that kind; empty means any GPU (libs/core/kernel/accelerators.py).
    gpu_models: tuple[str, ...] = ()
    # The job's code runs on NVIDIA GPUs and on Ascend NPUs alike: its models may name both vendors.
    mixed_vendors: bool = False
    # The user's estimate of the job's runtime: what the deciders believe (backfill, shadows, ETAs; see
    # `libs.core.kernel.policy.declared_runtime`). The simulated executor runs a job this long unless its
    # `sim/runtime-s` label says how long it really runs. Not enforced.
    duration_s: float | None = None
    # A declared limit, enforced: an executor stops a run at this many seconds of wall time (per run, as
    # Slurm's time limit) and reports it failed with reason RUNTIME_LIMIT, never retried. Without an
    # estimate the deciders believe the job runs this long. Neither set: nothing is declared.
    max_runtime_s: float | None = None
    command: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    idempotency_key: str = ""
    # A MIG profile such as "1g.10gb" or "3g.40gb": one MIG instance on a MIG-enabled GPU per replica; or an
    # Ascend vNPU template such as "vir04": one virtual NPU on an NPU split into vNPUs.
    mig_profile: str = ""
    rdma_nics: int = 0
    # Where a gang's replicas should land together: "" (anywhere), "node", "rack" or "block".
    topology: str = ""
    # With a topology: fail rather than spread wider than asked.
    topology_required: bool = False
    # Replicas on distinct nodes (failure domains), e.g. for inference.
    spread: bool = False
    # The job saves its state at least this often and on a stop signal (SIGTERM): preempting it loses
    # little. None: it does not checkpoint, and an eviction loses all its work since it started.
    checkpoint_interval_s: float | None = None
    # Exit codes that mean "try again" besides 128+ (killed by a signal) and infrastructure failures.
    retry_exit_codes: tuple[int, ...] = ()
    # The inference service this job is a replica of ("" for none). With `spread`, placement keeps a
    # service's replicas apart: other racks first, then other nodes, as failure domains.
    service: str = ""
    # A service replica that tells its executor when it serves (`libs.jobkit.ready()`, e.g. once its model is
    # loaded); without it, a replica is ready as soon as it runs.
    ready_signal: bool = False


class Autoscaling(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """How a service's replica count follows its load, by the rules of the Kubernetes HPA: desired =
    ceil(load / target per replica), within a tolerance, stabilised over windows, with cooldowns."""

    # "requests_per_s" or "queue_length": the service's total, reported on the bus; "gpu_utilization": the
    # mean percent over its ready replicas.
    metric: str = "requests_per_s"
    target_per_replica: float
    # No change while load / (replicas x target) is within 1 +- tolerance.
    tolerance: float = 0.1
    # A scale-up goes to the lowest, a scale-down to the highest recommendation of its window.
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    # Least time between two scale-ups, and from any scale to a scale-down.
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 0.0


class ServiceSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A long-running inference service: between min and max replicas of one replica job each (whose spec
    gives team, queue, priority class, resources and command), scaled by its load."""

    name: str
    replica: JobSpec
    min_replicas: int = 1
    max_replicas: int = 1
    # None: a fixed count of min_replicas.
    autoscaling: Autoscaling | None = None
    # Replicas prefer distinct racks, then distinct nodes (failure domains).
    spread: bool = True


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One accelerator of a node: an NVIDIA GPU or a Huawei Ascend NPU (libs/core/kernel/accelerators.py)."""

    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    healthy: bool = True
    # "gpu" or "npu".
    kind: str = "gpu"
    # "nvidia" or "huawei".
    vendor: str = "nvidia"
    # GPUs of a node with the same group id are NVLink-connected; -1: PCIe only.
    nvlink_group: int = -1
    mig_enabled: bool = False
    # NPUs of a node with the same group id share an HCCS ring (Ascend 910) or mesh (910B): a job of up to a
    # group's size must stay inside one group. -1: not an NPU, or not known.
    hccs_group: int = -1


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    gpus: tuple[GpuSpec, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = {}
    rdma_nics: int = 0


class FlavorQuota(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A queue's quota for one GPU model ("flavor"), in GPUs. The order of a queue's flavors is the order in
    which a job that allows several models tries them."""

    # A GPU model name, or "*" for GPUs of any model.
    model: str = "*"
    nominal_gpus: int = 0
    # How far above nominal the queue may borrow idle quota from its cohort; None: as far as the cohort lends.
    borrowing_limit_gpus: int | None = None
    # How much of the nominal the queue lends to its cohort when idle; None: all of it.
    lending_limit_gpus: int | None = None


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A node of the queue tree (organisation / team / project). Jobs go to leaf queues; a parent groups its
    children for fair share and, unless a child names another, is their cohort."""

    name: str
    team: str
    # Nominal GPU quota of the queue (any model); None means no limit. Shorthand for one "*" flavor.
    nominal_gpus: int | None = None
    weight: float = 1.0
    # Placement policy for the queue's jobs (best-fit, fgd, spread, packing); "" means the default.
    placement_policy: str = ""
    parent: str = ""
    # Queues of one cohort lend each other idle quota; "" means the parent's name ("" without a parent: none).
    cohort: str = ""
    # With nominal_gpus: borrowing and lending limits of that single flavor.
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None
    # Quota per GPU model; when set, nominal_gpus and its limits must be unset.
    flavors: tuple[FlavorQuota, ...] = ()
    # GPU-hours the queue may spend per budget period (calendar day, ISO week or month, UTC).
    budget_gpu_hours: float | None = None
    budget_period: str = "month"
    # When the budget is spent: "borrow" (further jobs run only on idle borrowed quota, preemptible) or "wait".
    over_budget: str = "borrow"
    # Most GPUs one user may hold in this queue at once.
    user_max_gpus: int | None = None
    # How long a queue under its nominal quota with pending work lets borrowers finish on their own before
    # the preemption service reclaims its quota from them.
    reclaim_after_s: float = 0.0
    # Blast radius: at most this many of the queue's GPUs are chosen for eviction per window. None: no cap.
    eviction_budget_gpus: int | None = None
    eviction_window_s: float = 3600.0
    # Least attained service inside the queue (as Tiresias): a job that has held more than this many GPU-hours
    # (over all its runs) waits behind the queue's jobs of its priority that have held less, and may be
    # preempted for them (through the checkpoint handshake). None: by priority and arrival only.
    las_threshold_gpu_hours: float | None = None
    # Preemption and flavor policies, as Kueue's ClusterQueue names them (libs/core/kernel/queue_policies.py):
    # whom a reclaim of this queue's lent quota may evict in other queues of its cohort (Kueue
    # preemption.reclaimWithinCohort): "any" (Any), "lower-priority" (LowerPriority) or "never" (Never).
    reclaim_within_cohort: str = "any"
    # Whom a job may preempt in its own queue (preemption.withinClusterQueue): "lower-priority"
    # (LowerPriority), "lower-or-newer-equal-priority" (LowerOrNewerEqualPriority) or "never" (Never).
    within_queue_preemption: str = "lower-priority"
    # May a job that must borrow to fit evict jobs of other queues of its cohort (preemption.borrowWithinCohort
    # policy): "never" (Never) or "lower-priority" (LowerPriority: jobs of lower priority, at most
    # borrow_within_cohort_max_priority when set: maxPriorityThreshold).
    borrow_within_cohort: str = "never"
    borrow_within_cohort_max_priority: int | None = None
    # Flavor fungibility (flavorFungibility): where the first flavor with room would need borrowing, "borrow"
    # (Borrow) takes it, "try-next-flavor" (TryNextFlavor) takes a later flavor that needs none first; where
    # the queue's nominal quota of a flavor would hold the job once a reclaim takes its lent quota back,
    # "try-next-flavor" (TryNextFlavor) reserves a later flavor with room, "preempt" (Preempt) waits for it.
    when_can_borrow: str = "borrow"
    when_can_preempt: str = "try-next-flavor"


class SchedulingSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Platform-wide knobs of the fair order and of starvation protection."""

    # Past usage counts toward fair share with this half-life (Slurm's PriorityDecayHalfLife); 0: only now.
    fair_share_half_life_s: float = 7 * 24 * 3600.0
    # A job waiting longer than this gets its quota reserved; later jobs backfill only if they end before
    # the reservation is needed. None: never.
    starvation_after_s: float | None = 600.0
    # A job expected to end (by its declared duration) within this many seconds is never evicted: waiting
    # for it costs less than redoing its work.
    preempt_min_remaining_s: float = 10.0
    # One preemption decision may evict at most the preemptor's need plus this many GPUs.
    preemption_slack_gpus: int = 8
    # A job whose quota is reserved but which placement has not placed this long after (it deferred it: no
    # node holds it) gives its quota back and waits again, after a backoff that doubles each time (Kueue's
    # waitForPodsReady). None: a reservation is kept until the job is placed.
    placement_timeout_s: float | None = 300.0


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True
    min_runtime_s: float = 0.0
    # Overrides the queue's placement policy for jobs of this class; "" means no override.
    placement_policy: str = ""
    # A retryable failure runs the job again, at most this often, after retry_backoff_s x 2^(n-1).
    max_retries: int = 2
    retry_backoff_s: float = 10.0
    # Told to stop (preempted), a job has this long to report its checkpoint; then it is killed and keeps
    # only its last periodic checkpoint.
    checkpoint_grace_s: float = 30.0


class ReplicaPlacement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    replica: int
    node: str
    gpu_indices: tuple[int, ...]
    # Share of each listed GPU in thousandths: 1000 for whole GPUs.
    gpu_milli: int
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    model: str = ""
    # MIG slices taken on each listed GPU (MIG requests only).
    mig_slices: int = 0
    rdma_nics: int = 0


# A Victim's reason: its queue gives back quota it borrows (a reclaim), it makes way for a job of higher
# priority of its own queue (or, where the queue allows it, of its priority submitted before it), or (a queue
# of least attained service) for a job of its priority that has held less GPU time than the queue's
# threshold, where it has held more.
RECLAIM = "reclaim"
WITHIN_QUEUE_PRIORITY = "within_queue_priority"
LEAST_ATTAINED_SERVICE = "least_attained_service"
# A job that must borrow to fit takes a borrower of another queue of its cohort, of lower priority (its queue's
# borrow_within_cohort: Kueue's preemption.borrowWithinCohort).
BORROW_WITHIN_COHORT = "borrow_within_cohort"

# The values of a queue's preemption and flavor settings (QueueSpec reclaim_within_cohort and the fields after
# it; the rule of each is libs/core/kernel/queue_policies.py), each setting's values with its default first:
# stated here so that whoever edits a queue (the CLI) offers them without loading the decision core.
NEVER = "never"
ANY_PRIORITY = "any"
LOWER_PRIORITY = "lower-priority"
LOWER_OR_NEWER_EQUAL_PRIORITY = "lower-or-newer-equal-priority"
BORROW = "borrow"
TRY_NEXT_FLAVOR = "try-next-flavor"
PREEMPT = "preempt"
QUEUE_POLICY_CHOICES: dict[str, tuple[str, ...]] = {
    "reclaim_within_cohort": (ANY_PRIORITY, LOWER_PRIORITY, NEVER),
    "within_queue_preemption": (LOWER_PRIORITY, LOWER_OR_NEWER_EQUAL_PRIORITY, NEVER),
    "borrow_within_cohort": (NEVER, LOWER_PRIORITY),
    "when_can_borrow": (BORROW, TRY_NEXT_FLAVOR),
    "when_can_preempt": (TRY_NEXT_FLAVOR, PREEMPT),
}

class Victim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job_id: str
    queue: str
    priority: int
    gpu_milli: int
    reason: str
    # The ordering criteria that selected it (after borrower-first and priority): GPU-seconds its eviction
    # throws away, and when it started.
    lost_gpu_seconds: float = 0.0
    started_at: float | None = None
