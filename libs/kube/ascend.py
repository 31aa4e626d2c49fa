"""Ascend NPUs as Kubernetes shows them, by the names of Huawei's Ascend device plugin (pure translation).

- Nodes: whole NPUs are `status.allocatable["huawei.com/Ascend910"]` (also `Ascend310P`, `Ascend310`); the chip
  is the label `node.kubernetes.io/npu.chip.name` ("910B3") where MindCluster sets it, else the server type
  label `accelerator-type` ("module-910b-8" is an Atlas A2 server of 910B, "module" / "card" the Ascend 910),
  else the resource's own name; `gpusched.io/gpu-model` overrides. NPUs are grouped into HCCS rings as a
  server of their model is (libs/core/kernel/accelerators.py).
- Pods: `huawei.com/Ascend910: N` asks N whole NPUs of any 910 generation (the device plugin gives every one of
  them that resource), `huawei.com/Ascend310P: N` of that chip; a static vNPU resource
  `huawei.com/Ascend910-4c` asks one vNPU of that many AI cores (the template `vir04`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contracts import GpuSpec
from libs.core.kernel.accelerators import HUAWEI, NPU, accelerator
from libs.nodes.npu_smi import short_npu_model

RESOURCE_PREFIX = "huawei.com/"
# Whole-NPU resources of the device plugin, and the models each may be given.
NPU_RESOURCES: dict[str, tuple[str, ...]] = {
    "huawei.com/Ascend910": ("Ascend910*",),
    "huawei.com/Ascend310P": ("Ascend310P",),
    "huawei.com/Ascend310": ("Ascend310",),
}
CHIP_LABEL = "node.kubernetes.io/npu.chip.name"
SERVER_TYPE_LABEL = "accelerator-type"
MODEL_LABEL = "gpusched.io/gpu-model"
_VNPU = re.compile(r"huawei\.com/(Ascend910|Ascend310P)-([0-9]+)c")


@dataclass(frozen=True)
class NpuAsk:
    """What a container's resources ask of NPUs."""

    npus: int = 0
    models: tuple[str, ...] = ()
    template: str = ""  # one vNPU of this template ("vir04")


def node_model(labels: dict[str, str], resource: str) -> str:
    """The model of a node's NPUs: the override, the chip label, the server type, else the resource's."""
    if labels.get(MODEL_LABEL):
        return labels[MODEL_LABEL]
    if labels.get(CHIP_LABEL):
        return short_npu_model(labels[CHIP_LABEL])
    server = labels.get(SERVER_TYPE_LABEL, "")
    if "910b" in server.lower():
        return "Ascend910B"
    if "910c" in server.lower() or "a3" in server.lower():
        return "Ascend910C"
    return resource.removeprefix(RESOURCE_PREFIX)


def node_npus(labels: dict[str, str], allocatable: dict[str, float], first_index: int) -> tuple[GpuSpec, ...]:
    """A node's whole NPUs as devices, numbered from `first_index` (after its GPUs)."""
    out: list[GpuSpec] = []
    for resource in NPU_RESOURCES:
        count = int(allocatable.get(resource, 0))
        if count <= 0:
            continue
        model = node_model(labels, resource)
        entry = accelerator(model)
        size = entry.group_size or count
        out += [GpuSpec(index=first_index + len(out) + i, model=model, memory_mib=entry.memory_mib, kind=NPU,
                        vendor=HUAWEI, hccs_group=i // size) for i in range(count)]
    return tuple(out)


def npu_ask(wanted: dict[str, float]) -> NpuAsk:
    """The NPUs one container's requests ask (whole NPUs summed; a vNPU resource as its template)."""
    npus, template = 0, ""
    models: tuple[str, ...] = ()
    for name, value in sorted(wanted.items()):
        if name in NPU_RESOURCES and value > 0:
            npus += int(value)
            models = NPU_RESOURCES[name]
        found = _VNPU.fullmatch(name)
        if found and value > 0:
            template = f"vir{int(found.group(2)):02d}"
            models = NPU_RESOURCES[RESOURCE_PREFIX + found.group(1)]
    return NpuAsk(npus=npus, models=models, template=template)


def chosen_devices(pod_spec: dict[str, object], gpus_before: int, indices: tuple[int, ...]) -> dict[str, str]:
    """The annotation that tells the Ascend device plugin which NPUs the placement chose (as Ascend for Volcano
    writes it: `huawei.com/Ascend910: Ascend910-4,Ascend910-5`), for a pod asking whole NPUs; {} for any other.
    `gpus_before`: the node's devices listed before its NPUs (its GPUs)."""
    containers = pod_spec.get("containers") or []
    for container in containers if isinstance(containers, list) else []:
        resources = container.get("resources", {}) or {}
        wanted = {**(resources.get("limits", {}) or {}), **(resources.get("requests", {}) or {})}
        for name in sorted(wanted):
            if name in NPU_RESOURCES and indices:
                short = name.removeprefix(RESOURCE_PREFIX)
                return {name: ",".join(f"{short}-{i - gpus_before}" for i in indices)}
    return {}
