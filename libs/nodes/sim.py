"""A simulated cluster read from a CSV in the openb node-list format: sn,cpu_milli,memory_mib,gpu,model.

`CsvClusterBackend` announces the whole cluster (node-telemetry); `SimNodeBackend` is what a node agent runs
on without GPUs: one node (or all) of that CSV, or a synthesised node, with load and faults set by hand.

Optional columns: `gpu_memory_mib` (overrides the per-model memory table), `nvlink` (size of each NVLink
domain: 8 puts all eight GPUs of a node in one, 4 makes two groups of four; empty or 0: PCIe only),
`mig` (1: every GPU MIG-enabled), `rdma` (RDMA NICs), and `rack`, `block`, `zone`, `pool` (node labels).
A row of an Ascend model ("Ascend910", "Ascend910B": libs/core/kernel/accelerators.py) is a server of NPUs in
its model's HCCS groups; `gpu` counts its NPUs.
"""

from __future__ import annotations

import csv
import threading
from pathlib import Path

from msgspec.structs import replace

from contracts import GpuSpec, NodeSpec
from libs.core.kernel.accelerators import NPU, kind_of
from libs.nodes.ascend_sim import npu_specs
from libs.nodes.health import HealthObservation, is_fatal
from libs.nodes.nvml import GpuReading

# Memory of the models in the openb trace and common ones; unknown models get DEFAULT_GPU_MEMORY_MIB.
GPU_MEMORY_MIB = {
    "P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576,
    "A100": 81920, "H100": 81920, "H200": 143360, "G1": 32768, "G2": 32768, "G3": 32768,
}
DEFAULT_GPU_MEMORY_MIB = 32768
LABEL_COLUMNS = ("rack", "block", "zone", "pool")
# A synthesised node's host resources per GPU (a typical 8-GPU server: 128 cores, 1 TiB).
SYNTH_CPU_MILLI_PER_GPU = 16_000
SYNTH_MEMORY_MIB_PER_GPU = 128 * 1024
THROTTLE_KINDS = ("thermal", "power")


class ClusterCsvError(ValueError):
    pass


