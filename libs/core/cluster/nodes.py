"""A node and its GPUs as the cluster model keeps them: capacity and what placements hold of it, GPU by GPU.

A GPU's free memory counts what each placement on it declared, and for a fraction that declares none its
share of the GPU's memory (`share_memory_mib`): a GPU holding 500 milli without declared memory has half its
memory left for the jobs that declare theirs."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import GpuSpec, ReplicaPlacement
from libs.core.kernel.gpu_units import FULL
from libs.core.kernel.mig_profiles import COMPUTE_SLICES, MigProduct, compute_slices, product

MIG_SLICES = COMPUTE_SLICES  # compute slices of a MIG-enabled GPU (A100/H100/H200 family)


def mig_slices(profile: str) -> int:
    """Slices a MIG profile takes: "3g.40gb" -> 3. 0 when the name is not a MIG profile."""
    return compute_slices(profile)


def share_memory_mib(memory_mib: int, milli: int) -> int:
    """The GPU memory a fraction of `milli` that declares none holds on a GPU of `memory_mib`: its share of it
    (500 milli of an 80 GiB GPU: 40 GiB). Every fraction's share rounds down, so shares that fit the GPU's
    1000 milli always fit its memory too."""
    return memory_mib * milli // FULL


def charges_share(placement: ReplicaPlacement) -> bool:
    """Is the placement a fraction outside MIG that declares no GPU memory (charged its share of memory)?"""
    return not placement.gpu_memory_mib and not placement.mig_slices and 0 < placement.gpu_milli < FULL


@dataclass(slots=True)
class Gpu:
    node: str
    index: int
    model: str
    memory_mib: int
    free_milli: int = FULL
    free_memory_mib: int = 0
    healthy: bool = True
    nvlink_group: int = -1
    mig_enabled: bool = False
    # An NPU's HCCS group (libs/core/kernel/accelerators.py); -1 for a GPU or an NPU of no known group.
    hccs_group: int = -1
    # The GPU's MIG profile table when it is MIG-capable (libs.core.kernel.mig_profiles), else None.
    mig_product: MigProduct | None = None
    # What MIG instances hold of the GPU: compute slices, share (free_milli counts it too) and count. Kept
    # across a change of MIG mode: instances run until their jobs end, whatever the mode says meanwhile.
    mig_held: int = 0
    mig_milli: int = 0
    mig_instances: int = 0
    # The fractions declaring no memory that hold the GPU, as {milli: how many}: free_memory_mib counts their
    # share of memory, which a registration changing the GPU's memory computes again from this.
    fractions: dict[int, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return self.free_milli == FULL

    @property
    def free_slices(self) -> int:
        """Free compute slices of a MIG-enabled GPU with a known profile table; 0 for any other."""
        if not self.mig_enabled or self.mig_product is None:
            return 0
        return self.mig_product.slices - self.mig_held

    @property
    def takes_mig(self) -> bool:
        """Can MIG instances go here? A MIG-enabled GPU with a profile table, holding no share of a job
        placed without MIG (a fraction or a whole GPU): a GPU serves one kind of work at a time."""
        return (self.mig_enabled and self.healthy and self.mig_product is not None
                and self.free_milli + self.mig_milli == FULL)

    @property
    def takes_shares(self) -> bool:
        """Can fractions and whole GPUs go here? A healthy GPU with MIG off and no MIG instance left."""
        return self.healthy and not self.mig_enabled and self.mig_instances == 0

    def shares_mib(self) -> int:
        """The memory the fractions declaring none hold here: each its share of this GPU's memory."""
        return sum(count * share_memory_mib(self.memory_mib, milli) for milli, count in self.fractions.items())

    def charge_share(self, milli: int, sign: int) -> None:
        """Give back (sign +1) or take (-1) the share of memory of one fraction of `milli` declaring none."""
        count = self.fractions.get(milli, 0) - sign
        if count:
            self.fractions[milli] = count
        else:
            del self.fractions[milli]
        self.free_memory_mib += sign * share_memory_mib(self.memory_mib, milli)

    def carry_use(self, prev: Gpu) -> None:
        """Take over the use `prev` (the same GPU as registered before) holds: the memory that placements
        declared as it was, the fractions declaring none at their share of this GPU's memory."""
        self.free_milli -= FULL - prev.free_milli
        declared = prev.memory_mib - prev.free_memory_mib - prev.shares_mib()
        self.fractions = dict(prev.fractions)
        self.free_memory_mib = self.memory_mib - declared - self.shares_mib()
        self.mig_held, self.mig_milli, self.mig_instances = prev.mig_held, prev.mig_milli, prev.mig_instances

    def in_use(self) -> bool:
        return self.free_milli != FULL or self.free_memory_mib != self.memory_mib or self.mig_instances != 0


def new_gpu(node: str, gpu: GpuSpec) -> Gpu:
    return Gpu(node=node, index=gpu.index, model=gpu.model, memory_mib=gpu.memory_mib, free_memory_mib=gpu.memory_mib,
               healthy=gpu.healthy, nvlink_group=gpu.nvlink_group, mig_enabled=gpu.mig_enabled,
               hccs_group=gpu.hccs_group, mig_product=product(gpu.model, gpu.memory_mib))


@dataclass(slots=True)
class Node:
    name: str
    gpus: list[Gpu]
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str]
    free_cpu_milli: int = 0
    free_memory_mib: int = 0
    online: bool = True
    models: frozenset[str] = frozenset()
    rdma_nics: int = 0
    free_rdma_nics: int = 0
    # GPUs a registration no longer lists while jobs still held them (by index): their use stays here while
    # those jobs run, and comes back with the GPU if a later registration lists it again. Never placed on.
    retired: dict[int, Gpu] = field(default_factory=dict)

    def listed_gpu(self, index: int) -> Gpu | None:
        """The GPU of that index the node's registration lists, or None."""
        if index < len(self.gpus) and self.gpus[index].index == index:
            return self.gpus[index]
        return next((g for g in self.gpus if g.index == index), None)

    def gpu(self, index: int) -> Gpu:
        found = self.listed_gpu(index)
        if found is None:
            raise KeyError(f"node {self.name} has no GPU {index}")
        return found

    def held_gpu(self, index: int) -> tuple[Gpu, bool] | None:
        """The GPU a placement names, listed (True) or retired (False); None when the node has neither."""
        found = self.listed_gpu(index)
        if found is not None:
            return found, True
        retired = self.retired.get(index)
        return None if retired is None else (retired, False)
