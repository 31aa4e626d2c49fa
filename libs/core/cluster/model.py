"""The free capacity of the cluster, GPU by GPU: the model that placement and preemption share. Its nodes and
GPUs are libs/core/cluster/nodes.py's; this module keeps them in order, folds the inventory events, allocates and
releases placements, and tells array views which nodes changed.

What-ifs ("would the nominee fit with its victims gone?", "when could the starving job start?") change the live
cluster inside `Cluster.what_if()`, which records every allocation and release made meanwhile, by anyone, and
rolls them all back at the end (KAI Scheduler's statements): no caller undoes a trial by hand."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

from contracts import (
    EventBase,
    GpuHealthChanged,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    ReplicaPlacement,
)
from libs.core.cluster.nodes import Node, charges_share, new_gpu

# One change a what-if recorded: the placements allocated (-1) or released (+1).
Change = tuple[tuple[ReplicaPlacement, ...], int]


class WhatIf:
    """A trial on the live cluster, rolled back when it ends: `with cluster.what_if() as trial:`.

    While it is open, every allocation and release on the cluster is recorded, whoever makes it (the trial's own
    `allocate`/`release`, a Placer trying a gang, a nested what-if that keeps its changes). On leaving the block
    the recorded changes are undone, last first, each by its inverse, so the cluster ends exactly as it began
    (free capacity, and every array view told of each node touched); unless `keep()` was called: then they stand,
    and an enclosing what-if records them as its own. What-ifs nest; each rolls back only its own changes.

    Only capacity is recorded: node events (registration, loss, cordon, GPU health) are refused while a what-if
    is open, since they are facts from the log, never trials.

        with cluster.what_if() as trial:
            for victim in victims:
                trial.release(victim.placements)  # the victims gone...
            room = placer.fits(preemptor)  # ...would the preemptor fit? (the placer's tries are recorded too)
        # here the victims hold their GPUs again

        with cluster.what_if() as trial:
            placed = placer.place_gang(spec)
            if acceptable(placed):
                trial.keep()  # the trial becomes the decision
    """

    __slots__ = ("_changes", "_cluster", "_kept", "_outer")

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._changes: list[Change] = []
        self._outer: list[Change] | None = None
        self._kept = False

    def __enter__(self) -> WhatIf:
        self._outer = self._cluster._changes
        self._cluster._changes = self._changes
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        cluster = self._cluster
        if not self._changes:  # (most trials that fail change nothing)
            cluster._changes = self._outer
            self._kept = False
            return
        if self._kept:
            if self._outer is not None:
                self._outer.extend(self._changes)
        else:
            cluster._changes = None  # the undo itself is recorded by no one
            for placements, sign in reversed(self._changes):
                cluster._apply(placements, -sign)
        cluster._changes = self._outer
        self._changes, self._kept = [], False

    def allocate(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._cluster.allocate(placements)

    def release(self, placements: Iterable[ReplicaPlacement]) -> None:
        self._cluster.release(placements)

    def keep(self) -> None:
        """Let the changes made in this what-if stand when it ends (a trial that became the decision)."""
        self._kept = True


@dataclass(slots=True)
class Cluster:
    nodes: dict[str, Node] = field(default_factory=dict)
    # Nodes in name order, kept on registration: every scan walks nodes in this order.
    _order: list[Node] = field(default_factory=list)
    # Bumped when the set of nodes changes; array views rebuild then.
    version: int = 0
    # Nodes whose free capacity changed, per array view that has not seen it yet.
    _watchers: dict[int, dict[str, None]] = field(default_factory=dict)
    # The placement engine bound to this cluster (libs.core.cluster.job_fit.Placer), made on first use.
    placer: object | None = None
    # Free GPU share over every GPU, kept as capacity changes (so "could it fit at all?" costs nothing).
    free_total: int = 0
    # GPUs that cannot take work: on offline nodes or unhealthy.
    _down: set[str] = field(default_factory=set)
    _sick: set[tuple[str, int]] = field(default_factory=set)
    # Nodes an operator took out of placement, and nodes lost: either keeps a node offline.
    _cordoned: set[str] = field(default_factory=set)
    _lost: set[str] = field(default_factory=set)
    # The changes the innermost open what-if records (None: no what-if open, nothing recorded).
    _changes: list[Change] | None = None

    def what_if(self) -> WhatIf:
        """A trial of allocations and releases, all rolled back at the end of the `with` block (see WhatIf)."""
        return WhatIf(self)

    def _refuse_in_trial(self) -> None:
        if self._changes is not None:
            raise RuntimeError("node events change the inventory, which a what-if does not roll back")

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

    def apply_node_event(self, event: EventBase) -> bool:
        """Fold an inventory event (a node registered, lost, cordoned or uncordoned, a GPU's health); False for
        any other event."""
        match event:
            case NodeRegistered():
                self.register(event.node)
            case NodeLost():
                self.set_online(event.node, False)
                if event.removed:  # out of the inventory: it comes back as new, its cordon forgotten (as nodes.py)
                    self.cordon(event.node, False)
            case NodeCordoned() | NodeUncordoned():
                self.cordon(event.node, isinstance(event, NodeCordoned))
            case GpuHealthChanged():
                self.set_gpu_health(event.node, event.index, event.healthy)
            case _:
                return False
        return True

    def register(self, spec: NodeSpec) -> None:
        """(Re)register a node: capacity comes from the spec, current use is kept, GPU by GPU (a GPU the spec
        no longer lists keeps its use aside, retired, until the jobs holding it end)."""
        self._refuse_in_trial()
        old = self.nodes.get(spec.name)
        gpus = [new_gpu(spec.name, g) for g in sorted(spec.gpus, key=lambda g: g.index)]
        node = Node(name=spec.name, gpus=gpus, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
                    labels=dict(spec.labels), free_cpu_milli=spec.cpu_milli,
                    free_memory_mib=spec.memory_mib, models=frozenset(g.model for g in gpus),
                    rdma_nics=spec.rdma_nics, free_rdma_nics=spec.rdma_nics)
        if old is not None:
            node.free_cpu_milli -= old.cpu_milli - old.free_cpu_milli
            node.free_memory_mib -= old.memory_mib - old.free_memory_mib
            node.free_rdma_nics -= old.rdma_nics - old.free_rdma_nics
            by_index = {**old.retired, **{g.index: g for g in old.gpus}}
            for g in node.gpus:
                prev = by_index.pop(g.index, None)
                if prev is not None:
                    g.carry_use(prev)
            node.retired = {i: g for i, g in sorted(by_index.items()) if g.in_use()}
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
        self._refuse_in_trial()
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
        self._refuse_in_trial()
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
        if self._changes is not None:
            placements = tuple(placements)
            self._changes.append((placements, sign))
        for p in placements:
            node = self.nodes.get(p.node)
            if node is None:
                continue
            self._touch(p.node)
            node.free_cpu_milli += sign * p.cpu_milli
            node.free_memory_mib += sign * p.memory_mib
            node.free_rdma_nics += sign * p.rdma_nics
            gpus = node.gpus
            share = charges_share(p)
            for idx in p.gpu_indices:
                if idx < len(gpus) and gpus[idx].index == idx:  # the usual case, first (the hot path of placing)
                    gpu, listed = gpus[idx], True
                else:
                    held = node.held_gpu(idx)
                    if held is None:
                        continue  # a GPU gone from the node with no use left there: nothing to give or take
                    gpu, listed = held
                gpu.free_milli += sign * p.gpu_milli
                if share:
                    gpu.charge_share(p.gpu_milli, sign)
                else:
                    gpu.free_memory_mib += sign * p.gpu_memory_mib
                if p.mig_slices:
                    gpu.mig_held -= sign * p.mig_slices
                    gpu.mig_milli -= sign * p.gpu_milli
                    gpu.mig_instances -= sign
                if listed:
                    self.free_total += sign * p.gpu_milli
                # A retired GPU stays retired even once free (a simulation gives use back and takes it again):
                # the next registration drops it then.

    def sorted_nodes(self) -> list[Node]:
        return self._order


def _name(node: Node) -> str:
    return node.name
