"""Read models served by the API and kept in Redis: projections of the log, never the truth."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from contracts.model import JobSpec, QueueSpec, ReplicaPlacement, ServiceSpec

JOB_STATES = ("pending", "running", "succeeded", "failed", "cancelled", "rejected")
# A job in one of these states is over: nothing about it changes any more.
FINAL_JOB_STATES = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# How many of a job's runs its view keeps (the latest): enough to see where a requeued job went, small enough
# that a job evicted again and again keeps a small view.
RUN_HISTORY = 10


class RunRecord(msgspec.Struct, kw_only=True):
    """One run of a job: where placement put it, when it ran, and how it ended."""

    # The JobPlaced event that began it (what the executors' reports name as `run`).
    run: str
    placements: tuple[ReplicaPlacement, ...] = ()
    placed_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # "" while it lasts; then succeeded, failed, evicted or cancelled.
    outcome: str = ""
    # The failure's or eviction's reason (oom_killed, preempted, node_lost, ...).
    reason: str = ""
    exit_code: int | None = None


def gpu_request(replicas: int = 1, gpus: int = 1, gpu_milli: int = 0, mig_profile: str = "",
                models: Sequence[str] = (), short: bool = False) -> str:
    """A job's GPUs in its user's terms, replicas x what each replica takes: "2 x 1 whole GPU", "1 x 250m of one
    GPU", "1 x MIG 1g.10gb", with the models allowed after it ("(A100 or H100)"); `short`, for a table cell:
    "2x1", "1x250m", "1x1g.10gb" (no models). The fields are JobSpec's, so that readers of the JSON views (which
    leave out fields at their default) and the ledger render one request the same way."""
    if mig_profile:
        per, each = mig_profile, f"MIG {mig_profile}"
    elif gpu_milli > 0:
        per, each = f"{gpu_milli}m", f"{gpu_milli}m of one GPU"
    else:
        per, each = str(gpus), f"{gpus} whole GPU{'' if gpus == 1 else 's'}"
    if short:
        return f"{replicas}x{per}"
    return f"{replicas} x {each}" + (f" ({' or '.join(models)})" if models else "")


def spec_gpus(spec: JobSpec, short: bool = False) -> str:
    """`gpu_request` of a spec, its allowed models included."""
    return gpu_request(spec.replicas, spec.gpus, spec.gpu_milli, spec.mig_profile, spec.gpu_models, short)


class JobView(msgspec.Struct, kw_only=True):
    id: str
    state: str
    team: str
    queue: str
    spec: JobSpec | None = None
    # Finer than `state`: submitted, admitted, reserved, placed, preempting, ...
    phase: str = ""
    reason: str = ""
    message: str = ""
    # What the last deferral said was missing, in thousandths of a GPU.
    shortfall_milli: int = 0
    placements: tuple[ReplicaPlacement, ...] = ()
    submitted_at: float | None = None
    admitted_at: float | None = None
    started_at: float | None = None
    # The first start (started_at is the latest: an evicted job starts again).
    first_started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    evictions: int = 0
    retries: int = 0
    gpu_seconds: float = 0.0
    # Work saved by its last checkpoint (seconds), and GPU time its evictions threw away.
    progress_s: float = 0.0
    lost_gpu_seconds: float = 0.0
    # Its last RUN_HISTORY runs, oldest first (the current one last, open), and how many runs it had in all.
    runs: list[RunRecord] = []
    run_count: int = 0
    # Stream sequence of the last event this view reflects: writes are idempotent and ordered by it.
    seq: int = 0


class FlavorUsage(msgspec.Struct, kw_only=True):
    """A queue's quota and usage of one GPU model ("*": any model), in GPUs."""

    flavor: str
    nominal_gpus: float = 0.0
    borrowing_limit_gpus: float | None = None
    lending_limit_gpus: float | None = None
    in_use_gpus: float = 0.0
    borrowed_gpus: float = 0.0
    lent_gpus: float = 0.0
    # What in_use_gpus is made of: quota held by jobs that have their GPUs (placed or running), and quota
    # reserved by jobs no node has taken yet (they hold the queue's quota while they wait for GPUs).
    held_gpus: float = 0.0
    unplaced_gpus: float = 0.0


