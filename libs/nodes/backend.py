"""Where node inventories come from: the real NVML backend or a simulated cluster from a CSV."""

from __future__ import annotations

from typing import Protocol

from contracts import NodeSpec


class NodeBackend(Protocol):
    name: str

    def discover(self) -> list[NodeSpec]:
        """Every node this backend can see, with its GPUs."""
        ...


def make_backend(kind: str, cluster_csv: str) -> NodeBackend:
    if kind == "nvml":
        from libs.nodes.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "sim":
        from libs.nodes.sim import CsvClusterBackend

        return CsvClusterBackend(cluster_csv)
    raise ValueError(f"unknown node backend {kind!r} (sim or nvml)")
