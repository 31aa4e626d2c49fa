"""GPU, MIG and host capacity folded from the log: every JobPlaced takes, every executor report of a job gone
gives back. The fold keeps the core's own Cluster (so "capacity" means here what it means to placement: a GPU
fraction that declares no GPU memory holds its share of the GPU's memory, a 500-milli job on an 80 GiB GPU
40 GiB as far as a job that declares its memory is concerned) and adds what the Cluster does not track: a MIG
instance takes the compute and memory slices of its profile on that GPU's own profile table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import JobPlaced, JobSpec, NodeSpec, ReplicaPlacement
from libs.audit.guarantees import mig_table
from libs.audit.guarantees.violation import DOUBLE_PLACEMENT, GPU_CAPACITY, MIG_SLICES, Violation
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL, Gpu, Node

GpuKey = tuple[str, int]


@dataclass(slots=True)
class MigUse:
    """What the MIG instances on one GPU take: compute slices, memory, and instances per profile."""

    compute: int = 0
    memory_mib: int = 0
    milli: int = 0  # the share the instances are charged
    instances: dict[str, int] = field(default_factory=dict)

    def add(self, other: MigUse, sign: int) -> None:
        self.compute += sign * other.compute
        self.memory_mib += sign * other.memory_mib
        self.milli += sign * other.milli
        for name, count in other.instances.items():
            self.instances[name] = self.instances.get(name, 0) + sign * count


@dataclass(slots=True)
class Holding:
    """What one placed job holds beyond the Cluster's own figures."""

    placements: tuple[ReplicaPlacement, ...]
    mig: dict[GpuKey, MigUse] = field(default_factory=dict)


