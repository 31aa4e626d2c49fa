"""Whether the runs on a node still fit it once it registers again with another spec (fewer GPUs, another
model, MIG switched, less GPU memory, CPU, memory or RDMA NICs). Both executors stop the runs this names, an
infrastructure stop that puts the jobs back in line, so that no run goes on overcommitting its node.

A run that cannot go on at all (a GPU index gone, a model it may not run on, MIG turned off under its
instance, a MIG profile the GPU no longer offers) stops. The model a run may run on is the one its quota flavor
bound it to (placement placed it on that model alone, and its queue is charged for that model), else any its
job allows: a run reserved under A100 quota does not go on, still charged to A100, on a node now of H100.

Of the rest, while the node's runs together take more than it has, the latest placed run that takes part in
an overcommitted resource stops (job id breaks ties), until the others fit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import GpuSpec, NodeSpec, ReplicaPlacement
from libs.core.kernel.accelerators import model_matches
from libs.core.kernel.mig_profiles import lookup, memory_slices, product

FULL = 1000  # thousandths of a GPU


@dataclass(frozen=True, slots=True)
class RunOnNode:
    """One run's pieces on the node, as its placement made them, and what its job allows."""

    job_id: str
    placed_at: float  # its JobPlaced's time: the later placed stops first
    pieces: tuple[ReplicaPlacement, ...]  # its replicas on this node
    gpu_models: tuple[str, ...] = ()  # models the job allows; empty: any
    mig_profile: str = ""
    bound_model: str = ""  # the model of the quota flavor it runs under (its QuotaReserved's); "": any model

    def models(self) -> tuple[str, ...]:
        """The models the run may go on running on (empty: any)."""
        return (self.bound_model,) if self.bound_model else self.gpu_models


def runs_to_stop(node: NodeSpec, runs: Sequence[RunOnNode]) -> list[str]:
    """Job ids of the runs that must stop for the rest to fit `node` as registered now, in stop order."""
    gpus = {g.index: g for g in node.gpus}
    mine = [r for r in runs if any(p.node == node.name for p in r.pieces)]
    stopped = [r for r in mine if not _can_run(r, node.name, gpus)]
    kept = sorted((r for r in mine if r not in stopped), key=lambda r: (r.placed_at, r.job_id))
    while kept:
        over = _overcommitted(node, gpus, kept)
        culprits = [r for r in kept if _takes_part(r, node.name, over)]
        if not culprits:
            break
        last = culprits[-1]
        kept.remove(last)
        stopped.append(last)
    return [r.job_id for r in stopped]


def _can_run(run: RunOnNode, name: str, gpus: dict[int, GpuSpec]) -> bool:
    models = run.models()
    for p in run.pieces:
        if p.node != name:
            continue
        for i in p.gpu_indices:
            gpu = gpus.get(i)
            if gpu is None or not model_matches(models, gpu.model):
                return False
            if run.mig_profile and not gpu.mig_enabled:
                return False  # MIG turned off under an instance (one turned on under a share waits for it)
            if run.mig_profile and lookup(gpu.model, gpu.memory_mib, run.mig_profile) is None:
                return False
    return True


def _gpu_memory(run: RunOnNode, piece: ReplicaPlacement, gpu: GpuSpec) -> int:
    """GPU memory the piece holds on `gpu`: its MIG instance's memory slices, what it asked for, or its share."""
    if run.mig_profile:
        found = product(gpu.model, gpu.memory_mib)
        profile = None if found is None else found.profile(run.mig_profile)
        return 0 if found is None or profile is None else memory_slices(found, profile)
    if piece.gpu_memory_mib:
        return piece.gpu_memory_mib
    return gpu.memory_mib * piece.gpu_milli // FULL


def _overcommitted(node: NodeSpec, gpus: dict[int, GpuSpec], runs: Sequence[RunOnNode]) -> set[str | int]:
    """The resources the runs together take more of than the node has: GPU indices, and "cpu", "memory", "rdma"."""
    milli: dict[int, int] = {}
    memory: dict[int, int] = {}
    cpu = mem = rdma = 0
    for run in runs:
        for p in run.pieces:
            if p.node != node.name:
                continue
            cpu, mem, rdma = cpu + p.cpu_milli, mem + p.memory_mib, rdma + p.rdma_nics
            for i in p.gpu_indices:
                if gpus[i].mig_enabled and not run.mig_profile:
                    continue  # a share from before MIG was turned on: the deciders place no instance beside it
                milli[i] = milli.get(i, 0) + p.gpu_milli
                memory[i] = memory.get(i, 0) + _gpu_memory(run, p, gpus[i])
    over: set[str | int] = set()
    for i in sorted(milli):
        gpu = gpus[i]
        if gpu.mig_enabled:
            found = product(gpu.model, gpu.memory_mib)
            if found is not None and memory[i] > found.memory_slices:
                over.add(i)
        elif milli[i] > FULL or (gpu.memory_mib and memory[i] > gpu.memory_mib):
            over.add(i)
    if cpu > node.cpu_milli:
        over.add("cpu")
    if mem > node.memory_mib:
        over.add("memory")
    if rdma > node.rdma_nics:
        over.add("rdma")
    return over


def _takes_part(run: RunOnNode, name: str, over: set[str | int]) -> bool:
    for p in run.pieces:
        if p.node != name:
            continue
        if any(i in over for i in p.gpu_indices):
            return True
        if ("cpu" in over and p.cpu_milli) or ("memory" in over and p.memory_mib) or ("rdma" in over and p.rdma_nics):
            return True
    return False
