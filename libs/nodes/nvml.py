"""The real backend: this machine's GPUs read through NVML (`nvidia-ml-py`, imported as pynvml)."""

from __future__ import annotations

import os
import socket

from contracts import GpuSpec, NodeSpec


class NvmlUnavailable(RuntimeError):
    pass


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
