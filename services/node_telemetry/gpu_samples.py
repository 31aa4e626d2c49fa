"""GPU utilisation and memory samples: telemetry for Prometheus, never part of the decision log.

The NVML backend reads them from the driver; with the simulated cluster, each running job drives its GPUs
at a steady load of its own (a job's share of a GPU x a per-job intensity between 60 and 100 %)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable

from prometheus_client import Gauge

from libs.core.inventory import InventoryBook
from libs.nodes.nvml import GpuReading
from libs.sim.executor import Run

log = logging.getLogger(__name__)

UTILIZATION = Gauge("gpusched_gpu_utilization_ratio", "GPU busy share over the last sample period",
                    ["node", "gpu", "model"])
MEMORY_USED = Gauge("gpusched_gpu_memory_used_ratio", "Share of the GPU's memory in use", ["node", "gpu", "model"])


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


def export(samples: Iterable[GpuReading]) -> None:
    for s in samples:
        labels = (s.node, str(s.index), s.model)
        UTILIZATION.labels(*labels).set(round(s.utilization, 4))
        MEMORY_USED.labels(*labels).set(round(s.memory_used, 4))


async def sample_forever(source: Callable[[], list[GpuReading]], period_s: float) -> None:
    while True:
        try:
            export(source())
        except Exception:  # a failed reading must not stop the node's telemetry
            log.exception("GPU sampling failed")
        await asyncio.sleep(period_s)
