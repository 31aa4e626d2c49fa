"""One replica's request, and where it could go at all: the rows (nodes) and GPUs with room enough for it, by
share, GPU memory, CPU, memory, RDMA NICs and GPU model. Scoring (libs/core/cluster/scoring.py) ranks only these."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contracts import JobSpec
from libs.core.cluster.arrays import FEW_NODES, I64, ClusterArrays
from libs.core.cluster.nodes import FULL, Node
from libs.core.kernel.accelerators import model_matches
from libs.core.kernel.policy import takes_devices

Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Request:
    """One replica's request."""

    milli: int  # share of each GPU: 1000 for whole GPUs, 0 for none
    gpus: int
    cpu: int
    mem: int
    gpu_mem: int
    rdma: int
    models: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < FULL

    @classmethod
    def of(cls, spec: JobSpec) -> Request:
        if spec.gpu_milli > 0:
            milli, gpus = spec.gpu_milli, 1
        else:
            milli, gpus = (FULL, spec.gpus) if spec.gpus > 0 else (0, 0)
        return cls(milli=milli, gpus=gpus, cpu=spec.cpu_milli, mem=spec.memory_mib, gpu_mem=spec.gpu_memory_mib,
                   rdma=spec.rdma_nics, models=tuple(spec.gpu_models))


def memory_need(arrays: ClusterArrays, req: Request) -> I64 | int:
    """The GPU memory a GPU must have free for one of the request's GPUs: what the request declares; for a
    fraction declaring none, its share of that GPU's memory (what the Cluster charges it), GPU by GPU."""
    if req.gpu_mem or not req.shared:
        return req.gpu_mem
    return arrays.share_memory(req.milli)


def memory_need_row(arrays: ClusterArrays, req: Request, row: int) -> list[int]:
    """memory_need for the GPUs of one row, as a list (read only: shared)."""
    if req.gpu_mem or not req.shared:
        return arrays.same_row(req.gpu_mem)
    return arrays.share_memory_rows(req.milli)[row]


def gpu_fits(arrays: ClusterArrays, req: Request) -> Mask:
    """Per GPU: is its share and memory free enough for one of the request's GPUs?"""
    return (arrays.free >= req.milli) & (arrays.free_mem >= memory_need(arrays, req))


def feasible_rows(arrays: ClusterArrays, req: Request, allowed: Mask | None) -> Mask:
    if not arrays.mixed and len(arrays.nodes) <= FEW_NODES:
        return _feasible_few(arrays, req, allowed)
    ok = (arrays.online & arrays.model_mask(req.models) & (arrays.cpu >= req.cpu) & (arrays.mem >= req.mem)
          & (arrays.rdma >= req.rdma))
    if allowed is not None:
        ok &= allowed
    if req.gpus == 0:
        return ok & (arrays.model >= 0)
    fits_gpu = gpu_fits(arrays, req)
    if not arrays.mixed:
        return ok & (fits_gpu.sum(axis=1) >= req.gpus)
    # A replica's GPUs are of one model: enough of SOME allowed model on the node.
    enough = np.zeros(len(ok), dtype=bool)
    for model in arrays.model_ids(req.models):
        enough |= (fits_gpu & (arrays.gpu_model == model)).sum(axis=1) >= req.gpus
    return ok & enough


def _feasible_few(arrays: ClusterArrays, req: Request, allowed: Mask | None) -> Mask:
    """feasible_rows for a small cluster of one model per node, row by row."""
    models = arrays.model_mask_rows(req.models)
    rows = allowed.tolist() if allowed is not None else None
    out = []
    for i, (online, (cpu, mem, rdma)) in enumerate(zip(arrays.online_rows, arrays.host_rows, strict=True)):
        ok = (online and models[i] and cpu >= req.cpu and mem >= req.mem and rdma >= req.rdma
              and (rows is None or rows[i]))
        if ok:
            ok = arrays.model_rows[i] >= 0 if req.gpus == 0 else row_has_gpus(arrays, req, i)
        out.append(ok)
    return np.array(out, dtype=bool)


def row_has_gpus(arrays: ClusterArrays, req: Request, row: int) -> bool:
    """Does the row have GPUs enough free for one replica of a request of GPUs (a cluster of one model per
    node, or a row of one model)? From the row's summaries where they answer it."""
    milli, gpu_mem, gpus = req.milli, req.gpu_mem, req.gpus
    if gpu_mem == 0 and req.shared:  # a GPU with the share and its share of memory free
        return arrays.fraction_room[row] >= milli
    if gpu_mem == 0:  # whole GPUs with share enough (and memory not overdrawn), from the sorted shares
        shares = arrays.share_rows[row]
        return len(shares) - bisect.bisect_left(shares, milli) >= gpus
    count = 0
    for free, free_mem in zip(arrays.free_rows[row], arrays.free_mem_rows[row], strict=True):
        if free >= milli and free_mem >= gpu_mem:
            count += 1
    return count >= gpus


def node_hosts(node: Node, spec: JobSpec) -> bool:
    """Could the node take one replica's CPU, memory and RDMA NICs, and has it a GPU model the job may use?"""
    return (node.online and node.free_cpu_milli >= spec.cpu_milli and node.free_memory_mib >= spec.memory_mib
            and node.free_rdma_nics >= spec.rdma_nics
            and (not takes_devices(spec) or any(model_matches(spec.gpu_models, m) for m in node.models)
                 or (not spec.gpu_models and not node.models)))
