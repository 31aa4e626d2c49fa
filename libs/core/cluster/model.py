"""The free capacity of the cluster, GPU by GPU: the model that placement and preemption share.

A GPU's free memory counts what each placement on it declared, and for a fraction that declares none its
share of the GPU's memory (`share_memory_mib`): a GPU holding 500 milli without declared memory has half its
memory left for the jobs that declare theirs.

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
    GpuSpec,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    ReplicaPlacement,
)
from libs.core.kernel.mig_profiles import COMPUTE_SLICES, MigProduct, compute_slices, product

FULL = 1000  # thousandths of a GPU
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
               mig_product=product(gpu.model, gpu.memory_mib))


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
