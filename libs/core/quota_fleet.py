"""Which GPU models the cluster has, as quota sees it: the healthy GPUs of each model on the registered nodes
not cordoned.

Quota does not place; it only needs to know whether a flavor could ever be served, so that a job allowed
several models does not take quota of a model no node has (its reservation would time out again and again
while quota of a model the cluster has sits idle).
"""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, GpuHealthChanged, JobSpec, NodeCordoned, NodeLost, NodeRegistered, NodeUncordoned
from libs.core.quotas import ANY

FLEET_EVENTS = (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned)


class Fleet:
    def __init__(self) -> None:
        self.healthy: dict[str, dict[int, tuple[str, bool]]] = {}  # node -> GPU index -> (model, healthy)
        self.cordoned: set[str] = set()  # out of placement until uncordoned (a registration keeps it so)
        self.by_model: dict[str, int] = {}  # model -> healthy GPUs of it
        self.version = 0  # bumps whenever `by_model` changes: answers cached per version go stale

    def evolve(self, event: EventBase) -> None:
        match event:
            case NodeRegistered():
                self.healthy[event.node.name] = {g.index: (g.model, g.healthy) for g in event.node.gpus}
            case NodeLost():
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

    def could_hold(self, flavor: str, spec: JobSpec, demand_milli: int) -> bool:
        """Has the cluster enough healthy GPUs of the flavor's model (any the job allows, for ANY) for the job?"""
        models = self._models(flavor, spec)
        return sum(self.by_model.get(m, 0) for m in models) * 1000 >= demand_milli

    def _models(self, flavor: str, spec: JobSpec) -> Iterable[str]:
        if flavor != ANY:
            return (flavor,)
        if spec.gpu_models:
            return spec.gpu_models
        return self.by_model.keys()

    def servable(self, flavors: tuple[str, ...], spec: JobSpec, demand_milli: int) -> tuple[str, ...]:
        """The flavors the cluster could serve the job with, in their order; all of them when none could (then
        no flavor is better than another, and placement tells why the job cannot run)."""
        able = tuple(f for f in flavors if self.could_hold(f, spec, demand_milli))
        return able if able else flavors
