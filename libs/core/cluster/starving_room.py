"""The starvation rule's questions of the nodes (the rule itself is libs/core/kernel/starvation.py, below the
cluster model, which it does not read): could the present inventory, with every running job gone, hold a job
(`EmptyInventory`, which quota and placement both ask: a job no node present could hold is no starving job),
and do a job's placements take GPUs the starving job could use (rule 3 on GPUs, `takes_usable_gpus`)."""

from __future__ import annotations

from contracts import EventBase, JobSpec, ReplicaPlacement
from libs.core.cluster.job_fit import fits, placement_shape
from libs.core.cluster.model import Cluster
from libs.core.cluster.scoring import DEFAULT_POLICY
from libs.core.kernel.accelerators import model_matches


class EmptyInventory:
    """The present nodes as placement would see them with every running job gone: registered, neither lost nor
    cordoned, their healthy GPUs. Could they hold a request? Answered by placement's own fit, kept per request
    shape until the inventory changes (a node event), so that asking it of every waiting job costs a lookup."""

    def __init__(self) -> None:
        self.cluster = Cluster()
        self.version = 0  # bumps whenever the inventory changes: answers kept per version go stale
        self._answers: dict[tuple[object, ...], bool] = {}  # request shape -> could the inventory hold it

    def fold(self, event: EventBase) -> None:
        if not self.cluster.apply_node_event(event):
            return
        self.version += 1
        self._answers.clear()

    def could_hold(self, spec: JobSpec) -> bool:
        key = placement_shape(spec, DEFAULT_POLICY)
        able = self._answers.get(key)
        if able is None:
            able = self._answers[key] = fits(self.cluster, spec)
        return able


def takes_usable_gpus(cluster: Cluster, starving: JobSpec, placements: tuple[ReplicaPlacement, ...]) -> bool:
    """Rule 3 for GPUs: do the placements take a GPU of a model the starving job may use, on a node with
    enough such GPUs to hold one of its replicas? (GPUs on a node too small for it are none of its room.)"""
    per_replica = 1 if starving.gpu_milli > 0 or starving.mig_profile else starving.gpus
    allowed = starving.gpu_models
    for p in placements:
        node = cluster.nodes.get(p.node)
        if node is None or not model_matches(allowed, p.model):
            continue
        if sum(1 for g in node.gpus if model_matches(allowed, g.model)) >= per_replica:
            return True
    return False
