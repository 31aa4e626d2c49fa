"""Which GPU models the cluster has, as quota sees it: the healthy GPUs of each model on the registered nodes
not cordoned.

Quota does not place; it only needs to know whether a flavor could ever be served, so that a job allowed
several models does not take quota of a model no node has (its reservation would time out again and again
while quota of a model the cluster has sits idle), and whether the present nodes could hold a job at all, were
every running job gone (the starvation rule, libs/core/kernel/starvation.py: a job they could not hold is no starving
job, and holds nobody in quota). That second answer comes from placement's own fit (libs/core/cluster/job_fit.py) on an
empty copy of the inventory (starvation.EmptyInventory, the one placement asks too): the registered nodes,
those lost or cordoned (out of placement, so they would not take it either) and unhealthy GPUs kept out as
placement keeps them out.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from contracts import EventBase, GpuHealthChanged, JobSpec, NodeCordoned, NodeLost, NodeRegistered, NodeUncordoned
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.starvation import EmptyInventory

FLEET_EVENTS = (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned)


class Fleet:
    def __init__(self) -> None:
        self.healthy: dict[str, dict[int, tuple[str, bool]]] = {}  # node -> GPU index -> (model, healthy)
        self.cordoned: set[str] = set()  # out of placement until uncordoned (a registration keeps it so)
        self.by_model: dict[str, int] = {}  # model -> healthy GPUs of it
        self.version = 0  # bumps whenever `by_model` changes: answers cached per version go stale
        # `by_model` as it was before the last fleet event folded (the very same object when that event changed
        # no count): what a job was judged on before it, to tell whose flavors it moved.
        self.before: dict[str, int] = self.by_model
        # The present nodes with nothing on them: could they hold a job with every running job gone?
        self.inventory = EmptyInventory()

    def fold(self, event: EventBase) -> None:
        if isinstance(event, FLEET_EVENTS):
            self.inventory.evolve(event)
            self.before = self.by_model
        match event:
            case NodeRegistered():
                self.healthy[event.node.name] = {g.index: (g.model, g.healthy) for g in event.node.gpus}
            case NodeLost():
                if event.removed:  # out of the inventory: it comes back as new, its cordon forgotten (as nodes.py)
                    self.cordoned.discard(event.node)
                if self.healthy.pop(event.node, None) is None:
                    return
            case NodeCordoned():
                self.cordoned.add(event.node)
            case NodeUncordoned():
                self.cordoned.discard(event.node)
            case GpuHealthChanged():
                gpus = self.healthy.get(event.node)
                if gpus is None or event.index not in gpus or gpus[event.index][1] == event.healthy:
                    return
                gpus[event.index] = (gpus[event.index][0], event.healthy)
            case _:
                return
        self._recount()

    def could_place(self, flavors: tuple[str, ...], spec: JobSpec) -> bool:
        """Could the present nodes hold the job, with every running job gone, under one of `flavors` (quota of a
        model's flavor runs the job on that model)? Asked by placement's fit; kept until the inventory changes.
        Before any node has registered the inventory is not known (quota alone, as in a test of its rules): it could."""
        if not self.inventory.cluster.nodes:
            return True
        for flavor in flavors:
            narrowed = spec if flavor == ANY or spec.gpu_models == (flavor,) else msgspec.structs.replace(
                spec, gpu_models=(flavor,))
            if self.inventory.could_hold(narrowed):
                return True
        return False

    def _recount(self) -> None:
        counts: dict[str, int] = {}
        for node, gpus in self.healthy.items():
            if node in self.cordoned:
                continue
            for model, healthy in gpus.values():
                if healthy:
                    counts[model] = counts.get(model, 0) + 1
        if counts != self.by_model:
            self.by_model = counts
            self.version += 1

    def could_hold(self, flavor: str, spec: JobSpec, demand_milli: int, counts: dict[str, int] | None = None) -> bool:
        """Has the cluster enough healthy GPUs of the flavor's model (any the job allows, for ANY) for the job?
        By `counts` (healthy GPUs per model) when given, else by the fleet as it is now."""
        by_model = self.by_model if counts is None else counts
        models = _models(flavor, spec, by_model)
        return sum(by_model.get(m, 0) for m in models) * 1000 >= demand_milli

    def servable(self, flavors: tuple[str, ...], spec: JobSpec, demand_milli: int,
                 counts: dict[str, int] | None = None) -> tuple[str, ...]:
        """The flavors the cluster could serve the job with, in their order; all of them when none could (then
        no flavor is better than another, and placement tells why the job cannot run). By `counts` as
        could_hold."""
        able = tuple(f for f in flavors if self.could_hold(f, spec, demand_milli, counts))
        return able if able else flavors


def _models(flavor: str, spec: JobSpec, by_model: dict[str, int]) -> Iterable[str]:
    if flavor != ANY:
        return (flavor,)
    if spec.gpu_models:
        return spec.gpu_models
    return by_model.keys()
