"""What the cluster could ever offer, and every request that could never fit it, each with its own code.

A replica fits a node only if ALL it needs is on that one node: GPUs of one allowed model (with the memory it
asks of each), CPU, memory and RDMA NICs; a node with enough GPUs but too little memory does not count. The
bound is the inventory as registered, healthy or not, online or not (a lost node may come back); MIG-enabled
GPUs take MIG profiles only, as placement has it. No node registered yet means the inventory is unknown, not
empty: nothing is rejected for capacity then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from contracts import JobSpec, NodeRegistered, NodeSpec
from libs.core.admission.accelerator_asks import accelerator_problem
from libs.core.admission.rejection import Rejection
from libs.core.cluster.nodes import FULL
from libs.core.kernel import mig_profiles
from libs.core.kernel.accelerators import is_pattern, kinds_named, model_matches
from libs.core.kernel.policy import demand_milli

TOPOLOGY_DOMAINS = ("node", "rack", "block")
_UNBOUNDED = 1 << 62
_MAX_VERDICTS = 4096


@dataclass(frozen=True, slots=True)
class NodeShape:
    """A node's capacity alone: nodes alike are counted once, so a check costs the shapes, not the nodes."""

    cpu_milli: int
    memory_mib: int
    rdma_nics: int
    # Per model, the memory of each of its GPUs with MIG off (largest first): what whole GPUs and fractions use.
    plain: tuple[tuple[str, tuple[int, ...]], ...]
    # The MIG-enabled GPUs, as (model, memory): what MIG instances use.
    mig: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, node: NodeSpec) -> NodeShape:
        plain: dict[str, list[int]] = {}
        for g in node.gpus:
            if not g.mig_enabled:
                plain.setdefault(g.model, []).append(g.memory_mib)
        return cls(cpu_milli=node.cpu_milli, memory_mib=node.memory_mib, rdma_nics=node.rdma_nics,
                   plain=tuple((m, tuple(sorted(plain[m], reverse=True))) for m in sorted(plain)),
                   mig=tuple(sorted((g.model, g.memory_mib) for g in node.gpus if g.mig_enabled)))

    def counts(self) -> dict[str, int]:
        """GPUs per model, MIG-enabled or not."""
        out = {model: len(memories) for model, memories in self.plain}
        for model, _ in self.mig:
            out[model] = out.get(model, 0) + 1
        return out