@dataclass(slots=True)
class Capacity:
    cluster: Cluster = field(default_factory=Cluster)
    live: dict[str, Holding] = field(default_factory=dict)
    mig: dict[GpuKey, MigUse] = field(default_factory=dict)

    def register(self, node: NodeSpec) -> None:
        self.cluster.register(node)

    def place(self, seq: int, event: JobPlaced, spec: JobSpec | None) -> list[Violation]:
        """Take the placement's capacity; what that broke."""
        out: list[Violation] = []
        job = event.job_id
        if job in self.live:
            out.append(Violation(DOUBLE_PLACEMENT, seq, (job,),
                                 f"job {job} placed again while its placement at "
                                 f"{_where(self.live[job].placements)} was never released"))
            self.release(job)  # the new placement replaces the old one: judge it on its own
        known: list[ReplicaPlacement] = []
        for p in event.placements:
            missing = self._missing(p)
            if missing:
                out.append(Violation(GPU_CAPACITY, seq, (job,), f"job {job} replica {p.replica} placed on {missing}"))
            else:
                known.append(p)
        holding = Holding(tuple(known))
        self.cluster.allocate(known)
        for p in known:
            node = self.cluster.nodes[p.node]
            for idx in p.gpu_indices:
                self._charge(holding, node.gpu(idx), p, spec)
        self.live[job] = holding
        for p in known:
            out.extend(self._check(seq, job, p, spec))
        return out

    def release(self, job: str) -> None:
        holding = self.live.pop(job, None)
        if holding is None:
            return
        self.cluster.release(holding.placements)
        for key, use in holding.mig.items():
            self.mig[key].add(use, -1)

    def overcommitted(self, seq: int, node_name: str, registered_at: int) -> list[Violation]:
        """What the runs on a node registered again (at `registered_at`) still overcommit of its new spec."""
        node = self.cluster.nodes.get(node_name)
        if node is None:
            return []
        jobs = tuple(sorted(j for j, h in self.live.items() if any(p.node == node_name for p in h.placements)))
        since = f"since its registration at seq {registered_at}"
        out = [Violation(GPU_CAPACITY, seq, jobs, f"node {node_name} {what} {since}: {self._holders(node_name)}")
               for what in _host_overdrawn(node)]
        for gpu in node.gpus:
            holders = [h for h in self.live.values()
                       if any(p.node == node_name and gpu.index in p.gpu_indices for p in h.placements)]
            if not holders or gpu.mig_enabled or self.mig.get((node_name, gpu.index), MigUse()).compute > 0:
                continue  # MIG instances are judged by the MIG table when placed
            used = gpu.memory_mib - gpu.free_memory_mib
            if gpu.free_milli < 0 or used > gpu.memory_mib:
                out.append(Violation(GPU_CAPACITY, seq, jobs,
                                     f"GPU {node_name}/{gpu.index} holds {FULL - gpu.free_milli} milli and {used} "
                                     f"MiB of {gpu.memory_mib} {since}: {self._holders(node_name, gpu.index)}"))
        return out

    # --- internals -------------------------------------------------------------------------------

    def _missing(self, p: ReplicaPlacement) -> str:
        """What the placement names that the log never registered ("" when all exists)."""
        node = self.cluster.nodes.get(p.node)
        if node is None:
            return f"node {p.node}, which was never registered"
        indices = {g.index for g in node.gpus}
        absent = [i for i in p.gpu_indices if i not in indices]
        return f"GPU {p.node}/{absent[0]}, which does not exist" if absent else ""

    def _charge(self, holding: Holding, gpu: Gpu, p: ReplicaPlacement, spec: JobSpec | None) -> None:
        key = (gpu.node, gpu.index)
        if gpu.mig_enabled or p.mig_slices:
            name = spec.mig_profile if spec is not None else ""
            found = mig_table.instance(gpu.model, gpu.memory_mib, name)
            use = MigUse(p.mig_slices, found.memory_mib if found is not None else 0, p.gpu_milli,
                         {name: 1} if name else {})
            holding.mig.setdefault(key, MigUse()).add(use, +1)
            self.mig.setdefault(key, MigUse()).add(use, +1)

    def _check(self, seq: int, job: str, p: ReplicaPlacement, spec: JobSpec | None) -> list[Violation]:
        node = self.cluster.nodes[p.node]
        out = [Violation(GPU_CAPACITY, seq, (job,), f"node {p.node} {what}: {self._holders(p.node)}")
               for what in _host_overdrawn(node)]
        for idx in dict.fromkeys(p.gpu_indices):
            gpu = node.gpu(idx)
            if gpu.mig_enabled or p.mig_slices:
                out.extend(Violation(MIG_SLICES, seq, (job,), f"{what}: {self._holders(p.node, idx)}")
                           for what in self._mig_problems(gpu, p, spec))
                continue
            instances = self.mig.get((p.node, idx))
            if instances is not None and instances.compute > 0:
                out.append(Violation(MIG_SLICES, seq, (job,),
                                     f"a {p.gpu_milli}-milli share beside MIG instances of {instances.compute} slices "
                                     f"on GPU {p.node}/{idx}: {self._holders(p.node, idx)}"))
                continue
            if gpu.free_milli < 0:
                out.append(Violation(GPU_CAPACITY, seq, (job,),
                                     f"GPU {p.node}/{idx} allocated {FULL - gpu.free_milli} of {FULL} milli: "
                                     f"{self._holders(p.node, idx)}"))
            used = gpu.memory_mib - gpu.free_memory_mib  # the Cluster charges fractions declaring none their share
            if used > gpu.memory_mib:
                out.append(Violation(GPU_CAPACITY, seq, (job,),
                                     f"GPU {p.node}/{idx} holds {used} MiB of GPU memory (fractions that declare "
                                     f"none charged their share) of {gpu.memory_mib}: {self._holders(p.node, idx)}"))
        return out

    def _mig_problems(self, gpu: Gpu, p: ReplicaPlacement, spec: JobSpec | None) -> list[str]:
        where = f"GPU {gpu.node}/{gpu.index} ({gpu.model}, {gpu.memory_mib} MiB)"
        if not gpu.mig_enabled:
            return [f"a MIG instance of {p.mig_slices} slices on {where}, which is not MIG-enabled"]
        if not p.mig_slices:
            return [f"a {p.gpu_milli}-milli share outside MIG on MIG-enabled {where}"]
        problems = []
        use = self.mig.get((gpu.node, gpu.index), MigUse())
        beside = FULL - gpu.free_milli - use.milli
        if beside > 0:  # a share placed before MIG was turned on, still running
            problems.append(f"MIG instances beside a {beside}-milli share outside MIG on {where}")
        name = spec.mig_profile if spec is not None else ""
        found = mig_table.instance(gpu.model, gpu.memory_mib, name)
        if found is None:
            problems.append(f"profile {name or '(none declared)'} is not in the MIG table of {where}")
        elif found.slices != p.mig_slices:
            problems.append(f"{p.mig_slices} compute slices taken for profile {name}, which has {found.slices}, "
                            f"on {where}")
        has = mig_table.gpu(gpu.model, gpu.memory_mib)
        if use.compute > has.slices:
            problems.append(f"{use.compute} of {has.slices} compute slices taken on {where}")
        if use.memory_mib > has.memory_mib:
            problems.append(f"{use.memory_mib} of {has.memory_mib} MiB of MIG instance memory taken on {where}")
        if found is not None and found.max_instances is not None and use.instances.get(name, 0) > found.max_instances:
            problems.append(f"{use.instances[name]} instances of {name} on {where}, which holds at most "
                            f"{found.max_instances}")
        return problems

    def _holders(self, node: str, index: int | None = None) -> str:
        jobs = sorted(j for j, h in self.live.items()
                      if any(p.node == node and (index is None or index in p.gpu_indices) for p in h.placements))
        return "held by " + ", ".join(jobs)


def _host_overdrawn(node: Node) -> list[str]:
    out = []
    if node.free_cpu_milli < 0:
        out.append(f"CPU allocated {node.cpu_milli - node.free_cpu_milli} of {node.cpu_milli} milli")
    if node.free_memory_mib < 0:
        out.append(f"memory allocated {node.memory_mib - node.free_memory_mib} of {node.memory_mib} MiB")
    if node.free_rdma_nics < 0:
        out.append(f"RDMA NICs allocated {node.rdma_nics - node.free_rdma_nics} of {node.rdma_nics}")
    return out


def _where(placements: tuple[ReplicaPlacement, ...]) -> str:
    return ", ".join(f"{p.node}{list(p.gpu_indices)}" for p in placements) or "nowhere"