class QueueView(msgspec.Struct, kw_only=True):
    name: str
    team: str
    # Total nominal quota (over flavors; a parent's sums its subtree); None: no limit.
    nominal_gpus: int | None = None
    reserved_gpus: float = 0.0
    # reserved_gpus split as FlavorUsage splits in_use_gpus: held by placed jobs, reserved by unplaced ones
    # (a job whose run just ended holds its quota until quota releases it, counted in neither).
    held_gpus: float = 0.0
    unplaced_gpus: float = 0.0
    pending: int = 0
    running: int = 0
    parent: str = ""
    cohort: str = ""
    weight: float = 1.0
    flavors: list[FlavorUsage] = []
    # Weighted, decayed usage relative to nominal: 1.0 is exactly the queue's share.
    fair_share: float = 0.0
    budget_gpu_hours: float | None = None
    budget_left_gpu_hours: float | None = None
    # The queue's definition as the log last set it.
    spec: QueueSpec | None = None
    seq: int = 0


class NodeView(msgspec.Struct, kw_only=True):
    name: str
    online: bool = True
    gpus: int = 0
    models: tuple[str, ...] = ()
    # "gpu", "npu" or both: the kinds of its devices (libs/core/kernel/accelerators.py).
    kinds: tuple[str, ...] = ()
    allocated_gpus: float = 0.0
    healthy_gpus: int = 0
    gpu_free_milli: tuple[int, ...] = ()
    # Per GPU (as gpu_free_milli), how it is shared: "whole" (idle, or held by whole-GPU jobs), "split" (holding
    # fractions of jobs asking for part of a GPU) or "mig" (MIG-enabled: MIG instances only).
    gpu_modes: tuple[str, ...] = ()
    # Free capacity by mode, healthy GPUs only: idle GPUs that take whole-GPU jobs and fractions; split GPUs and
    # the thousandths of a GPU free on them; MIG-enabled GPUs with their compute slices (free and in all).
    idle_gpus: int = 0
    split_gpus: int = 0
    split_free_milli: int = 0
    mig_gpus: int = 0
    mig_slices: int = 0
    mig_free_slices: int = 0
    # An operator took it out of placement ("cordoned"), and stopped its jobs too ("draining"); "" otherwise.
    cordon: str = ""
    cordon_reason: str = ""
    seq: int = 0


class TeamUsage(msgspec.Struct, kw_only=True):
    team: str
    gpu_seconds: float = 0.0
    jobs_finished: int = 0
    # GPU time its jobs' evictions threw away (run time not covered by a checkpoint).
    lost_gpu_seconds: float = 0.0


class Reason(msgspec.Struct, kw_only=True):
    code: str
    message: str


class Explanation(msgspec.Struct, kw_only=True):
    """Why a job is where it is, what would unblock it, and when it should start."""

    job_id: str
    state: str
    phase: str
    reasons: list[Reason] = []
    unblock: list[str] = []
    estimated_start: float | None = None


class ApiError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class JobCreated(msgspec.Struct, kw_only=True):
    id: str
    state: str
    duplicate: bool = False
    # A submission's answer: the spec as stored (for a repeated idempotency key, the one its job was made with).
    spec: JobSpec | None = None
    # A new submission its queue's policy cannot serve now (over its queue's ceiling, no quota of its models,
    # over its user limit): accepted all the same, it waits holding nothing until a policy change gives it room;
    # the reason quota tells it (libs/core/kernel/inadmissible.py). "" when only others' use could hold it.
    reason: str = ""
    message: str = ""


class NodeAction(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /v1/nodes/{name}/cordon|drain|uncordon (optional)."""

    reason: str = ""
    operator: str = ""


class JobLogs(msgspec.Struct, kw_only=True):
    """The tail of a job's output, from the node agent that ran it."""

    node: str
    bytes: int  # the whole log's size; `log` is its last part
    log: str


class ServiceView(msgspec.Struct, kw_only=True):
    """An inference service as the admission core holds it: bounds, desired and ready replicas, last load."""

    name: str
    team: str
    queue: str
    priority: str
    min_replicas: int
    max_replicas: int
    desired_replicas: int
    ready_replicas: int
    # Replica jobs not yet ended (ready, or waiting to run).
    replicas: int
    load: float = 0.0
    metric: str = ""
    spec: ServiceSpec


class LoadReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A service's load, as its gateway reports it."""

    value: float
    metric: str = "requests_per_s"


class ServiceAccepted(msgspec.Struct, kw_only=True):
    name: str
    # deploying, updating or deleting: the command is in the log; the service's view follows.
    state: str
