"""Why a job does not fit: the reason codes a failed placement gives (also PlacementDeferred.code) and the
explanation the placer attaches, from the free capacity as a waiting job's owner would read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from contracts import JobSpec
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.device_groups import uses_groups
from libs.core.cluster.feasibility import Request, gpu_fits, node_hosts
from libs.core.cluster.mig_instance_fit import offers
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, Gpu
from libs.core.kernel.accelerators import GPU, kinds_named, model_matches
from libs.core.kernel.policy import demand_milli, replica_milli

# Reason codes of a placement that failed; also PlacementDeferred.code.
NO_MODEL_MATCH = "no_model_match"
INSUFFICIENT_GPUS = "insufficient_gpus"
FRAGMENTATION = "fragmentation"
INSUFFICIENT_CPU_MEMORY = "insufficient_cpu_memory"
TOPOLOGY = "topology"
GANG = "gang"


@dataclass(frozen=True, slots=True)
class Shortfall:
    code: str
    message: str
    shortfall_milli: int



class FitChecker(Protocol):
    """What an explanation asks of the placer (libs.core.cluster.job_fit.Placer): its cluster and array view,
    the view brought up to date, and whether a request would fit now."""

    cluster: Cluster
    arrays: ClusterArrays

    def refresh_outside_sync(self) -> None: ...

    def fits(self, spec: JobSpec) -> bool: ...


def explain_shortfall(placer: FitChecker, spec: JobSpec) -> Shortfall:
    """Why the job does not fit, as a code, a message and the best candidate's shortfall (asked of the cluster's
    own placer, libs.core.cluster.job_fit.placer_for)."""
    cluster = placer.cluster
    a = placer.arrays
    placer.refresh_outside_sync()
    need = demand_milli(spec)
    if spec.mig_profile:
        if not any(offers(g, spec) for g in _allowed_gpus(cluster, spec)):
            return Shortfall(NO_MODEL_MATCH, _no_gpu_offers_profile(cluster, spec), need)
        return Shortfall(FRAGMENTATION, f"no MIG-enabled GPU offering {spec.mig_profile} has its compute and memory "
                                        "slices free (or it holds a job placed without MIG)", need)
    any_usable, free = a.usable_free(tuple(spec.gpu_models), whole=spec.gpu_milli <= 0)
    if not any_usable:
        return Shortfall(NO_MODEL_MATCH, _no_gpu_takes_shares(cluster, spec), need)
    per_replica = replica_milli(spec)
    word = "GPU" if GPU in kinds_named(spec.gpu_models) else "NPU"  # what the job runs on, as its owner says it
    if free < need:
        return Shortfall(INSUFFICIENT_GPUS,
                         f"needs {need / FULL:g} {word}s of allowed models, {free / FULL:g} free", need - free)
    if not any(node_hosts(n, spec) for n in cluster.sorted_nodes()):
        return Shortfall(INSUFFICIENT_CPU_MEMORY, "no node has the CPU, memory and RDMA NICs a replica needs", 0)
    if spec.replicas > 1 and placer.fits(msgspec.structs.replace(spec, replicas=1)):
        return Shortfall(GANG, f"{free / FULL:g} {word}s free, but not all {spec.replicas} replicas of "
                               f"{per_replica / FULL:g} {word} fit at once", per_replica)
    if uses_groups(spec, a.models):
        return Shortfall(FRAGMENTATION, f"{free / FULL:g} {word}s free, but no server has {spec.gpus} free inside "
                                        "one HCCS ring (NPUs of two rings cannot work together)", per_replica)
    if spec.gpu_milli > 0:
        req = Request.of(spec)
        usable = a.online[:, None] & a.gpu_mask(req.models)
        if ((a.free >= req.milli) & usable).any() and not (gpu_fits(a, req) & usable).any():
            memory = f"{spec.gpu_memory_mib} MiB" if spec.gpu_memory_mib else "its share"
            return Shortfall(FRAGMENTATION, f"GPUs have {per_replica / FULL:g} GPU free, but none of them has "
                                            f"{memory} of GPU memory free", per_replica)
    return Shortfall(FRAGMENTATION, f"{free / FULL:g} GPUs free but scattered: no node has "
                                    f"{per_replica / FULL:g} GPU in one piece", per_replica)


def _allowed_gpus(cluster: Cluster, spec: JobSpec) -> list[Gpu]:
    """The GPUs of the job's allowed models on nodes that take work (neither lost nor cordoned)."""
    return [g for n in cluster.sorted_nodes() if n.online for g in n.gpus
            if model_matches(spec.gpu_models, g.model)]


def _none_of(models: str, what: str, counts: dict[str, int]) -> str:
    """The reason no GPU of `models` does `what`, with what keeps each GPU from it ("1 unhealthy, 2 MIG-enabled");
    without any GPU of them on a node that takes work, that."""
    why = ", ".join(f"{n} {reason}" for reason, n in counts.items() if n)
    return f"no GPU of {models} {what}: {why}" if why else f"no GPU of {models} on a node in service"


def _no_gpu_takes_shares(cluster: Cluster, spec: JobSpec) -> str:
    """Why no GPU takes the job's whole GPUs or fractions: a GPU serves one kind of work at a time, so a
    healthy GPU in MIG mode, or one MIG instances still hold, is no more usable than an unhealthy one, and
    the reason says which it is (an operator turns MIG off, or replaces a GPU)."""
    gpus = _allowed_gpus(cluster, spec)
    counts = {"unhealthy": sum(not g.healthy for g in gpus),
              "MIG-enabled (MIG profiles only)": sum(g.healthy and g.mig_enabled for g in gpus),
              "held by MIG instances": sum(g.healthy and not g.mig_enabled and g.mig_instances > 0 for g in gpus)}
    what = "takes a fraction" if spec.gpu_milli > 0 else "takes whole GPUs"
    return _none_of(",".join(spec.gpu_models) or "any model", what, counts)


def _no_gpu_offers_profile(cluster: Cluster, spec: JobSpec) -> str:
    """Why no GPU takes the job's MIG instance: unhealthy, MIG off (whole GPUs and fractions only), or MIG on
    without the profile in its table."""
    gpus = _allowed_gpus(cluster, spec)
    counts = {"unhealthy": sum(not g.healthy for g in gpus),
              "without MIG enabled": sum(g.healthy and not g.mig_enabled for g in gpus),
              f"MIG-enabled without {spec.mig_profile}": sum(g.healthy and g.mig_enabled for g in gpus)}
    return _none_of(",".join(spec.gpu_models) or "any model", f"offers MIG profile {spec.mig_profile}", counts)
