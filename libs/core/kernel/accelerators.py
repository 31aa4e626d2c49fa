"""What the platform knows of each accelerator model, whatever its vendor: the one table every part asks.

An accelerator is a device of a node that jobs take whole or in parts: an NVIDIA GPU or a Huawei Ascend NPU.
Quotas, flavors, fair share, budgets and accounting work per model name and need nothing of this table; what
differs between vendors is how multi-device jobs may be laid out on one server (the interconnect) and how one
device may be shared (MIG profiles, virtual NPU templates). Each model's layout is data here, read by one
rule per kind of topology:

- NVLink (NVIDIA): GPUs of one NVLink domain talk faster; placement prefers one domain, but any set works.
- HCCS ring (Ascend 910): the 8 NPUs of a server sit in two rings of 4 that cannot talk to each other, so a
  job of up to 4 NPUs must stay inside one ring and a job of 8 takes the whole server; 1, 2, 4 or 8 per server
  (Atlas training servers, as the Ascend for Volcano plugin enforces).
- HCCS mesh (Ascend 910B, Atlas A2 servers; 910C, Atlas A3 servers): every NPU of the server talks to every
  other, so any count up to the server's NPUs fits; a job over several servers takes the same count on each.

Model names are what node backends report: the NVIDIA driver's name shortened ("A100", libs/nodes/nvml.py)
and "Ascend" plus the chip family for NPUs ("Ascend910", "Ascend910B", from npu-smi, libs/nodes/npu_smi.py).
A model this table does not list is an NVIDIA GPU with no layout rule: that is what every node reported
before NPUs were known, so older logs mean the same.
"""

from __future__ import annotations

from dataclasses import dataclass

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
class VirtualTemplate:
    """A fixed split of one NPU (Ascend's vNPU template): a share of its AI cores and of its memory."""

    name: str
    ai_cores: int
    memory_mib: int


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
    ai_cores: int = 0
    templates: tuple[VirtualTemplate, ...] = ()

    def template(self, name: str) -> VirtualTemplate | None:
        return next((t for t in self.templates if t.name == name), None)


def _vnpu(name: str, ai_cores: int, memory_gib: int) -> VirtualTemplate:
    return VirtualTemplate(name=name, ai_cores=ai_cores, memory_mib=memory_gib * 1024)


# The vNPU templates of the Ascend 910 (32 AI cores, 32 GiB): vir02, vir04, vir08 and vir16 take that many AI
# cores and a proportional share of memory (the Ascend device plugin's huawei.com/Ascend910-2c ... -16c).
_ASCEND_910_TEMPLATES = (_vnpu("vir02", 2, 2), _vnpu("vir04", 4, 4), _vnpu("vir08", 8, 8), _vnpu("vir16", 16, 16))
# The 910B's templates as Ascend's documentation lists them for Atlas A2 servers (20 AI cores, 64 GiB).
_ASCEND_910B_TEMPLATES = (_vnpu("vir05_1c_16g", 5, 16), _vnpu("vir10_3c_32g", 10, 32))

MODELS: dict[str, AcceleratorModel] = {m.name: m for m in (
    AcceleratorModel(name="Ascend910", vendor=HUAWEI, kind=NPU, topology=HCCS_RING, group_size=4,
                     counts_per_server=(1, 2, 4, 8), memory_mib=32 * 1024, ai_cores=32,
                     templates=_ASCEND_910_TEMPLATES),
    AcceleratorModel(name="Ascend910B", vendor=HUAWEI, kind=NPU, topology=HCCS_MESH, group_size=8,
                     memory_mib=64 * 1024, ai_cores=20, templates=_ASCEND_910B_TEMPLATES),
    AcceleratorModel(name="Ascend910C", vendor=HUAWEI, kind=NPU, topology=HCCS_MESH, group_size=16,
                     memory_mib=64 * 1024, ai_cores=24),
)}


def accelerator(model: str) -> AcceleratorModel:
    """The model's entry; an unknown model is an NVIDIA GPU whose NVLink domains only prefer."""
    known = MODELS.get(model)
    return known if known is not None else AcceleratorModel(name=model, vendor=NVIDIA, kind=GPU, topology=NVLINK)


def kind_of(model: str) -> str:
    return accelerator(model).kind


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
