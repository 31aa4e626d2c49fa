"""Simulated GPU samples for the simulated cluster: each running job drives its GPUs at a steady load of
its own (its share of a GPU x a per-job intensity between 60 and 100 %). Exported by libs/telemetry/gpu.py."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from libs.core.node_health.announcements import InventoryBook
from libs.nodes.nvml import GpuReading
from libs.sim.executor import Run


def intensity(job_id: str) -> float:
    """A simulated job's steady load, the same every sample (0.6 to 1.0)."""
    return 0.6 + 0.4 * hashlib.blake2b(job_id.encode(), digest_size=2).digest()[0] / 255


def simulated_samples(inventory: InventoryBook, runs: Iterable[Run]) -> list[GpuReading]:
    load: dict[tuple[str, int], list[float]] = {}
    for run in runs:
        if run.started_at is None:
            continue
        share = run.gpu_milli / 1000
        for where in run.gpus:
            acc = load.setdefault(where, [0.0, 0.0, 0.0])
            acc[0] += share * intensity(run.job_id)
            acc[1] += run.gpu_memory_mib
            acc[2] += share
    samples = []
    for spec in inventory.nodes.values():
        for gpu in spec.gpus:
            util, mem_mib, share = load.get((spec.name, gpu.index), (0.0, 0.0, 0.0))
            memory = mem_mib / gpu.memory_mib if mem_mib and gpu.memory_mib else share
            samples.append(GpuReading(spec.name, gpu.index, gpu.model, min(1.0, util), min(1.0, memory)))
    return samples