@dataclass(slots=True)
class Inventory:
    """What the cluster could ever offer: every node registered, by its capacity."""

    max_per_node: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    shapes: dict[NodeShape, int] = field(default_factory=dict)  # how many nodes have each shape
    _shape_of: dict[str, NodeShape] = field(default_factory=dict)
    # One object per distinct shape, so that nodes alike share it (checks key their figures by its identity).
    _canonical: dict[NodeShape, NodeShape] = field(default_factory=dict)
    # Derived from the nodes, dropped whenever one registers: per label, its domains' shapes; per request
    # (the fields of a spec that capacity depends on), its verdict. Submissions mostly repeat a few shapes.
    _domains: dict[str, dict[str, dict[NodeShape, int]]] = field(default_factory=dict)
    _verdicts: dict[tuple[object, ...], Rejection | None] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        """Has any node registered? Until then nothing is known about capacity."""
        return bool(self.nodes)

    def register(self, event: NodeRegistered) -> None:
        node = event.node
        self._forget(node.name)
        shape = NodeShape.of(node)
        shape = self._canonical.setdefault(shape, shape)
        self.shapes[shape] = self.shapes.get(shape, 0) + 1
        self._shape_of[node.name] = shape
        self.nodes[node.name] = node
        self._recount()

    def unregister(self, name: str) -> None:
        """The node left the inventory (removed): it can offer nothing any more."""
        if name in self.nodes:
            self._forget(name)
            del self.nodes[name]
            self._recount()

    def _forget(self, name: str) -> None:
        old = self._shape_of.pop(name, None)
        if old is not None:
            self.shapes[old] -= 1
            if not self.shapes[old]:
                del self.shapes[old]

    def _recount(self) -> None:
        self._domains.clear()
        self._verdicts.clear()
        self.max_per_node, self.total = {}, {}
        for s, count in self.shapes.items():
            for model, n in s.counts().items():
                self.max_per_node[model] = max(self.max_per_node.get(model, 0), n)
                self.total[model] = self.total.get(model, 0) + n * count

    def domains(self, label: str) -> dict[str, dict[NodeShape, int]]:
        """The nodes' shapes per value of `label` ("rack": per rack); a node without the label is in none."""
        if label not in self._domains:
            out: dict[str, dict[NodeShape, int]] = {}
            for name, node in self.nodes.items():
                key = node.labels.get(label, "")
                if key:
                    shapes = out.setdefault(key, {})
                    shape = self._shape_of[name]
                    shapes[shape] = shapes.get(shape, 0) + 1
            self._domains[label] = out
        return self._domains[label]

    def verdict(self, spec: JobSpec) -> Rejection | None:
        key = (spec.gpus, spec.gpu_milli, spec.gpu_memory_mib, spec.cpu_milli, spec.memory_mib, spec.rdma_nics,
               spec.gpu_models, spec.mig_profile, spec.replicas, spec.spread, spec.topology, spec.topology_required)
        if key not in self._verdicts:
            if len(self._verdicts) >= _MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = self._gang_verdict(spec)
        return self._verdicts[key]

    def _gang_verdict(self, spec: JobSpec) -> Rejection | None:
        """A gang runs on one GPU model (placement never splits it over models): it fits when some one allowed
        model holds all of it. The reason given is the whole pool's when even that cannot hold it, else the
        model that comes closest (the first, by name, among equals)."""
        whole = _Fit(spec, self).problem()
        if whole is not None or spec.replicas < 2:
            return whole
        models = named_models(spec.gpu_models, self.total)
        if len(models) < 2:
            return None
        per_model = [(m, _Fit(msgspec.structs.replace(spec, gpu_models=(m,)), self).problem()) for m in models]
        if any(problem is None for _, problem in per_model):
            return None
        reasons = "; ".join(f"{m}: {problem.message}" for m, problem in per_model if problem is not None)
        return Rejection("exceeds_one_gpu_model", f"a gang runs on one GPU model and no single model can hold its "
                         f"{spec.replicas} replicas ({reasons})")


def spec_problem(spec: JobSpec) -> Rejection | None:
    """What is wrong with a spec's placement constraints whatever the cluster: a profile or topology that
    names nothing."""
    if spec.mig_profile and mig_profiles.parse(spec.mig_profile) is None:
        return Rejection("unknown_mig_profile", f"MIG profile {spec.mig_profile!r} is no MIG profile name "
                         "(e.g. 1g.10gb, 3g.40gb)")
    if spec.topology_required and spec.topology not in TOPOLOGY_DOMAINS:
        return Rejection("unknown_topology", f"required topology {spec.topology!r} unknown "
                         f"({', '.join(TOPOLOGY_DOMAINS)})")
    return accelerator_problem(spec)


def capacity_rejection(spec: JobSpec, inventory: Inventory) -> Rejection | None:
    """Why the job could never fit the cluster as registered, each reason with its own code; None when it
    could, or when no node has registered yet."""
    if not inventory.known:
        return None
    unknown = [m for m in spec.gpu_models if not is_pattern(m) and m not in inventory.total]
    if unknown:
        known = ", ".join(sorted(inventory.total)) or "no GPUs"
        return Rejection("unknown_gpu_model", f"GPU model(s) {', '.join(unknown)} unknown (cluster has {known})")
    if spec.gpu_models and not named_models(spec.gpu_models, inventory.total):
        kinds = " or ".join(sorted(k.upper() for k in kinds_named(spec.gpu_models)))
        return Rejection("no_such_accelerator", f"no {kinds} is registered (cluster has "
                         f"{', '.join(sorted(inventory.total)) or 'no GPUs'})")
    return inventory.verdict(spec)


