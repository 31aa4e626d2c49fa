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
    # A MIG profile such as "1g.10gb" or "3g.40gb": one MIG instance on a MIG-enabled GPU per replica.
    mig_profile: str = ""
    rdma_nics: int = 0
    # Where a gang's replicas should land together: "" (anywhere), "node", "rack" or "block".
    topology: str = ""
    # With a topology: fail rather than spread wider than asked.
    topology_required: bool = False
    # Replicas on distinct nodes (failure domains), e.g. for inference.
    spread: bool = False


class GpuSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    healthy: bool = True
    kind: str = "gpu"
    # GPUs of a node with the same group id are NVLink-connected; -1: PCIe only.
    nvlink_group: int = -1
    mig_enabled: bool = False


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    gpus: tuple[GpuSpec, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: dict[str, str] = {}
    rdma_nics: int = 0


class QueueSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    team: str
    # Nominal GPU quota of the queue; None means no limit.
    nominal_gpus: int | None = None
    weight: float = 1.0
    # Placement policy for the queue's jobs (best-fit, fgd, spread, packing); "" means the default.
    placement_policy: str = ""


class PriorityClass(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    value: int
    preemptible: bool = True
    min_runtime_s: float = 0.0
    # Overrides the queue's placement policy for jobs of this class; "" means no override.
    placement_policy: str = ""


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


class Victim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job_id: str
    queue: str
    priority: int
    gpu_milli: int
    reason: str
