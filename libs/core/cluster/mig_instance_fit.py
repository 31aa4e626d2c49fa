"""Where one MIG instance goes: on a MIG-enabled GPU whose profile table offers the job's profile, with the
compute slices and memory slices the profile takes still free, and no fraction or whole-GPU job on it.

Instances are counted by their slices; NVIDIA's placement rules within a GPU are not modelled. A profile with
media extensions (`+me`, one per GPU) goes only to a GPU holding no instance yet, so that a second one can
never share it (placements do not name their profile, so the GPU cannot tell which instance has them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import JobSpec
from libs.core.cluster.nodes import Gpu, Node
from libs.core.kernel.accelerators import model_matches
from libs.core.kernel.mig_profiles import MEDIA_EXTENSIONS, instance_memory_mib


@dataclass(frozen=True, slots=True)
class MigChoice:
    node: Node
    gpu: Gpu
    slices: int
    memory_mib: int  # the instance's memory on that GPU


def offers(gpu: Gpu, spec: JobSpec) -> bool:
    """Does the GPU (healthy, MIG-enabled, of an allowed model) have the job's profile at all?"""
    return (gpu.mig_enabled and gpu.healthy and gpu.mig_product is not None
            and gpu.mig_product.profile(spec.mig_profile) is not None
            and model_matches(spec.gpu_models, gpu.model))


def instance_fit(gpu: Gpu, spec: JobSpec) -> tuple[int, int] | None:
    """(compute slices, memory MiB) an instance of the job's profile takes on `gpu`, if it fits there now."""
    if not gpu.takes_mig or gpu.mig_product is None or not model_matches(spec.gpu_models, gpu.model):
        return None
    found = gpu.mig_product.profile(spec.mig_profile)
    if found is None or (found.name.endswith(MEDIA_EXTENSIONS) and gpu.mig_instances):
        return None
    memory = instance_memory_mib(gpu.mig_product, found, gpu.memory_mib)
    if gpu.free_slices < found.slices or gpu.free_memory_mib < memory or spec.gpu_memory_mib > memory:
        return None
    return found.slices, memory


def choose_mig(nodes: Sequence[Node], spec: JobSpec, host_ok: Sequence[bool]) -> MigChoice | None:
    """Best fit: the GPU left with the fewest free compute slices, then the least free memory, then node name
    and GPU index. `host_ok`: per node, may a replica go there (online, CPU, memory, NICs, allowed rows)."""
    best: tuple[int, int, str, int] | None = None
    chosen: MigChoice | None = None
    for node, ok in zip(nodes, host_ok, strict=True):
        if not ok:
            continue
        for g in node.gpus:
            fit = instance_fit(g, spec)
            if fit is None:
                continue
            key = (g.free_slices - fit[0], g.free_memory_mib - fit[1], node.name, g.index)
            if best is None or key < best:
                best, chosen = key, MigChoice(node, g, fit[0], fit[1])
    return chosen
