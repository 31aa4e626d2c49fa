"""Where a replica of whole NPUs goes when its devices must share an interconnect group (an Ascend 910's HCCS
ring, libs/core/kernel/accelerators.py): on one node, inside one group when it fits one, else on whole groups.

A group is judged by what the placement leaves usable. The NPUs a typical request can still use on a node are
those that fit it inside groups (two rings with 2 free each hold no 4-NPU job); what they cannot use is lost to
fragmentation, the measure FGD (ATC'23) minimises for GPUs, here counted ring by ring. The choice, in order:

1. the node and group(s) whose placement adds the least unusable NPUs for the workload's typical whole-NPU
   requests (the model's allowed counts when the workload has none);
2. then the group Ascend for Volcano prefers: one the replica fills exactly, then one it leaves an even number
   free in, then the one it leaves least free in (`group_preference`);
3. then the node already holding the most work (servers fill before new ones are broken into);
4. then the node's name and the group's lowest device, so that the choice is the same on every replay.

Two other orders are kept to compare against (`sim npu-rings`): `volcano` (rules 2, 3 and 4 alone: Ascend for
Volcano's documented order) and `ignore_rings` (best fit by node, the lowest free devices, as a scheduler that
knows no rings would: its replicas can straddle rings and then fail when they run).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from contracts import JobSpec
from libs.core.cluster.nodes import FULL, Gpu, Node
from libs.core.cluster.shapes import TypicalShapes
from libs.core.kernel.accelerators import (
    NVLINK,
    accelerator,
    count_fits_server,
    group_preference,
    model_matches,
)

GPUSCHED = "gpusched"
VOLCANO = "volcano"
IGNORE_RINGS = "ignore_rings"
GROUP_POLICIES = (GPUSCHED, VOLCANO, IGNORE_RINGS)

# (devices per replica, how often the workload asks it)
Demand = Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class GroupChoice:
    node: Node
    devices: tuple[Gpu, ...]


@cache
def strict(model: str) -> bool:
    """Must a multi-device replica of this model stay inside its interconnect groups?"""
    entry = accelerator(model)
    return entry.topology != NVLINK and entry.group_size > 0


def uses_groups(spec: JobSpec, registered_models: Iterable[str]) -> bool:
    """Is the job a request of whole devices that may run on a model with a strict group rule?"""
    return (not spec.mig_profile and spec.gpu_milli <= 0 and spec.gpus > 0
            and any(strict(m) and model_matches(spec.gpu_models, m) for m in registered_models))


def group_of(gpu: Gpu, group_size: int) -> int:
    """The device's group: as its node reported it, else by index as Ascend's servers number them."""
    return gpu.hccs_group if gpu.hccs_group >= 0 else gpu.index // group_size


def groups_held(node: Node, indices: Iterable[int]) -> set[int]:
    """The groups of a model with a strict group rule that the node's devices `indices` sit in (none for
    devices of a model whose groups only prefer)."""
    held: set[int] = set()
    for index in indices:
        gpu = node.listed_gpu(index)
        if gpu is not None and strict(gpu.model):
            held.add(group_of(gpu, accelerator(gpu.model).group_size))
    return held


def free_groups(node: Node, model: str, spec: JobSpec) -> dict[int, list[Gpu]]:
    """The node's idle healthy devices of `model` (with the memory the job declares), by group."""
    size = accelerator(model).group_size or len(node.gpus) or 1
    out: dict[int, list[Gpu]] = {}
    for gpu in node.gpus:
        if (gpu.model == model and gpu.takes_shares and gpu.free_milli == FULL
                and gpu.free_memory_mib >= spec.gpu_memory_mib):
            out.setdefault(group_of(gpu, size), []).append(gpu)
    return out


