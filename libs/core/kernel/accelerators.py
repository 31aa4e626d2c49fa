"""What the platform knows of each accelerator model, whatever its vendor: the one table every part asks.

An accelerator is a device of a node that jobs take whole or in parts: an NVIDIA GPU or a Huawei Ascend NPU.
Quotas, flavors, fair share, budgets and accounting work per model name and need nothing of this table; what
differs between vendors is how multi-device jobs may be laid out on one server (the interconnect), and how one
device may be split (MIG profiles and vNPU templates: libs/core/kernel/mig_profiles.py). Each model's layout is
data here, read by one rule per kind of topology:

- NVLink (NVIDIA): GPUs of one NVLink domain talk faster; placement prefers one domain, but any set works.
- HCCS ring (Ascend 910): the 8 NPUs of a server sit in two rings of 4 that cannot talk to each other, so a
  job of up to 4 NPUs must stay inside one ring and a job of 8 takes the whole server; 1, 2, 4 or 8 per server
  (Atlas training servers, as the Ascend for Volcano plugin enforces).
- HCCS mesh (Ascend 910B, Atlas A2 servers; 910C, Atlas A3 servers): every NPU of the server talks to every
  other, so any count up to the server's NPUs fits; a job over several servers takes the same count on each.

Model names are what node backends report: the NVIDIA driver's name shortened ("A100", libs/nodes/nvml.py)
and "Ascend" plus the chip family for NPUs ("Ascend910", "Ascend910B", from npu-smi, libs/nodes/npu_smi.py).
A model this table does not list is an Ascend NPU when its name says so ("Ascend310P") and an NVIDIA GPU
otherwise, with no layout rule: that is what every node reported before NPUs were known, so older logs mean
the same.

A job names the models it may run on (`JobSpec.gpu_models`): model names, "gpu:*" / "npu:*" for any model of a
kind, or a family ("Ascend910*": every model whose name starts so). Naming none means any GPU: code written for
CUDA does not run on an NPU.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cache

NVIDIA = "nvidia"
HUAWEI = "huawei"
GPU = "gpu"
NPU = "npu"
KINDS = (GPU, NPU)
# Topology rules, one per interconnect: see the module doc.
NVLINK = "nvlink"
HCCS_RING = "hccs_ring"
HCCS_MESH = "hccs_mesh"


@dataclass(frozen=True, slots=True)
class AcceleratorModel:
    name: str
    vendor: str
    kind: str
    topology: str
    # Devices of one interconnect group (an HCCS ring, a server's mesh); 0 when groups only prefer.
    group_size: int = 0
    # Device counts one server may give one replica; () for any count.
    counts_per_server: tuple[int, ...] = ()
    memory_mib: int = 0


MODELS: dict[str, AcceleratorModel] = {m.name: m for m in (
    AcceleratorModel(name="Ascend910", vendor=HUAWEI, kind=NPU, topology=HCCS_RING, group_size=4,
                     counts_per_server=(1, 2, 4, 8), memory_mib=32 * 1024),
    AcceleratorModel(name="Ascend910B", vendor=HUAWEI, kind=NPU, topology=HCCS_MESH, group_size=8,
                     memory_mib=64 * 1024),
    AcceleratorModel(name="Ascend910C", vendor=HUAWEI, kind=NPU, topology=HCCS_MESH, group_size=16,
                     memory_mib=64 * 1024),
)}


NO_TOPOLOGY = "none"
ASCEND_PREFIX = "Ascend"
WILDCARD = ":*"  # "npu:*": any model of that kind


def accelerator(model: str) -> AcceleratorModel:
    """The model's entry; an unknown model is an NPU without a layout rule when its name is Ascend's, else an
    NVIDIA GPU whose NVLink domains only prefer."""
    known = MODELS.get(model)
    if known is not None:
        return known
    if model.startswith(ASCEND_PREFIX):
        return AcceleratorModel(name=model, vendor=HUAWEI, kind=NPU, topology=NO_TOPOLOGY)
    return AcceleratorModel(name=model, vendor=NVIDIA, kind=GPU, topology=NVLINK)


@cache
def kind_of(model: str) -> str:
    return accelerator(model).kind


def any_of(kind: str) -> str:
    """The entry of a job's models that allows any model of `kind`: "npu:*"."""
    return kind + WILDCARD


def wildcard_kind(entry: str) -> str | None:
    """The kind a job's models entry allows all of ("npu:*" -> "npu"), None for anything else."""
    return entry[: -len(WILDCARD)] if entry.endswith(WILDCARD) else None


def is_pattern(entry: str) -> bool:
    """Does a job's models entry stand for several models: a kind ("npu:*") or a family ("Ascend910*": the 910,
    910B and 910C, as the Ascend device plugin's `huawei.com/Ascend910` resource gives any of them)?"""
    return entry.endswith("*")


def model_matches(models: Collection[str], model: str) -> bool:
    """May a job naming `models` run on a device of `model`? Naming none allows every GPU and no NPU."""
    if not models:
        return kind_of(model) == GPU
    if model in models:
        return True
    return any(is_pattern(m) and (m == any_of(kind_of(model)) or (wildcard_kind(m) is None
                                                                   and model.startswith(m[:-1])))
               for m in models)


def one_model(models: Collection[str]) -> str:
    """The one model a job naming `models` may run on; "" when it may run on several (or on any of a kind)."""
    if len(models) != 1:
        return ""
    (only,) = models
    return "" if is_pattern(only) else only


def kinds_named(models: Collection[str]) -> frozenset[str]:
    """The kinds of device a job naming `models` may run on."""
    if not models:
        return frozenset({GPU})
    return frozenset(wildcard_kind(m) or kind_of(m.rstrip("*")) for m in models)


def vendors_named(models: Collection[str]) -> frozenset[str]:
    """The vendors a job naming `models` may run on (a kind's wildcard: that kind's vendor)."""
    return frozenset(NVIDIA if kind == GPU else HUAWEI for kind in kinds_named(models))


def vendor_of(model: str) -> str:
    return accelerator(model).vendor


def device_word(model: str, count: int = 1) -> str:
    """How people call `count` devices of the model: "GPU(s)" or "NPU(s)"."""
    word = kind_of(model).upper()
    return word if count == 1 else f"{word}s"


def count_fits_server(model: str, count: int) -> bool:
    """May one server give one replica `count` devices of the model? (1, 2, 4 or 8 for an Ascend 910.)"""
    allowed = accelerator(model).counts_per_server
    return not allowed or count in allowed


def groups_needed(model: str, count: int) -> int:
    """How many whole interconnect groups a replica of `count` devices spans: 1 when it fits inside one group
    (it must, under a strict topology), else the groups it fills. 0 when the model's groups only prefer."""
    entry = accelerator(model)
    if entry.topology == NVLINK or entry.group_size <= 0:
        return 0
    return max(1, -(-count // entry.group_size))


def group_preference(free_in_group: int, count: int) -> tuple[int, int, int]:
    """How good a group with `free_in_group` free devices is for `count` of them (smaller is better), the rule
    Ascend for Volcano documents for HCCS rings: the group this job fills exactly, then one it leaves an even
    number free in (pairs stay whole for 2-device jobs), then the one it leaves least free in. For one NPU:
    a ring with 1 free, then 3, then 2, then 4; for two: 2, then 4, then 3."""
    left = free_in_group - count
    return (left != 0, left % 2, left)
