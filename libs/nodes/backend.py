"""Where node inventories come from: the real NVML (NVIDIA GPUs) or npu-smi (Ascend NPUs) backend, or a
simulated cluster from a CSV.

`NodeBackend` is what node-telemetry needs (the inventory of every node it announces); `AgentBackend` is
what an agent on one node needs besides: GPU load, health observations, and releasing the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from contracts import NodeSpec

if TYPE_CHECKING:
    from libs.nodes.health import HealthObservation
    from libs.nodes.nvml import GpuReading


class NodeBackend(Protocol):
    name: str

    def discover(self) -> list[NodeSpec]:
        """Every node this backend can see, with its GPUs."""
        ...


class AgentBackend(NodeBackend, Protocol):
    def sample(self) -> list[GpuReading]:
        """Utilisation and memory in use of every GPU, now."""
        ...

    def poll_health(self, timeout_ms: int = 1000) -> list[HealthObservation]:
        """What went wrong since the last poll, waiting up to timeout_ms for it (blocking: call it from a
        thread in an asyncio agent). `libs.nodes.health.is_fatal` says which observations take a GPU out."""
        ...

    def close(self) -> None:
        """Release the driver (NVML's event set and session)."""
        ...


def make_backend(kind: str, cluster_csv: str) -> NodeBackend:
    if kind == "nvml":
        from libs.nodes.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "ascend":
        from libs.nodes.ascend import AscendBackend

        return AscendBackend()
    if kind == "sim":
        from libs.nodes.sim import CsvClusterBackend

        return CsvClusterBackend(cluster_csv)
    raise ValueError(f"unknown node backend {kind!r} (sim, nvml or ascend)")


def make_agent_backend(kind: str, cluster_csv: str | Path | None = None, node_name: str | None = None,
                       gpus: int | None = None, *, labels: dict[str, str] | None = None) -> AgentBackend:
    """The backend of a node agent: "nvml" reads this machine's NVIDIA GPUs, "ascend" its Ascend NPUs (node_name
    defaults to the host name; the CSV and gpus are ignored); "sim" simulates node_name of the CSV, every node
    of it, or with gpus a synthesised node of that many GPUs (see SimNodeBackend). `labels` are the real
    node's; a simulated node takes its labels from the CSV."""
    if kind == "nvml":
        from libs.nodes.nvml import NvmlBackend

        return NvmlBackend(node_name, labels=labels)
    if kind == "ascend":
        from libs.nodes.ascend import AscendBackend

        return AscendBackend(node_name, labels=labels)
    if kind == "sim":
        from libs.nodes.sim import SimNodeBackend

        return SimNodeBackend(cluster_csv or None, node_name, gpus)
    raise ValueError(f"unknown node backend {kind!r} (sim, nvml or ascend)")
