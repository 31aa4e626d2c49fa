"""Kubernetes Nodes as the platform's inventory (pure translation, no I/O).

- GPUs: `status.allocatable["nvidia.com/gpu"]` whole GPUs of the NVIDIA device plugin; with its MIG "mixed"
  strategy, GPUs in MIG mode leave that count and appear as `nvidia.com/mig-<profile>` resources, so the
  node's GPUs are `nvidia.com/gpu.count` (GPU Feature Discovery) of which the missing ones are in MIG mode.
- Model and memory: GPU Feature Discovery's `nvidia.com/gpu.product` ("NVIDIA-A100-SXM4-80GB" -> "A100") and
  `nvidia.com/gpu.memory` (MiB); `gpusched.io/gpu-model` on the node overrides the model name. SXM products
  are NVLink-connected (one NVLink group per node); others are PCIe only.
- Ascend NPUs: the Ascend device plugin's resources and labels (libs/kube/ascend.py), after the GPUs.
- Topology: rack, block and zone from configurable labels (`TopologyLabels`).
- CPU and memory: from allocatable.
- Health: Ready=False / Unknown (or a deleted Node) is a lost node; `spec.unschedulable` is a cordon.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contracts import GpuSpec, NodeSpec
from libs.kube.ascend import NPU_RESOURCES, node_npus
from libs.kube.client import Obj

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
MODEL_LABEL = "gpusched.io/gpu-model"
_VENDOR_PREFIXES = ("NVIDIA-", "Tesla-", "NVIDIA ", "Tesla ")


@dataclass(frozen=True)
class TopologyLabels:
    """Which node labels name a node's rack, block and zone (the platform's topology domains)."""

    rack: str = "topology.gpusched.io/rack"
    block: str = "topology.gpusched.io/block"
    zone: str = "topology.kubernetes.io/zone"

    @classmethod
    def parse(cls, text: str) -> TopologyLabels:
        """`rack=LABEL,block=LABEL,zone=LABEL` (any subset)."""
        fields: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            domain, _, label = part.partition("=")
            if domain not in ("rack", "block", "zone") or not label:
                raise ValueError(f"topology label {part!r}: expected rack=LABEL, block=LABEL or zone=LABEL")
            fields[domain] = label
        return cls(**fields)


def quantity_milli(text: str) -> int:
    """A Kubernetes quantity in thousandths ("500m" -> 500, "2" -> 2000)."""
    return round(parse_quantity(text) * 1000)


def quantity_mib(text: str) -> int:
    return int(parse_quantity(text) // (1 << 20))


_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
             "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(text: str | int | float) -> float:
    match = _QUANTITY.match(str(text).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def model_of(labels: dict[str, str]) -> str:
    """The platform's model name: the override label, else the product's first word after the vendor."""
    if labels.get(MODEL_LABEL):
        return labels[MODEL_LABEL]
    product = labels.get(PRODUCT_LABEL, "")
    for prefix in _VENDOR_PREFIXES:
        product = product.removeprefix(prefix)
    return re.split(r"[-_ ]", product, maxsplit=1)[0] if product else "GPU"


def is_ready(node: Obj) -> bool:
    for condition in node.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def is_unschedulable(node: Obj) -> bool:
    return bool(node.get("spec", {}).get("unschedulable", False))


def node_spec(node: Obj, topology: TopologyLabels = TopologyLabels()) -> NodeSpec:
    """The node as the platform's inventory sees it (a node without GPUs has none: it still registers, so that
    a job that needs no GPU has somewhere to go)."""
    meta, status = node.get("metadata", {}), node.get("status", {})
    labels: dict[str, str] = meta.get("labels", {}) or {}
    allocatable: dict[str, str] = status.get("allocatable", {}) or {}
    whole = int(parse_quantity(allocatable.get(GPU_RESOURCE, "0")))
    has_mig = any(k.startswith(MIG_RESOURCE_PREFIX) and parse_quantity(v) > 0 for k, v in allocatable.items())
    total = int(labels.get(COUNT_LABEL, whole)) if has_mig else whole
    total = max(total, whole)
    model = model_of(labels)
    memory = int(labels.get(MEMORY_LABEL, "0") or 0)
    product = labels.get(PRODUCT_LABEL, "")
    nvlink = 0 if "SXM" in product.upper() else -1
    gpus = tuple(GpuSpec(index=i, model=model, memory_mib=memory, nvlink_group=nvlink, mig_enabled=i >= whole)
                 for i in range(total))
    npus = {k: parse_quantity(v) for k, v in allocatable.items() if k in NPU_RESOURCES}
    gpus += node_npus(labels, npus, len(gpus))
    ours: dict[str, str] = {}
    for domain in ("rack", "block", "zone"):
        value = labels.get(getattr(topology, domain), "")
        if value:
            ours[domain] = value
    return NodeSpec(name=str(meta.get("name", "")), gpus=gpus,
                    cpu_milli=quantity_milli(allocatable.get("cpu", "0")),
                    memory_mib=quantity_mib(allocatable.get("memory", "0")), labels=ours)