def options(free: dict[int, list[Gpu]], model: str, count: int, ignore_rings: bool = False
            ) -> list[tuple[Gpu, ...]]:
    """Every way to give a replica `count` devices from these free groups: inside one group when the count
    fits one, else on whole free groups; any free devices when the model has no strict groups."""
    entry = accelerator(model)
    if ignore_rings or not strict(model):
        pooled = sorted((g for gpus in free.values() for g in gpus), key=lambda g: g.index)
        return [tuple(pooled[:count])] if len(pooled) >= count else []
    size = entry.group_size
    if count <= size:
        return [tuple(gpus[:count]) for _, gpus in sorted(free.items()) if len(gpus) >= count]
    whole = [gpus for _, gpus in sorted(free.items()) if len(gpus) == size]
    need = -(-count // size)
    if count % size or len(whole) < need:
        return []
    return [tuple(g for gpus in whole[:need] for g in gpus)]


def unusable(free_by_group: Sequence[int], group_size: int, demand: Demand) -> float:
    """Free devices the typical requests could not use, on average over them: a request of k devices uses k
    of a group with k free (k at most a group), or whole free groups (k a multiple of the group)."""
    total = sum(free_by_group)
    asked = sum(weight for _, weight in demand)
    if not total or not asked:
        return 0.0
    lost = 0
    for count, weight in demand:
        if count <= group_size:
            usable = sum(free // count * count for free in free_by_group)
        else:
            whole = sum(1 for free in free_by_group if free == group_size)
            usable = whole // (count // group_size) * count if count % group_size == 0 else 0
        lost += weight * (total - usable)
    return lost / asked


def workload_demand(model: str, typical: Iterable[tuple[int, tuple[str, ...], int]]) -> Demand:
    """What `model` is asked: the workload's typical whole-device requests that could run on it (count,
    models, how often), and each count the model's servers allow once more. The allowed counts stand for the
    requests not seen yet: early in a workload only its first shapes are known, and a ring broken for them
    would be lost to the 4- and 8-NPU jobs that come next; many requests seen outweigh them."""
    asked: dict[int, int] = dict.fromkeys(accelerator(model).counts_per_server or (1,), 1)
    for count, models, weight in typical:
        if count > 0 and model_matches(models, model) and count_fits_server(model, count):
            asked[count] = asked.get(count, 0) + weight
    return sorted(asked.items())


def demand_by_model(typical: TypicalShapes | None, models: Iterable[str]) -> dict[str, Demand]:
    """Per model, workload_demand of the workload's typical whole-device shapes (common and rare)."""
    shapes = [] if typical is None else [
        (s.gpus, s.models, n) for s, n in zip((*typical.shapes, *typical.rare), (*typical.counts, *typical.rare_counts),
                                              strict=True) if s.gpu_milli == FULL]
    return {m: workload_demand(m, shapes) for m in models}


def choose_in_groups(nodes: Sequence[Node], spec: JobSpec, host_ok: Sequence[bool],
                     demand_of: dict[str, Demand], policy: str = GPUSCHED) -> GroupChoice | None:
    """The node and devices for one replica of whole devices, by the module's rule (`policy`: one of
    GROUP_POLICIES); None when no node has them. `host_ok`: per node, may a replica go there at all (online,
    CPU, memory, NICs, allowed rows); `demand_of`: each model's typical requests (workload_demand)."""
    best: tuple[object, ...] | None = None
    chosen: GroupChoice | None = None
    for node, ok in zip(nodes, host_ok, strict=True):
        if not ok:
            continue
        for model in sorted({g.model for g in node.gpus if model_matches(spec.gpu_models, g.model)}):
            if not count_fits_server(model, spec.gpus):
                continue
            free = free_groups(node, model, spec)
            for devices in options(free, model, spec.gpus, ignore_rings=policy == IGNORE_RINGS):
                key = _rank(node, model, free, devices, demand_of.get(model, ()), policy)
                if best is None or key < best:
                    best, chosen = key, GroupChoice(node, devices)
    return chosen


def _rank(node: Node, model: str, free: dict[int, list[Gpu]], devices: tuple[Gpu, ...], demand: Demand,
          policy: str) -> tuple[object, ...]:
    """The option's place in the module's order (smaller is better)."""
    held = sum(1 for g in node.gpus if g.free_milli < FULL)
    tie = (node.name, devices[0].index)
    if policy == IGNORE_RINGS:  # best fit by node: the fewest devices left free
        return (sum(len(gpus) for gpus in free.values()) - len(devices), *tie)
    size = accelerator(model).group_size if strict(model) else max(len(node.gpus), 1)
    taken = {g.index for g in devices}
    group = group_of(devices[0], size)
    preference = group_preference(len(free.get(group, ())), len(devices)) if len(devices) <= size else (0, 0, 0)
    if policy == VOLCANO:
        return (preference, -held, *tie)
    groups = sorted(free)
    before = [len(free[k]) for k in groups]
    after = [sum(1 for g in free[k] if g.index not in taken) for k in groups]
    added = unusable(after, size, demand) - unusable(before, size, demand)
    return (round(added, 9), preference, -held, *tie)
