"""A placement is a whole gang: every replica at once, each with all it asked for, on one GPU model, inside
the topology the job requires."""

from __future__ import annotations

from contracts import JobPlaced, JobSpec, ReplicaPlacement
from libs.audit.guarantees.violation import GANG_ALL_OR_NOTHING, Violation
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, mig_slices
from libs.core.kernel.accelerators import model_matches


def gang_violations(seq: int, event: JobPlaced, spec: JobSpec | None, cluster: Cluster) -> list[Violation]:
    if spec is None:
        return []  # a placement of a job the log never described: nothing to hold it to
    job = event.job_id
    problems = [*_replicas(event.placements, spec), *_models(event.placements, spec, cluster),
                *_topology(event.placements, spec, cluster)]
    return [Violation(GANG_ALL_OR_NOTHING, seq, (job,), f"job {job}: {p}") for p in problems]


def _replicas(placements: tuple[ReplicaPlacement, ...], spec: JobSpec) -> list[str]:
    replicas = sorted(p.replica for p in placements)
    if replicas != list(range(spec.replicas)):
        return [f"placed replicas {replicas} of {spec.replicas} in one decision (a gang is placed whole or not at all)"]
    out = []
    for p in placements:
        if spec.mig_profile:
            want = mig_slices(spec.mig_profile)
            if len(p.gpu_indices) != 1 or p.mig_slices != want:
                out.append(f"replica {p.replica} got {len(p.gpu_indices)} GPUs with {p.mig_slices} MIG slices, "
                           f"asked one {spec.mig_profile} instance ({want} slices)")
        elif spec.gpu_milli > 0:
            if len(p.gpu_indices) != 1 or p.gpu_milli != spec.gpu_milli:
                out.append(f"replica {p.replica} got {len(p.gpu_indices)} GPUs at {p.gpu_milli} milli, asked one "
                           f"GPU at {spec.gpu_milli} milli")
        elif len(p.gpu_indices) != spec.gpus or (spec.gpus and p.gpu_milli != FULL):
            out.append(f"replica {p.replica} got {len(p.gpu_indices)} GPUs at {p.gpu_milli} milli, asked "
                       f"{spec.gpus} whole GPUs")
    return out


def _models(placements: tuple[ReplicaPlacement, ...], spec: JobSpec, cluster: Cluster) -> list[str]:
    models = sorted({cluster.nodes[p.node].gpu(i).model for p in placements if p.node in cluster.nodes
                     for i in p.gpu_indices if any(g.index == i for g in cluster.nodes[p.node].gpus)})
    out = []
    if len(models) > 1:
        out.append(f"replicas on several GPU models ({', '.join(models)})")
    if any(not model_matches(spec.gpu_models, m) for m in models):
        out.append(f"on {', '.join(models)}, outside its allowed models ({', '.join(spec.gpu_models)})")
    return out


def _topology(placements: tuple[ReplicaPlacement, ...], spec: JobSpec, cluster: Cluster) -> list[str]:
    if not (spec.topology and spec.topology_required) or not placements:
        return []
    if spec.topology == "node":
        domains = {p.node for p in placements}
    else:
        domains = {cluster.nodes[p.node].labels.get(spec.topology, "") if p.node in cluster.nodes else ""
                   for p in placements}
    if len(domains) == 1 and "" not in domains:
        return []
    names = ", ".join(sorted(d or "(unlabelled)" for d in domains))
    return [f"requires one {spec.topology} for all replicas, placed across {names}"]
