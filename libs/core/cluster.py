"""The free capacity of the cluster, GPU by GPU: the model that placement and preemption share."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts import NodeSpec, ReplicaPlacement

FULL = 1000  # thousandths of a GPU
MIG_SLICES = 7  # compute slices of a MIG-enabled GPU (A100/H100/H200 family)


def mig_slices(profile: str) -> int:
    """Slices a MIG profile takes: "3g.40gb" -> 3. 0 when the name is not a MIG profile."""
    head = profile.split(".", 1)[0]
    if len(head) < 2 or not head.endswith("g") or not head[:-1].isdigit():
        return 0
    return int(head[:-1])


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
    # Free MIG slices (MIG-enabled GPUs only); a MIG GPU's free_milli tracks its slices too.
    free_slices: int = 0

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
    rdma_nics: int = 0
    free_rdma_nics: int = 0

    def gpu(self, index: int) -> Gpu:
        if index < len(self.gpus) and self.gpus[index].index == index:
            return self.gpus[index]
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name} has no GPU {index}")


@dataclass(slots=True)
class Cluster:
    nodes: dict[str, Node] = field(default_factory=dict)
    # Nodes in name order, kept on registration: every scan walks nodes in this order.
    _order: list[Node] = field(default_factory=list)
    # Bumped when the set of nodes changes; array views rebuild then.
    version: int = 0
    # Nodes whose free capacity changed, per array view that has not seen it yet.
    _watchers: dict[int, dict[str, None]] = field(default_factory=dict)
    # The placement engine bound to this cluster (libs.core.fit.Placer), made on first use.
    placer: object | None = None
    # Free GPU share over every GPU, kept as capacity changes (so "could it fit at all?" costs nothing).
    free_total: int = 0
    # GPUs that cannot take work: on offline nodes or unhealthy.
    _down: set[str] = field(default_factory=set)
    _sick: set[tuple[str, int]] = field(default_factory=set)
    # Nodes an operator took out of placement, and nodes lost: either keeps a node offline.
    _cordoned: set[str] = field(default_factory=set)
    _lost: set[str] = field(default_factory=set)

    def usable_free_milli(self) -> int:
        """Free GPU share on online nodes' healthy GPUs."""
        lost = sum(g.free_milli for name in self._down for g in self.nodes[name].gpus)
        lost += sum(self.nodes[n].gpu(i).free_milli for n, i in self._sick if n not in self._down)
        return self.free_total - lost

    def changed_since(self, watcher: object) -> list[str]:
        changed = self._watchers.setdefault(id(watcher), {})
        names = list(changed)
        changed.clear()
        return names

    def _touch(self, name: str) -> None:
        for changed in self._watchers.values():
            changed[name] = None

    def register(self, spec: NodeSpec) -> None:
        """(Re)register a node: capacity comes from the spec, current use is kept."""
        old = self.nodes.get(spec.name)
        gpus = [
            Gpu(node=spec.name, index=g.index, model=g.model, memory_mib=g.memory_mib,
                free_memory_mib=g.memory_mib, healthy=g.healthy, nvlink_group=g.nvlink_group,
                mig_enabled=g.mig_enabled, free_slices=MIG_SLICES if g.mig_enabled else 0)
            for g in sorted(spec.gpus, key=lambda g: g.index)
        ]
        node = Node(name=spec.name, gpus=gpus, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
                    labels=dict(spec.labels), free_cpu_milli=spec.cpu_milli,
                    free_memory_mib=spec.memory_mib, models=frozenset(g.model for g in gpus),
                    rdma_nics=spec.rdma_nics, free_rdma_nics=spec.rdma_nics)
        if old is not None:
            node.free_cpu_milli -= old.cpu_milli - old.free_cpu_milli
            node.free_memory_mib -= old.memory_mib - old.free_memory_mib
            node.free_rdma_nics -= old.rdma_nics - old.free_rdma_nics
            by_index = {g.index: g for g in old.gpus}
            for g in node.gpus:
                prev = by_index.get(g.index)
                if prev is not None:
                    g.free_milli -= FULL - prev.free_milli
                    g.free_memory_mib -= prev.memory_mib - prev.free_memory_mib
                    if g.mig_enabled and prev.mig_enabled:
                        g.free_slices -= MIG_SLICES - prev.free_slices
        self.nodes[spec.name] = node
        # Kept in name order and summed by difference: a full sort and recount on each registration made
        # registering N nodes quadratic. A new list, so that a caller holding the old one sees no change.
        order = self._order.copy()
        at = bisect.bisect_left(order, spec.name, key=_name)
        if old is not None:
            order[at] = node
            self.free_total -= sum(g.free_milli for g in old.gpus)
        else:
            order.insert(at, node)
        self._order = order
        self.free_total += sum(g.free_milli for g in node.gpus)
        self.version += 1
        self._sick = {(n, i) for n, i in self._sick if n != spec.name}
        self._sick.update((spec.name, g.index) for g in node.gpus if not g.healthy)
        self._lost.discard(spec.name)  # a (re)registered node is back, unless an operator cordoned it
        self._refresh_online(spec.name)

    def set_online(self, node: str, online: bool) -> None:
        """A node lost (False) or back (True)."""
        (self._lost.discard if online else self._lost.add)(node)
        self._refresh_online(node)

    def cordon(self, node: str, cordoned: bool) -> None:
        """Take a node out of placement, or give it back; its running jobs are not touched here."""
        (self._cordoned.add if cordoned else self._cordoned.discard)(node)
        self._refresh_online(node)

    def _refresh_online(self, node: str) -> None:
        if node not in self.nodes:
            return
        online = node not in self._lost and node not in self._cordoned
        self.nodes[node].online = online
        self._touch(node)
        if online:
            self._down.discard(node)
        else:
            self._down.add(node)

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> None:
        n = self.nodes.get(node)
        if n is None:
            return
        if any(g.index == index for g in n.gpus):
            n.gpu(index).healthy = healthy
            self._touch(node)
            if healthy:
                self._sick.discard((node, index))
            else:
                self._sick.add((node, index))

    def touch(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Mark the placements' nodes changed for every array view, as releasing and allocating them again
        would, without doing either."""
        for p in placements:
            if p.node in self.nodes:
                self._touch(p.node)

    def allocate(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._apply(placements, sign=-1)

    def release(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._apply(placements, sign=+1)

    def _apply(self, placements: Iterable[ReplicaPlacement], sign: int) -> None:
        for p in placements:
            node = self.nodes.get(p.node)
            if node is None:
                continue
            self._touch(p.node)
            node.free_cpu_milli += sign * p.cpu_milli
            node.free_memory_mib += sign * p.memory_mib
            node.free_rdma_nics += sign * p.rdma_nics
            self.free_total += sign * p.gpu_milli * len(p.gpu_indices)
            for idx in p.gpu_indices:
                gpu = node.gpu(idx)
                gpu.free_milli += sign * p.gpu_milli
                gpu.free_memory_mib += sign * p.gpu_memory_mib
                gpu.free_slices += sign * p.mig_slices

    def sorted_nodes(self) -> list[Node]:
        return self._order


def _name(node: Node) -> str:
    return node.name
