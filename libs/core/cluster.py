"""The free capacity of the cluster, GPU by GPU: the model that placement and preemption share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts import NodeSpec, ReplicaPlacement

FULL = 1000  # thousandths of a GPU


@dataclass(slots=True)
class Gpu:
    node: str
    index: int
    model: str
    memory_mib: int
    free_milli: int = FULL
    free_memory_mib: int = 0
    healthy: bool = True

    @property
    def idle(self) -> bool:
        return self.free_milli == FULL


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

    def gpu(self, index: int) -> Gpu:
        if index < len(self.gpus) and self.gpus[index].index == index:
            return self.gpus[index]
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name} has no GPU {index}")

    def idle_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if g.healthy and g.idle]


@dataclass(slots=True)
class Cluster:
    nodes: dict[str, Node] = field(default_factory=dict)
    # Nodes in name order, kept on registration: every scan walks nodes in this order.
    _order: list[Node] = field(default_factory=list)

    def register(self, spec: NodeSpec) -> None:
        """(Re)register a node: capacity comes from the spec, current use is kept."""
        old = self.nodes.get(spec.name)
        gpus = [
            Gpu(node=spec.name, index=g.index, model=g.model, memory_mib=g.memory_mib,
                free_memory_mib=g.memory_mib, healthy=g.healthy)
            for g in sorted(spec.gpus, key=lambda g: g.index)
        ]
        node = Node(name=spec.name, gpus=gpus, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
                    labels=dict(spec.labels), free_cpu_milli=spec.cpu_milli,
                    free_memory_mib=spec.memory_mib, models=frozenset(g.model for g in gpus))
        if old is not None:
            node.free_cpu_milli -= old.cpu_milli - old.free_cpu_milli
            node.free_memory_mib -= old.memory_mib - old.free_memory_mib
            by_index = {g.index: g for g in old.gpus}
            for g in node.gpus:
                prev = by_index.get(g.index)
                if prev is not None:
                    g.free_milli -= FULL - prev.free_milli
                    g.free_memory_mib -= prev.memory_mib - prev.free_memory_mib
        self.nodes[spec.name] = node
        self._order = [self.nodes[k] for k in sorted(self.nodes)]

    def set_online(self, node: str, online: bool) -> None:
        if node in self.nodes:
            self.nodes[node].online = online

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> None:
        n = self.nodes.get(node)
        if n is None:
            return
        if any(g.index == index for g in n.gpus):
            n.gpu(index).healthy = healthy

    def allocate(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._apply(placements, sign=-1)

    def release(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._apply(placements, sign=+1)

    def _apply(self, placements: Iterable[ReplicaPlacement], sign: int) -> None:
        for p in placements:
            node = self.nodes.get(p.node)
            if node is None:
                continue
            node.free_cpu_milli += sign * p.cpu_milli
            node.free_memory_mib += sign * p.memory_mib
            for idx in p.gpu_indices:
                gpu = node.gpu(idx)
                gpu.free_milli += sign * p.gpu_milli
                gpu.free_memory_mib += sign * p.gpu_memory_mib

    def sorted_nodes(self) -> list[Node]:
        return self._order

    def models(self) -> set[str]:
        return {g.model for n in self.nodes.values() for g in n.gpus}
