"""A replica of whole NPUs sits inside its interconnect groups: inside one HCCS ring when it fits one, else on
whole rings, and only in the counts a server of its model gives (1, 2, 4 or 8 Ascend 910 NPUs); NPUs of two
rings cannot talk to each other, so a replica across them fails when it runs."""

from __future__ import annotations

from contracts import JobPlaced, JobSpec, ReplicaPlacement
from libs.audit.guarantees.violation import DEVICE_GROUPS, Violation
from libs.core.cluster.device_groups import group_of, strict
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL
from libs.core.kernel.accelerators import accelerator, count_fits_server


def device_group_violations(seq: int, event: JobPlaced, spec: JobSpec | None, cluster: Cluster) -> list[Violation]:
    if spec is None or spec.mig_profile:
        return []
    job = event.job_id
    return [Violation(DEVICE_GROUPS, seq, (job,), f"job {job}: {problem}")
            for p in event.placements if (problem := _problem(p, cluster)) is not None]


def _problem(placement: ReplicaPlacement, cluster: Cluster) -> str | None:
    node = cluster.nodes.get(placement.node)
    if node is None or placement.gpu_milli != FULL or not placement.gpu_indices:
        return None
    devices = [node.listed_gpu(i) for i in placement.gpu_indices]
    models = {d.model for d in devices if d is not None}
    if len(models) != 1 or not strict(next(iter(models))):
        return None
    model = next(iter(models))
    size = accelerator(model).group_size
    count = len(placement.gpu_indices)
    where = f"replica {placement.replica} on {placement.node}{list(placement.gpu_indices)}"
    if not count_fits_server(model, count):
        return f"{where}: {count} {model} devices, which a server of it never gives one replica"
    groups: dict[int, int] = {}
    for device in devices:
        if device is not None:
            groups[group_of(device, size)] = groups.get(group_of(device, size), 0) + 1
    if count <= size and len(groups) > 1:
        return f"{where}: across HCCS groups {sorted(groups)} though {count} fit one"
    if count > size and any(n != size for n in groups.values()):
        return f"{where}: {count} devices on groups {groups} rather than on whole groups of {size}"
    return None
