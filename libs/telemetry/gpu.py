"""GPU utilisation and memory gauges: telemetry for Prometheus, never part of the decision log. Node
agents export what NVML (or the simulated backend) reads; node-telemetry exports the simulated cluster's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from prometheus_client import Gauge

from libs.nodes.nvml import GpuReading

log = logging.getLogger(__name__)

UTILIZATION = Gauge("gpusched_gpu_utilization_ratio", "GPU busy share over the last sample period",
                    ["node", "gpu", "model"])
MEMORY_USED = Gauge("gpusched_gpu_memory_used_ratio", "Share of the GPU's memory in use", ["node", "gpu", "model"])


def export(samples: Iterable[GpuReading]) -> None:
    for s in samples:
        labels = (s.node, str(s.index), s.model)
        UTILIZATION.labels(*labels).set(round(s.utilization, 4))
        MEMORY_USED.labels(*labels).set(round(s.memory_used, 4))


async def sample_forever(source: Callable[[], list[GpuReading]], period_s: float, in_thread: bool = False) -> None:
    """Export `source()` every `period_s`; a blocking reader (NVML) runs `in_thread`."""
    while True:
        try:
            export(await asyncio.to_thread(source) if in_thread else source())
        except Exception:  # a failed reading must not stop the node's telemetry
            log.exception("GPU sampling failed")
        await asyncio.sleep(period_s)