def load_cluster_csv(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise ClusterCsvError(f"cluster file {path} not found") from err
    return parse_cluster_csv(text, str(path))


def parse_cluster_csv(text: str, origin: str = "cluster") -> list[NodeSpec]:
    """The nodes of a cluster CSV's text; `origin` names it in errors."""
    path = origin
    nodes: list[NodeSpec] = []
    for line_no, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            count = int(row["gpu"])
            model = row["model"].strip()
            gpus = _devices(row, model, count)
            labels = {k: row[k] for k in LABEL_COLUMNS if row.get(k)}
            nodes.append(NodeSpec(name=row["sn"], gpus=gpus, cpu_milli=int(row["cpu_milli"]),
                                  memory_mib=int(row["memory_mib"]), labels=labels,
                                  rdma_nics=int(row.get("rdma") or 0)))
        except (KeyError, ValueError, TypeError) as err:
            raise ClusterCsvError(f"{path}:{line_no}: bad node row {row!r}: {err}") from err
    return nodes


def _devices(row: dict[str, str], model: str, count: int) -> tuple[GpuSpec, ...]:
    return device_specs(row["sn"], model, count, int(row.get("gpu_memory_mib") or 0), int(row.get("nvlink") or 0),
                        (row.get("mig") or "").strip().lower() in ("1", "true", "yes"))


def device_specs(node: str, model: str, count: int, memory_mib: int = 0, nvlink: int = 0,
                 split: bool = False) -> tuple[GpuSpec, ...]:
    """`count` accelerators of `model` as a simulated node reports them: NPUs laid out as a server of their
    model (HCCS groups), GPUs in NVLink domains of `nvlink` (0: PCIe only); `split`: MIG-enabled GPUs or NPUs
    split into vNPUs; `memory_mib` 0: the model's usual memory."""
    if kind_of(model) == NPU:
        return tuple(replace(d, mig_enabled=split) if split else d for d in npu_specs(node, model, count, memory_mib))
    memory = memory_mib or GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
    return tuple(GpuSpec(index=i, model=model, memory_mib=memory, uuid=f"SIM-{node}-{i}",
                         nvlink_group=i // nvlink if nvlink > 0 else -1, mig_enabled=split) for i in range(count))


class CsvClusterBackend:
    name = "sim"

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def discover(self) -> list[NodeSpec]:
        return [n for n in load_cluster_csv(self.path) if n.gpus]


def synthetic_node(name: str, gpus: int, model: str = "A100", nvlink: int = 8) -> NodeSpec:
    """One node of `gpus` GPUs of `model`, NVLink-connected in domains of `nvlink` GPUs (0: PCIe only)."""
    if gpus < 0:
        raise ValueError(f"a node cannot have {gpus} GPUs")
    specs = device_specs(name, model, gpus, nvlink=nvlink)
    return NodeSpec(name=name, gpus=specs, cpu_milli=gpus * SYNTH_CPU_MILLI_PER_GPU,
                    memory_mib=gpus * SYNTH_MEMORY_MIB_PER_GPU)


def _sim_nodes(csv_path: str | Path | None, node_name: str | None, gpus: int | None, model: str,
               nvlink: int) -> list[NodeSpec]:
    if gpus is not None:
        return [synthetic_node(node_name or "sim-node", gpus, model, nvlink)]
    if csv_path is None:
        raise ValueError("a simulated node needs a cluster CSV or a GPU count")
    nodes = load_cluster_csv(csv_path)
    if node_name is None:
        return [n for n in nodes if n.gpus]
    chosen = [n for n in nodes if n.name == node_name]
    if not chosen:
        raise ClusterCsvError(f"{csv_path}: no node named {node_name!r}")
    return chosen


class SimNodeBackend:
    """The node backend of an agent without GPUs, with the same calls as NvmlBackend.

    From `csv_path`, one node (`node_name`) or every node with GPUs; with `gpus`, a synthesised node of that
    many GPUs of `model` instead (the CSV is then not read). Readings are zero until `set_load`; faults come
    from `inject_xid`, `inject_ecc` and `set_throttle`, which other threads may call while `poll_health` waits.
    With several nodes, the fault and load methods need `node`.
    """

    name = "sim"

    def __init__(self, csv_path: str | Path | None = None, node_name: str | None = None, gpus: int | None = None,
                 model: str = "A100", *, nvlink: int = 8) -> None:
        self._nodes = {n.name: n for n in _sim_nodes(csv_path, node_name, gpus, model, nvlink)}
        self._changed = threading.Condition()
        self._pending: list[HealthObservation] = []
        self._ecc: dict[tuple[str, int], int] = {}
        self._throttled: dict[tuple[str, int], set[str]] = {}
        self._failed: dict[tuple[str, int], str] = {}
        self._load: dict[tuple[str, int], tuple[float, float]] = {}

    def discover(self) -> list[NodeSpec]:
        """The nodes, with GPUs a fatal fault hit reported unhealthy."""
        with self._changed:
            return [self._with_health(node) for node in self._nodes.values()]

    def _with_health(self, node: NodeSpec) -> NodeSpec:
        gpus = tuple(replace(g, healthy=False) if (node.name, g.index) in self._failed else g for g in node.gpus)
        return replace(node, gpus=gpus)

    def sample(self) -> list[GpuReading]:
        with self._changed:
            return [GpuReading(node.name, g.index, g.model, *self._load.get((node.name, g.index), (0.0, 0.0)))
                    for node in self._nodes.values() for g in node.gpus]

    def set_load(self, index: int, utilization: float, memory_used: float, node: str | None = None) -> None:
        """What sample() reports for the GPU from now on (shares, 0.0 to 1.0)."""
        key = self._gpu(index, node)
        with self._changed:
            self._load[key] = (utilization, memory_used)

    def poll_health(self, timeout_ms: int = 1000) -> list[HealthObservation]:
        """Faults injected since the last poll (waiting up to timeout_ms for one), then every throttle in force.
        Like NvmlBackend: XID and ECC observations are reported once, throttling at every poll while it lasts."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self._pending), timeout=max(timeout_ms, 0) / 1000)
            out, self._pending = self._pending, []
            for (node, index), kinds in sorted(self._throttled.items()):
                out += [HealthObservation(node, index, kind, 1, f"{kind} throttling (simulated)")
                        for kind in THROTTLE_KINDS if kind in kinds]
            return out

    def inject_xid(self, index: int, code: int, node: str | None = None) -> None:
        name, index = self._gpu(index, node)
        self._report(HealthObservation(name, index, "xid", code, f"XID {code} (injected)"))

    def inject_ecc(self, index: int, count: int = 1, node: str | None = None) -> None:
        """`count` new uncorrectable ECC errors: the next poll reports the GPU's new total."""
        if count <= 0:
            raise ValueError(f"inject at least one ECC error, not {count}")
        key = self._gpu(index, node)
        with self._changed:
            last = self._ecc.get(key, 0)
            self._ecc[key] = last + count
        detail = f"uncorrectable volatile ECC errors {last} -> {last + count} (injected)"
        self._report(HealthObservation(key[0], key[1], "ecc", last + count, detail))

    def inject_npu_health(self, index: int, level: int, node: str | None = None) -> None:
        """An NPU's health got worse: level 1 warning, 2 alarm, 3 critical (from 2 on it is out of service)."""
        if level not in (1, 2, 3):
            raise ValueError(f"an NPU's worse health is level 1, 2 or 3, not {level}")
        name, index = self._gpu(index, node)
        self._report(HealthObservation(name, index, "npu", level, f"NPU health level {level} (injected)"))

    def set_throttle(self, index: int, kind: str, active: bool = True, node: str | None = None) -> None:
        """Start (or, with active=False, stop) "thermal" or "power" throttling of the GPU."""
        if kind not in THROTTLE_KINDS:
            raise ValueError(f"throttle kind must be one of {THROTTLE_KINDS}, not {kind!r}")
        key = self._gpu(index, node)
        with self._changed:
            kinds = self._throttled.setdefault(key, set())
            if active:
                kinds.add(kind)
            else:
                kinds.discard(kind)
            if not kinds:
                del self._throttled[key]

    def repair(self, index: int, node: str | None = None) -> None:
        """A reset GPU: healthy again, not throttled, its volatile ECC count back to zero."""
        key = self._gpu(index, node)
        with self._changed:
            self._failed.pop(key, None)
            self._throttled.pop(key, None)
            self._ecc.pop(key, None)

    def close(self) -> None:
        """Nothing to free; here so that agents treat both backends alike."""

    def _report(self, obs: HealthObservation) -> None:
        with self._changed:
            if is_fatal(obs):
                self._failed.setdefault((obs.node, obs.index), obs.detail)
            self._pending.append(obs)
            self._changed.notify_all()

    def _gpu(self, index: int, node: str | None) -> tuple[str, int]:
        if node is None:
            if len(self._nodes) != 1:
                raise ValueError(f"this backend simulates {len(self._nodes)} nodes: name the node")
            node = next(iter(self._nodes))
        spec = self._nodes.get(node)
        if spec is None:
            raise KeyError(f"no simulated node {node!r}")
        if not any(g.index == index for g in spec.gpus):
            raise KeyError(f"node {node} has no GPU {index}")
        return node, index
