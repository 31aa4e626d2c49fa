"""Value objects shared by commands and events: jobs, nodes, queues, priority classes."""

from __future__ import annotations

import msgspec


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a producer asks for. Semantic checks (and their reason codes) live in the admission core,
    so that a bad spec arriving over the bus is rejected with a reason instead of dead-lettered."""

    team: str
    queue: str
    user: str = ""
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
    # Allowed GPU models; empty means any model.
    gpu_models: tuple[str, ...] = ()
    # Declared runtime: the simulated executor runs the job this long; estimates use it.
    duration_s: float | None = None
    max_runtime_s: float | None = None
    command: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    idempotency_key: str = ""


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    healthy: bool = True


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    gpus: tuple[GpuSpec, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = {}


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    team: str
    # Nominal GPU quota of the queue; None means no limit.
    nominal_gpus: int | None = None
    weight: float = 1.0


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True
    min_runtime_s: float = 0.0


class ReplicaPlacement(msgspec.Struct, frozen=True, kw_only=True):
    replica: int
    node: str
    gpu_indices: tuple[int, ...]
    # Share of each listed GPU in thousandths: 1000 for whole GPUs.
    gpu_milli: int
    gpu_memory_mib: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    model: str = ""


class Victim(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    queue: str
    priority: int
    gpu_milli: int
    reason: str
