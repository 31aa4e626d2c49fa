"""Read models served by the API and kept in Redis: projections of the log, never the truth."""

from __future__ import annotations

import msgspec

from contracts.model import JobSpec, QueueSpec, ReplicaPlacement, ServiceSpec

JOB_STATES = ("pending", "running", "succeeded", "failed", "cancelled", "rejected")


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


class QueueView(msgspec.Struct, kw_only=True):
    name: str
    team: str
    # Total nominal quota (over flavors; a parent's sums its subtree); None: no limit.
    nominal_gpus: int | None = None
    reserved_gpus: float = 0.0
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
    allocated_gpus: float = 0.0
    healthy_gpus: int = 0
    gpu_free_milli: tuple[int, ...] = ()
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
