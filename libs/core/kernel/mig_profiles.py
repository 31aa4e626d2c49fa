"""The MIG profiles each GPU product offers, as NVIDIA's MIG user guide lists them ("Supported MIG Profiles").

A product is a model name as nodes report it ("A100", "H100": the driver's name without form factor or memory,
see libs/nodes/nvml.py) plus its memory, because the same model comes with several memory sizes whose profiles
differ (an A100 40GB offers 3g.20gb, an A100 80GB 3g.40gb). A profile's memory is the nominal size in its name
(3g.20gb: 20 GiB), which is how NVIDIA names them; the driver's figure is a little lower.

An Ascend NPU splits the same way into virtual NPUs by fixed templates (Ascend's vNPU, "vir04": 4 AI cores), and
is a product of this table too: its compute slices are its AI cores, a template's memory is what Ascend's
documentation gives it. One machinery then serves both (placement of instances, quota, accounting, the checks
after a re-registration); a node reports an NPU split into vNPUs as `mig_enabled`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.core.kernel.gpu_units import FULL

# A GPU instance profile: compute slices, "g.", memory in GB, "gb", optionally media extensions ("+me").
_NAME = re.compile(r"([1-9][0-9]*)g\.([1-9][0-9]*)gb(\+me)?")
# A vNPU template: "vir", AI cores, optionally AI CPUs ("_3c") and memory in GB ("_32g").
_VNPU = re.compile(r"vir([0-9]+)(?:_([0-9]+)c)?(?:_([0-9]+)g)?")
MIB_PER_GB = 1024
# How far a GPU's reported memory may be from a product's nominal size and still be that product: drivers
# report a little less than the name says (an H100 80GB: 81559 MiB), and 94GB and 96GB parts sit 2% apart.
_MEMORY_TOLERANCE = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    slices: int  # compute slices of the GPU it takes
    memory_mib: int
    max_instances: int  # how many of it one GPU can hold at once


@dataclass(frozen=True, slots=True)
class MigProduct:
    model: str
    memory_gb: int
    slices: int  # compute slices of the whole GPU
    profiles: tuple[MigProfile, ...]
    memory_slices: int = 8  # memory slices of the whole GPU

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


def parse(name: str) -> tuple[int, int] | None:
    """(slices, memory_mib) a well-formed profile or template name says ("2g.10gb" -> (2, 10240), "vir04" ->
    (4, 0): memory unsaid); None when it is no such name ("banana", "1c.3g.20gb": a compute instance)."""
    found = _NAME.fullmatch(name)
    if found is not None:
        return int(found.group(1)), int(found.group(2)) * MIB_PER_GB
    vnpu = _VNPU.fullmatch(name)
    if vnpu is not None and int(vnpu.group(1)) > 0:  # memory 0 when the name does not say it
        return int(vnpu.group(1)), int(vnpu.group(3) or 0) * MIB_PER_GB
    return None


def is_vnpu(name: str) -> bool:
    """Is the name an Ascend vNPU template's ("vir04") rather than a MIG profile's?"""
    return _VNPU.fullmatch(name) is not None


def _profile(name: str, max_instances: int) -> MigProfile:
    parsed = parse(name)
    assert parsed is not None, name
    return MigProfile(name=name, slices=parsed[0], memory_mib=parsed[1], max_instances=max_instances)


def _vnpu(name: str, ai_cores: int, memory_gb: int, max_instances: int) -> MigProfile:
    return MigProfile(name=name, slices=ai_cores, memory_mib=memory_gb * MIB_PER_GB, max_instances=max_instances)


def _seven_slices(model: str, memory_gb: int, one: int, one_double: int, three: int) -> MigProduct:
    """The layout of every 7-slice product: 1g (7, one with media extensions), 1g with twice the memory (4),
    2g (3), 3g (2), 4g (1), 7g (1); the sizes are what its name says."""
    return MigProduct(model=model, memory_gb=memory_gb, slices=7, profiles=(
        _profile(f"1g.{one}gb", 7), _profile(f"1g.{one}gb+me", 1), _profile(f"1g.{one_double}gb", 4),
        _profile(f"2g.{one_double}gb", 3), _profile(f"3g.{three}gb", 2), _profile(f"4g.{three}gb", 1),
        _profile(f"7g.{memory_gb}gb", 1)))


PRODUCTS: tuple[MigProduct, ...] = (
    MigProduct(model="A30", memory_gb=24, slices=4, profiles=(
        _profile("1g.6gb", 4), _profile("1g.6gb+me", 1), _profile("2g.12gb", 2), _profile("2g.12gb+me", 1),
        _profile("4g.24gb", 1)), memory_slices=4),
    _seven_slices("A100", 40, one=5, one_double=10, three=20),
    _seven_slices("A100", 80, one=10, one_double=20, three=40),
    _seven_slices("H100", 80, one=10, one_double=20, three=40),
    _seven_slices("H100", 94, one=12, one_double=24, three=47),
    _seven_slices("H100", 96, one=12, one_double=24, three=48),
    _seven_slices("H200", 141, one=18, one_double=35, three=71),
    _seven_slices("B200", 180, one=23, one_double=45, three=90),
    # Ascend 910 (32 AI cores, 32 GB): vir02 / vir04 / vir08 / vir16 take that many cores and as many GB.
    MigProduct(model="Ascend910", memory_gb=32, slices=32, memory_slices=32, profiles=(
        _vnpu("vir02", 2, 2, 16), _vnpu("vir04", 4, 4, 8), _vnpu("vir08", 8, 8, 4), _vnpu("vir16", 16, 16, 2))),
    # Ascend 910B of an Atlas A2 server (20 AI cores, 64 GB): the templates Ascend lists for it.
    MigProduct(model="Ascend910B", memory_gb=64, slices=20, memory_slices=4, profiles=(
        _vnpu("vir05_1c_16g", 5, 16, 4), _vnpu("vir10_3c_32g", 10, 32, 2))),
)


def product(model: str, memory_mib: int) -> MigProduct | None:
    """The MIG product a GPU of `model` with `memory_mib` of memory is; None when none is known (a model
    without MIG, a memory size no product of the model has, or a GPU whose memory is unknown)."""
    best: MigProduct | None = None
    for p in PRODUCTS:
        nominal = p.memory_gb * MIB_PER_GB
        if p.model != model or abs(memory_mib - nominal) * _MEMORY_TOLERANCE > nominal:
            continue
        if best is None or abs(memory_mib - nominal) < abs(memory_mib - best.memory_gb * MIB_PER_GB):
            best = p
    return best


def lookup(model: str, memory_mib: int, profile: str) -> MigProfile | None:
    """The profile as a GPU of `model` with `memory_mib` of memory offers it (its slices and memory), or None
    when that GPU does not offer it or is no known MIG product."""
    found = product(model, memory_mib)
    return None if found is None else found.profile(profile)


# --- what an instance takes of its GPU (placement, quota and accounting count by these) ------------------------

COMPUTE_SLICES = 7  # compute slices of every product but the A30's
MEMORY_SLICES = 8
MEDIA_EXTENSIONS = "+me"


def compute_slices(profile: str) -> int:
    """Compute slices a well-formed profile name says ("3g.40gb" -> 3); 0 for any other name."""
    parsed = parse(profile)
    return 0 if parsed is None else parsed[0]


def memory_slices(found: MigProduct, profile: MigProfile) -> int:
    """Memory slices the profile takes of the product: its share of the product's memory, in slices (the
    names round the sizes: 1g.18gb on an H200 141GB is one of 8 slices, 1g.35gb two)."""
    return max(1, round(profile.memory_mib * found.memory_slices / (found.memory_gb * MIB_PER_GB)))


def instance_memory_mib(found: MigProduct, profile: MigProfile, gpu_memory_mib: int) -> int:
    """The GPU memory an instance holds on a GPU reporting `gpu_memory_mib`: its memory slices of it, so that
    instances filling every slice never hold more than the GPU has."""
    return memory_slices(found, profile) * (gpu_memory_mib // found.memory_slices)


def _gpu_slices_of(profile: str) -> int:
    """Compute slices of the products offering `profile` (a name belongs to products of one slice count);
    0 when none does."""
    return next((p.slices for p in PRODUCTS if p.profile(profile) is not None), 0)


def instance_milli(profile: str) -> int:
    """The share of its GPU (thousandths) one instance of `profile` is charged: its compute slices over the
    GPU's (3g.40gb: 3/7, 428). The one figure quota reserves, placement allocates and accounting counts; 0 for
    a profile no product offers (never placed)."""
    gpu_slices = _gpu_slices_of(profile)
    return compute_slices(profile) * FULL // gpu_slices if gpu_slices else 0
