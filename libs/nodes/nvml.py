"""The real backend: this machine's GPUs read through NVML (`nvidia-ml-py`, imported as pynvml)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from contracts import GpuSpec, NodeSpec


class NvmlUnavailable(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's load at one moment: telemetry for Prometheus, not an event of the log."""

    node: str
    index: int
    model: str
    utilization: float
    memory_used: float


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    name = "nvml"

    def __init__(self, node_name: str | None = None) -> None:
        self.node_name = node_name or socket.gethostname()

    def discover(self) -> list[NodeSpec]:
        try:
            import pynvml
        except ImportError as err:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from err
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML could not start (no NVIDIA driver?): {err}") from err
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                gpus.append(GpuSpec(index=i, model=_text(pynvml.nvmlDeviceGetName(h)),
                                    memory_mib=int(mem.total) // (1 << 20),
                                    uuid=_text(pynvml.nvmlDeviceGetUUID(h))))
        finally:
            pynvml.nvmlShutdown()
        cpus = os.cpu_count() or 1
        mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        return [NodeSpec(name=self.node_name, gpus=tuple(gpus), cpu_milli=cpus * 1000, memory_mib=mem_mib)]

    def sample(self) -> list[GpuReading]:
        """Utilisation (busy share of the last sample period) and memory in use of every GPU, from the driver."""
        try:
            import pynvml
        except ImportError as err:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from err
        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                util = pynvml.nvmlDeviceGetUtilizationRates(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                out.append(GpuReading(self.node_name, i, _text(pynvml.nvmlDeviceGetName(h)), util.gpu / 100.0,
                                      int(mem.used) / int(mem.total) if int(mem.total) else 0.0))
            return out
        finally:
            pynvml.nvmlShutdown()
