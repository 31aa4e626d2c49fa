"""The MIG profile table as the checker needs it: what one instance of a profile takes of its GPU (compute
slices, memory, how many of it fit at most) and what the GPU has. Read from libs.core.kernel.mig_profiles, through
the few names every form of that table offers (`lookup`, and `product` or the slice constants)."""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.cluster.nodes import MIG_SLICES
from libs.core.kernel import mig_profiles


@dataclass(frozen=True, slots=True)
class MigInstance:
    profile: str
    slices: int
    memory_mib: int
    max_instances: int | None  # None: the table does not say


@dataclass(frozen=True, slots=True)
class MigGpu:
    slices: int
    memory_mib: int


def instance(model: str, memory_mib: int, profile: str) -> MigInstance | None:
    """One instance of `profile` on a GPU of `model` with `memory_mib`; None when that GPU has no such profile."""
    found = mig_profiles.lookup(model, memory_mib, profile) if profile else None
    if found is None:
        return None
    return MigInstance(profile, found.slices, found.memory_mib, getattr(found, "max_instances", None))


def gpu(model: str, memory_mib: int) -> MigGpu:
    """What a MIG-enabled GPU has to carve: its compute slices and the memory its instances share."""
    product = getattr(mig_profiles, "product", None)
    known = product(model, memory_mib) if product is not None else None
    if known is not None:
        return MigGpu(known.slices, known.memory_gb * getattr(mig_profiles, "MIB_PER_GB", 1024))
    slices = getattr(mig_profiles, "COMPUTE_SLICES", MIG_SLICES)
    memory_slices = getattr(mig_profiles, "MEMORY_SLICES", 1)
    return MigGpu(slices, memory_mib // memory_slices * memory_slices)
