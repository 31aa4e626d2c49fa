"""A simulated cluster read from a CSV in the openb node-list format: sn,cpu_milli,memory_mib,gpu,model.

Optional columns: `gpu_memory_mib` (overrides the per-model memory table), `nvlink` (size of each NVLink
domain: 8 puts all eight GPUs of a node in one, 4 makes two groups of four; empty or 0: PCIe only),
`mig` (1: every GPU MIG-enabled), `rdma` (RDMA NICs), and `rack`, `block`, `zone`, `pool` (node labels).
"""

from __future__ import annotations

import csv
from pathlib import Path

from contracts import GpuSpec, NodeSpec

# Memory of the models in the openb trace and common ones; unknown models get DEFAULT_GPU_MEMORY_MIB.
GPU_MEMORY_MIB = {
    "P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576,
    "A100": 81920, "H100": 81920, "H200": 143360, "G1": 32768, "G2": 32768, "G3": 32768,
}
DEFAULT_GPU_MEMORY_MIB = 32768
LABEL_COLUMNS = ("rack", "block", "zone", "pool")


class ClusterCsvError(ValueError):
    pass


def load_cluster_csv(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise ClusterCsvError(f"cluster file {path} not found") from err
    nodes: list[NodeSpec] = []
    for line_no, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        try:
            count = int(row["gpu"])
            model = row["model"].strip()
            memory = int(row.get("gpu_memory_mib") or GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB))
            nvlink = int(row.get("nvlink") or 0)
            mig = (row.get("mig") or "").strip().lower() in ("1", "true", "yes")
            gpus = tuple(GpuSpec(index=i, model=model, memory_mib=memory, uuid=f"SIM-{row['sn']}-{i}",
                                 nvlink_group=i // nvlink if nvlink > 0 else -1, mig_enabled=mig)
                         for i in range(count))
            labels = {k: row[k] for k in LABEL_COLUMNS if row.get(k)}
            nodes.append(NodeSpec(name=row["sn"], gpus=gpus, cpu_milli=int(row["cpu_milli"]),
                                  memory_mib=int(row["memory_mib"]), labels=labels,
                                  rdma_nics=int(row.get("rdma") or 0)))
        except (KeyError, ValueError, TypeError) as err:
            raise ClusterCsvError(f"{path}:{line_no}: bad node row {row!r}: {err}") from err
    return nodes


class CsvClusterBackend:
    name = "sim"

    def __init__(self, path: str | Path) -> None:
        self.path = path

    def discover(self) -> list[NodeSpec]:
        return [n for n in load_cluster_csv(self.path) if n.gpus]