def named_models(models: tuple[str, ...], registered: Iterable[str]) -> tuple[str, ...]:
    """The registered models a job naming `models` may run on, in name order; the named ones themselves when
    it names models only (an unknown one is refused apart)."""
    if models and not any(is_pattern(m) for m in models):
        return models
    return tuple(m for m in sorted(registered) if model_matches(models, m))


class _Fit:
    """One spec against the inventory's node shapes."""

    def __init__(self, spec: JobSpec, inventory: Inventory) -> None:
        self.spec = spec
        self.inventory = inventory
        self.models = ", ".join(spec.gpu_models) or "any model"
        self._instances: dict[tuple[str, int], int] = {}
        # How many replicas one empty node of each shape could hold at once: their GPUs alone, and all of them.
        self.gpu_slots = {id(s): self._gpu_slots(s) for s in inventory.shapes}
        self.slots = {id(s): min(self.gpu_slots[id(s)], self._host_slots(s)) for s in inventory.shapes}

    def problem(self) -> Rejection | None:
        return (self.mig_problem() if self.spec.mig_profile else self.gpu_problem()) or self.host_problem() \
            or self.cluster_problem() or self.spread_problem() or self.topology_problem()

    def _allowed(self, model: str) -> bool:
        return model_matches(self.spec.gpu_models, model)

    def _plain(self, shape: NodeShape) -> list[tuple[int, ...]]:
        """Per allowed model, the memory of its GPUs with MIG off: what a whole-GPU or fractional replica uses."""
        return [memories for model, memories in shape.plain if self._allowed(model)]

    def _mig(self, shape: NodeShape) -> list[tuple[str, int]]:
        return [(model, memory) for model, memory in shape.mig if self._allowed(model)]

    def _offered(self, model: str, memory_mib: int) -> tuple[mig_profiles.MigProduct, mig_profiles.MigProfile] | None:
        """The GPU's product and the job's profile in its table; None when either is missing."""
        known = mig_profiles.product(model, memory_mib)
        profile = None if known is None else known.profile(self.spec.mig_profile)
        return None if known is None or profile is None else (known, profile)

    def _instances_on(self, model: str, memory_mib: int) -> int:
        """How many instances of the job's MIG profile one GPU could hold at once: none when its product's
        table (a GPU of no known product has none) lacks the profile, or an instance has less memory than the
        job asks of its GPU."""
        key = (model, memory_mib)
        if key not in self._instances:
            offered = self._offered(model, memory_mib)
            fits = offered is not None and _instance_memory(memory_mib, *offered) >= self.spec.gpu_memory_mib
            self._instances[key] = offered[1].max_instances if offered is not None and fits else 0
        return self._instances[key]

    def _gpu_slots(self, shape: NodeShape) -> int:
        spec = self.spec
        if spec.mig_profile:
            return sum(self._instances_on(model, memory) for model, memory in self._mig(shape))
        need = spec.gpu_memory_mib
        if spec.gpu_milli > 0:
            per_gpu = FULL // spec.gpu_milli
            return sum(min(per_gpu, m // need) if need else per_gpu
                       for memories in self._plain(shape) for m in memories if m >= need)
        # A replica's GPUs are of one model; replicas of a gang may each take another model.
        return sum(_at_least(memories, need) // spec.gpus for memories in self._plain(shape))

    def _host_slots(self, shape: NodeShape) -> int:
        spec = self.spec
        return min(_per(shape.cpu_milli, spec.cpu_milli), _per(shape.memory_mib, spec.memory_mib),
                   _per(shape.rdma_nics, spec.rdma_nics))

    # --- one replica ------------------------------------------------------------------------------

    def gpu_problem(self) -> Rejection | None:
        spec, shapes = self.spec, self.inventory.shapes
        per_replica = 1 if spec.gpu_milli > 0 else spec.gpus
        largest = max((len(memories) for s in shapes for memories in self._plain(s)), default=0)
        if per_replica > largest:
            with_mig = max((n for s in shapes for model, n in s.counts().items() if self._allowed(model)), default=0)
            note = " that are not MIG-enabled (those take MIG profiles only)" if with_mig >= per_replica else ""
            return Rejection("exceeds_node_capacity", f"a replica needs {per_replica} GPUs of {self.models}; the "
                             f"largest node has {largest}{note}")
        biggest = max((memories[0] for s in shapes for memories in self._plain(s)), default=0)
        if spec.gpu_memory_mib > biggest:
            return Rejection("exceeds_gpu_memory", f"a replica needs {spec.gpu_memory_mib} MiB on each GPU; the "
                             f"largest GPU of {self.models} has {biggest} MiB")
        enough = max((_at_least(memories, spec.gpu_memory_mib) for s in shapes for memories in self._plain(s)),
                     default=0)
        if per_replica > enough:
            return Rejection("exceeds_node_capacity", f"a replica needs {per_replica} GPUs with "
                             f"{spec.gpu_memory_mib} MiB each; the largest node has {enough} such GPUs")
        return None

    def mig_problem(self) -> Rejection | None:
        spec = self.spec
        gpus = sorted({gpu for s in self.inventory.shapes for gpu in self._mig(s)})
        if not gpus:
            return Rejection("no_mig_enabled_gpu", f"MIG profile {spec.mig_profile} needs a MIG-enabled GPU; no GPU "
                             f"of {self.models} has MIG enabled")
        instances = [_instance_memory(memory, *offered) for model, memory in gpus
                     if (offered := self._offered(model, memory)) is not None]
        if instances:
            most = max(instances)
            if spec.gpu_memory_mib > most:
                return Rejection("exceeds_gpu_memory", f"a replica needs {spec.gpu_memory_mib} MiB on its GPU; the "
                                 f"largest {spec.mig_profile} instance has {most} MiB")
            return None
        parsed = mig_profiles.parse(spec.mig_profile)
        assert parsed is not None  # spec_problem refused it otherwise
        biggest = max(memory for _, memory in gpus)
        if parsed[1] > _rounded_up(biggest):
            return Rejection("exceeds_mig_gpu_memory", f"MIG profile {spec.mig_profile} needs {parsed[1]} MiB; the "
                             f"largest MIG-enabled GPU of {self.models} has {biggest} MiB")
        return Rejection("unknown_mig_profile", f"MIG profile {spec.mig_profile} is offered by no MIG-enabled GPU "
                         f"of {self.models} ({'; '.join(_offers(*gpu) for gpu in gpus)})")

    def host_problem(self) -> Rejection | None:
        """CPU, memory and NICs, on the nodes that could hold a replica's GPUs; then all of it on one node."""
        spec = self.spec
        able = [s for s in self.inventory.shapes if self.gpu_slots[id(s)] > 0]
        where = "that can hold a replica's GPUs"
        for code, need, have, unit in (
                ("exceeds_node_cpu", spec.cpu_milli, max((s.cpu_milli for s in able), default=0), "CPU millicores"),
                ("exceeds_node_memory", spec.memory_mib, max((s.memory_mib for s in able), default=0),
                 "MiB of memory"),
                ("exceeds_node_rdma", spec.rdma_nics, max((s.rdma_nics for s in able), default=0), "RDMA NICs")):
            if need > have:
                return Rejection(code, f"a replica needs {need} {unit}; the largest node {where} has {have}")
        if not any(self.slots[id(s)] for s in able):
            return Rejection("exceeds_node_resources", f"no node has all a replica needs at once ({self._need()})")
        return None

    def _need(self) -> str:
        spec = self.spec
        gpus = (f"MIG {spec.mig_profile}" if spec.mig_profile else f"{spec.gpu_milli / FULL:g} GPU" if spec.gpu_milli
                else f"{spec.gpus} GPUs") + f" of {self.models}"
        if spec.gpu_memory_mib and not spec.mig_profile:
            gpus += f" with {spec.gpu_memory_mib} MiB each"
        host = [f"{n} {unit}" for n, unit in ((spec.cpu_milli, "CPU millicores"), (spec.memory_mib, "MiB of memory"),
                                             (spec.rdma_nics, "RDMA NICs")) if n]
        return ", ".join([gpus, *host])

    # --- the gang -----------------------------------------------------------------------------------

    def cluster_problem(self) -> Rejection | None:
        spec, shapes = self.spec, self.inventory.shapes
        if not spec.mig_profile:
            total = sum(len(memories) * count for s, count in shapes.items() for memories in self._plain(s))
            if demand_milli(spec) > total * FULL:
                return Rejection("exceeds_cluster_capacity", f"the gang needs {demand_milli(spec) / FULL:g} GPUs; "
                                 f"the cluster has {total}")
        most = sum(self.slots[id(s)] * count for s, count in shapes.items())
        if spec.replicas > most:
            return Rejection("exceeds_cluster_capacity", f"the gang needs {spec.replicas} replicas at once; the "
                             f"cluster could hold at most {most} ({self._need()} each)")
        return None

    def spread_problem(self) -> Rejection | None:
        spec = self.spec
        if not spec.spread or spec.replicas < 2:
            return None
        able = sum(count for s, count in self.inventory.shapes.items() if self.slots[id(s)])
        if spec.replicas > able:
            return Rejection("exceeds_spread_nodes", f"{spec.replicas} replicas on distinct nodes; only {able} "
                             f"nodes can hold one ({self._need()})")
        return None

    def topology_problem(self) -> Rejection | None:
        spec = self.spec
        if not (spec.topology_required and spec.topology in TOPOLOGY_DOMAINS):
            return None

        def per_node(shape: NodeShape) -> int:
            held = self.slots[id(shape)]
            return min(1, held) if spec.spread else held  # spread: one replica per node at most

        if spec.topology == "node":
            most = max((per_node(s) for s in self.inventory.shapes), default=0)
        else:
            most = max((sum(per_node(s) * count for s, count in shapes.items())
                        for shapes in self.inventory.domains(spec.topology).values()), default=0)
        if spec.replicas > most:
            apart = ", one per node as it spreads" if spec.spread else ""
            return Rejection(f"exceeds_topology_{spec.topology}", f"the gang of {spec.replicas} replicas must share "
                             f"one {spec.topology}; the largest {spec.topology} holds at most {most}{apart}")
        return None


def _per(have: int, need: int) -> int:
    return have // need if need > 0 else _UNBOUNDED


def _instance_memory(gpu_memory_mib: int, known: mig_profiles.MigProduct, profile: mig_profiles.MigProfile) -> int:
    """The GPU memory one instance of `profile` holds on a GPU of `gpu_memory_mib`, as placement allocates it."""
    return mig_profiles.instance_memory_mib(known, profile, gpu_memory_mib)


def _at_least(memories: tuple[int, ...], need: int) -> int:
    """How many of the GPUs (memory largest first) have `need` MiB."""
    return next((i for i, m in enumerate(memories) if m < need), len(memories))


def _rounded_up(memory_mib: int) -> int:
    """A GPU's memory as profile names count it: whole GB, rounded up (an 81559 MiB GPU has 7g.80gb)."""
    return -(-memory_mib // mig_profiles.MIB_PER_GB) * mig_profiles.MIB_PER_GB


def _offers(model: str, memory_mib: int) -> str:
    known = mig_profiles.product(model, memory_mib)
    if known is None:
        return f"{model} {memory_mib} MiB: no MIG profile table known"
    return f"{model} {known.memory_gb}GB offers {', '.join(p.name for p in known.profiles)}"
