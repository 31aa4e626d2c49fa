"""Where a job's replicas fit: best-fit for whole GPUs and GPU fractions, gangs all or nothing.

Best-fit keeps big holes for big jobs: a whole-GPU replica goes to the eligible node with the fewest idle
GPUs left over; a fractional replica goes to the eligible GPU with the least share left over, so partly
used GPUs fill up before idle ones are broken.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster import FULL, Cluster, Gpu, Node
from libs.core.policy import demand_milli, replica_milli

# Reason codes of a placement that failed; also used by PlacementDeferred.code.
NO_MODEL_MATCH = "no_model_match"
INSUFFICIENT_GPUS = "insufficient_gpus"
FRAGMENTATION = "fragmentation"
INSUFFICIENT_CPU_MEMORY = "insufficient_cpu_memory"


@dataclass(frozen=True, slots=True)
class Shortfall:
    code: str
    message: str
    shortfall_milli: int


def _model_ok(spec: JobSpec, model: str) -> bool:
    return not spec.gpu_models or model in spec.gpu_models


def _host_ok(node: Node, spec: JobSpec) -> bool:
    return (
        node.online
        and node.free_cpu_milli >= spec.cpu_milli
        and node.free_memory_mib >= spec.memory_mib
        and (not spec.gpu_models or any(m in node.models for m in spec.gpu_models))
    )


def _whole_gpu_choice(cluster: Cluster, spec: JobSpec) -> tuple[Node, list[Gpu]] | None:
    best: tuple[int, str] | None = None
    choice: tuple[Node, list[Gpu]] | None = None
    for node in cluster.sorted_nodes():
        if not _host_ok(node, spec):
            continue
        idle = [g for g in node.idle_gpus() if _model_ok(spec, g.model)
                and g.free_memory_mib >= spec.gpu_memory_mib]
        if len(idle) < spec.gpus:
            continue
        # One replica's GPUs are of one model: take the model with the most idle GPUs here.
        by_model: dict[str, list[Gpu]] = {}
        for g in idle:
            by_model.setdefault(g.model, []).append(g)
        model = min(by_model, key=lambda m: (-len(by_model[m]), m))
        gpus = by_model[model]
        if len(gpus) < spec.gpus:
            continue
        score = (len(idle) - spec.gpus, node.name)
        if best is None or score < best:
            best, choice = score, (node, gpus[: spec.gpus])
            if score[0] == 0:
                break
    return choice


def _fraction_choice(cluster: Cluster, spec: JobSpec) -> tuple[Node, Gpu] | None:
    best: tuple[int, str, int] | None = None
    choice: tuple[Node, Gpu] | None = None
    for node in cluster.sorted_nodes():
        if not _host_ok(node, spec):
            continue
        for g in node.gpus:
            if (not g.healthy or g.free_milli < spec.gpu_milli or not _model_ok(spec, g.model)
                    or g.free_memory_mib < spec.gpu_memory_mib):
                continue
            score = (g.free_milli - spec.gpu_milli, node.name, g.index)
            if best is None or score < best:
                best, choice = score, (node, g)
    return choice


def place_replica(cluster: Cluster, spec: JobSpec, replica: int) -> ReplicaPlacement | None:
    """Choose and allocate one replica; None when it fits nowhere."""
    if spec.gpu_milli > 0:
        found = _fraction_choice(cluster, spec)
        if found is None:
            return None
        node, gpu = found
        placement = ReplicaPlacement(
            replica=replica, node=node.name, gpu_indices=(gpu.index,), gpu_milli=spec.gpu_milli,
            gpu_memory_mib=spec.gpu_memory_mib, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
            model=gpu.model)
    else:
        whole = _whole_gpu_choice(cluster, spec)
        if whole is None:
            return None
        node, gpus = whole
        placement = ReplicaPlacement(
            replica=replica, node=node.name, gpu_indices=tuple(g.index for g in gpus), gpu_milli=FULL,
            gpu_memory_mib=spec.gpu_memory_mib, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
            model=gpus[0].model)
    cluster.allocate((placement,))
    return placement


def place_gang(cluster: Cluster, spec: JobSpec) -> tuple[ReplicaPlacement, ...] | Shortfall:
    """Place every replica or none: on failure the cluster is left exactly as it was."""
    placed: list[ReplicaPlacement] = []
    for replica in range(spec.replicas):
        p = place_replica(cluster, spec, replica)
        if p is None:
            cluster.release(placed)
            return explain_shortfall(cluster, spec, placed_replicas=len(placed))
        placed.append(p)
    return tuple(placed)


def fits(cluster: Cluster, spec: JobSpec) -> bool:
    """Would the job fit now? Leaves the cluster unchanged."""
    result = place_gang(cluster, spec)
    if isinstance(result, Shortfall):
        return False
    cluster.release(result)
    return True


def explain_shortfall(cluster: Cluster, spec: JobSpec, placed_replicas: int) -> Shortfall:
    eligible = [g for n in cluster.sorted_nodes() if n.online for g in n.gpus
                if g.healthy and _model_ok(spec, g.model)]
    if not eligible:
        models = ",".join(spec.gpu_models) or "any"
        return Shortfall(NO_MODEL_MATCH, f"no healthy GPU of model {models}", demand_milli(spec))
    per_replica = replica_milli(spec)
    free = sum(g.free_milli for g in eligible) if spec.gpu_milli > 0 else sum(FULL for g in eligible if g.idle)
    need = demand_milli(spec)
    if free < need:
        return Shortfall(INSUFFICIENT_GPUS,
                         f"needs {need / FULL:g} GPUs of allowed models, {free / FULL:g} free", need - free)
    hosts_ok = any(_host_ok(n, spec) for n in cluster.sorted_nodes())
    if not hosts_ok:
        return Shortfall(INSUFFICIENT_CPU_MEMORY, "no node has the CPU and memory a replica needs", 0)
    return Shortfall(FRAGMENTATION,
                     f"{free / FULL:g} GPUs free but scattered: {placed_replicas} of {spec.replicas} replicas "
                     f"of {per_replica / FULL:g} GPU fit", per_replica)
