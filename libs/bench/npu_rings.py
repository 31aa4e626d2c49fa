"""A mixed cluster, GPUs and Ascend NPUs, run in virtual time under three ways of placing NPUs: how many NPUs
sit idle while a job waits for a whole ring, when rings are kept whole or not.

The cluster is the openb trace's GPU nodes beside Ascend 910 servers (8 NPUs in two HCCS rings of 4). GPU pods
come from an openb pod list, NPU jobs from the Philly trace (its GPU counts as NPU counts, rounded up to what a
910 server gives one replica: 1, 2, 4 or 8; more than 8 is a gang of 8-NPU replicas). Arrival times are scaled
so that the NPU jobs offer `load` of the NPUs.

Jobs wait first come first served with backfill: at every arrival and end, each waiting job is tried in order,
and one that fits starts (with `hold_after_s`, once the oldest waiting job of a kind has waited that long no later
one passes it; by default none is held, as a hold that blocks every later job convoys the whole pool behind one
8-NPU job on a trace whose small jobs run for days).

Placement is the platform's own (libs/core/cluster/job_fit.py); only the NPU order changes
(libs/core/cluster/device_groups.py):
- `gpusched`: the fewest NPUs left unusable, then Volcano's ring order;
- `volcano`: Ascend for Volcano's documented order;
- `ignore_rings`: best fit by node, rings ignored. A replica across two rings would fail when it starts; it is
  counted, and let run as if it had not.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contracts import JobSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster.device_groups import group_of, groups_held
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL
from libs.core.cluster.shapes import typical_shapes
from libs.core.kernel.accelerators import NPU, accelerator, kind_of
from libs.nodes.sim import device_specs

NPU_MODEL = "Ascend910"
SERVER_NPUS = 8


@dataclass(frozen=True, slots=True)
class SimJob:
    job_id: str
    submit_s: float
    runtime_s: float
    spec: JobSpec

    @property
    def npu(self) -> bool:
        return bool(self.spec.gpu_models) and kind_of(self.spec.gpu_models[0]) == NPU


@dataclass
class PolicyFigures:
    """What one placement order did, measured from the first arrival to the last (after it, jobs only drain)."""

    policy: str
    npu_jobs: int = 0
    gpu_jobs: int = 0
    npu_started: int = 0
    gpu_started: int = 0
    across_rings: int = 0  # NPU replicas placed across two rings (they would fail when they start)
    # Free NPUs no 4-NPU replica could use (outside a ring with 4 free), x hours.
    stranded_npu_h: float = 0.0
    # Jobs of 4 or more NPUs per replica that once could not be placed though enough NPUs were free.
    blocked_by_rings: set[int] = field(default_factory=set)
    busy_npu_h: float = 0.0
    window_h: float = 0.0
    waits: dict[int, list[float]] = field(default_factory=dict)  # NPUs per replica -> waits (s)

    def row(self, npus: int) -> dict[str, float | int | str]:
        mean = {k: sum(v) / len(v) if v else 0.0 for k, v in sorted(self.waits.items())}
        hours = self.window_h or 1.0
        return {"policy": self.policy, "npu_jobs_started": self.npu_started, "gpu_jobs_started": self.gpu_started,
                "replicas_across_rings": self.across_rings,
                "big_jobs_blocked_with_enough_npus_free": len(self.blocked_by_rings),
                "mean_npus_stranded_for_4": round(self.stranded_npu_h / hours, 2),
                "npu_utilisation": round(self.busy_npu_h / (npus * hours), 4),
                **{f"mean_wait_s_{k}_npu": round(v, 1) for k, v in mean.items()}}


def npu_servers(count: int) -> list[NodeSpec]:
    return [NodeSpec(name=f"ascend-{i:03d}", gpus=device_specs(f"ascend-{i:03d}", NPU_MODEL, SERVER_NPUS),
                     cpu_milli=192_000, memory_mib=768 * 1024) for i in range(count)]


def npu_count(gpus: int) -> tuple[int, int]:
    """(replicas, NPUs each) for a trace job of `gpus`: rounded up to a count a 910 server gives one replica."""
    if gpus > SERVER_NPUS:
        return math.ceil(gpus / SERVER_NPUS), SERVER_NPUS
    allowed = accelerator(NPU_MODEL).counts_per_server
    return 1, next(c for c in allowed if c >= gpus)


def scale_arrivals(jobs: Sequence[SimJob], capacity: int, load: float) -> list[SimJob]:
    """The jobs with submit times stretched or squeezed so that their device-seconds offer `load` of
    `capacity` devices over the span of their submissions."""
    if not jobs:
        return []
    demand = sum(j.runtime_s * j.spec.gpus * j.spec.replicas for j in jobs)
    span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs) or 1.0
    factor = demand / (load * capacity * span)
    first = min(j.submit_s for j in jobs)
    return [SimJob(j.job_id, (j.submit_s - first) * factor, j.runtime_s, j.spec) for j in jobs]


def across_rings(cluster: Cluster, placements: Sequence[ReplicaPlacement]) -> int:
    """Replicas whose NPUs span two HCCS rings though their count fits one."""
    return sum(1 for p in placements if len(p.gpu_indices) <= accelerator(p.model).group_size
               and len(groups_held(cluster.nodes[p.node], p.gpu_indices)) > 1)


HOLD_AFTER_S = math.inf  # no hold: any waiting job that fits starts (pass --hold-after-s for one)
TRIES_PER_EVENT = 64  # waiting GPU jobs tried at one end: a backlog of thousands would cost minutes and start no more


def stranded_for_four(cluster: Cluster) -> int:
    """Free NPUs of ring models that no 4-NPU replica could use: those outside a ring with 4 free."""
    out = 0
    for node in cluster.nodes.values():
        if not node.online:
            continue
        rings: dict[int, int] = {}
        for gpu in node.gpus:
            size = accelerator(gpu.model).group_size
            if kind_of(gpu.model) == NPU and size == 4 and gpu.free_milli == FULL and gpu.healthy:
                rings[group_of(gpu, size)] = rings.get(group_of(gpu, size), 0) + 1
        out += sum(free % 4 for free in rings.values())
    return out


class _Run:
    """One placement order's run: the event loop's state."""

    def __init__(self, policy: str, nodes: Sequence[NodeSpec], jobs: Sequence[SimJob], hold_after_s: float) -> None:
        self.policy, self.jobs, self.hold_after_s = policy, jobs, hold_after_s
        self.cluster = Cluster()
        for node in nodes:
            self.cluster.register(node)
        self.placer = Placer(self.cluster, typical=typical_shapes(j.spec for j in jobs))
        self.figures = PolicyFigures(policy, npu_jobs=sum(j.npu for j in jobs), gpu_jobs=sum(not j.npu for j in jobs))
        self.npus = sum(1 for n in nodes for g in n.gpus if kind_of(g.model) == NPU)
        self.last_arrival = max((j.submit_s for j in jobs), default=0.0)
        self.events: list[tuple[float, int, int]] = [(j.submit_s, 1, i) for i, j in enumerate(jobs)]
        heapq.heapify(self.events)  # (time, 0 an end / 1 an arrival, job)
        self.waiting: list[int] = []
        self.running: dict[int, tuple[ReplicaPlacement, ...]] = {}
        self.busy = 0
        self.now = 0.0

    def advance(self, at: float) -> None:
        """Count the time up to `at` (within the arrival window) at the cluster's current use."""
        span = max(0.0, min(at, self.last_arrival) - min(self.now, self.last_arrival)) / 3600
        self.figures.busy_npu_h += self.busy * span
        if span:
            self.figures.stranded_npu_h += stranded_for_four(self.cluster) * span
        self.now = at

    def start(self, w: int, placed: tuple[ReplicaPlacement, ...]) -> None:
        job = self.jobs[w]
        self.running[w] = placed
        heapq.heappush(self.events, (self.now + job.runtime_s, 0, w))
        if not job.npu:
            self.figures.gpu_started += 1
            return
        self.figures.npu_started += 1
        self.figures.across_rings += across_rings(self.cluster, placed)
        self.figures.waits.setdefault(job.spec.gpus, []).append(self.now - job.submit_s)
        self.busy += job.spec.gpus * job.spec.replicas

    def try_start(self, tried: list[int]) -> None:
        """Start what fits of `tried` (jobs of one kind), in order; once the oldest waiting job of that kind is held
        for, nothing passes it; of GPU jobs at most TRIES_PER_EVENT are tried (the rest wait for the next event)."""
        started: set[int] = set()
        npu = bool(tried) and self.jobs[tried[0]].npu
        oldest = next((w for w in self.waiting if self.jobs[w].npu == npu), None)
        held = oldest is not None and self.now - self.jobs[oldest].submit_s >= self.hold_after_s
        for w in tried if npu else tried[:TRIES_PER_EVENT]:
            job = self.jobs[w]
            if held and w != oldest:
                break
            if npu and job.spec.gpus * job.spec.replicas > self.npus - self.busy:
                continue  # more than is free: no need to ask the placer
            placed = self.placer.place_gang(job.spec, policy=self.policy if job.npu else "fgd")
            if isinstance(placed, tuple):
                started.add(w)
                self.start(w, placed)
            elif job.npu and job.spec.gpus >= 4 and self.npus - self.busy >= job.spec.gpus * job.spec.replicas:
                self.figures.blocked_by_rings.add(w)
        if started:
            self.waiting = [w for w in self.waiting if w not in started]

    def run(self, progress: Callable[[str], None] | None) -> PolicyFigures:
        while self.events:
            at, kind, index = heapq.heappop(self.events)
            self.advance(at)
            if kind == 0:  # an end frees devices of one kind: only waiting jobs of that kind may start now
                placements = self.running.pop(index)
                self.cluster.release(placements)
                self.busy -= sum(len(p.gpu_indices) for p in placements if kind_of(p.model) == NPU)
                self.try_start([w for w in self.waiting if self.jobs[w].npu == self.jobs[index].npu])
            else:  # an arrival frees nothing: only it may start
                self.waiting.append(index)
                self.try_start([index])
                if progress is not None and index % 5000 == 0:
                    progress(f"{self.policy}: {index:,} of {len(self.jobs):,} jobs arrived")
        self.figures.window_h = self.last_arrival / 3600
        return self.figures


def run_policy(policy: str, nodes: Sequence[NodeSpec], jobs: Sequence[SimJob],
               progress: Callable[[str], None] | None = None, hold_after_s: float = HOLD_AFTER_S) -> PolicyFigures:
    """Every job through the cluster in virtual time, NPUs placed by `policy`."""
    return _Run(policy, nodes, jobs, hold_after_s).run(progress)


def shuffle_ties(jobs: list[SimJob], seed: int) -> list[SimJob]:
    """Jobs in submit order, those submitted at the same second in a seeded order (reproducible)."""
    rng = random.Random(seed)
    return sorted(jobs, key=lambda j: (j.submit_s, rng.random()))


# The NPU counts of a richer mix than Philly's (93 % single-device jobs), with how often each is asked.
MIXED_SIZES = {1: 0.45, 2: 0.30, 4: 0.15, 8: 0.10}


def philly_npu_jobs(path: str, limit: int, sizes: dict[int, float] | None = None, seed: int = 1) -> list[SimJob]:
    """The first `limit` jobs of a Philly trace as NPU jobs (npu_count), submit times from the first; with
    `sizes`, each job's count drawn from it instead (seeded), its submit time and runtime kept."""
    from libs.sim.trace_model import read_trace

    rng = random.Random(seed)
    out = []
    for job in read_trace(Path(path), limit=limit).jobs:
        gpus = rng.choices(list(sizes), list(sizes.values()))[0] if sizes else job.gpus
        replicas, each = npu_count(gpus)
        spec = JobSpec(team="npu", queue="npu", name=job.job_id, replicas=replicas, gpus=each,
                       gpu_models=(NPU_MODEL,), cpu_milli=4000 * each, memory_mib=32768 * each)
        out.append(SimJob(f"npu-{job.job_id}", job.submit_s, job.runtime_s, spec))
    return out


def openb_gpu_jobs(path: str, limit: int) -> list[SimJob]:
    """The first `limit` GPU pods of an openb pod list (by creation time) as GPU jobs."""
    import csv

    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["num_gpu"]) > 0 and row["deletion_time"] and row["creation_time"]:
                rows.append(row)
    rows.sort(key=lambda r: (int(r["creation_time"]), r["name"]))
    rows = rows[:limit]
    first = int(rows[0]["creation_time"]) if rows else 0
    out = []
    for row in rows:
        count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        spec = JobSpec(team="gpu", queue="gpu", name=row["name"], gpus=count if milli >= 1000 else 1,
                       gpu_milli=milli if milli < 1000 else 0, cpu_milli=int(row["cpu_milli"]),
                       memory_mib=int(row["memory_mib"]),
                       gpu_models=(row["gpu_spec"].split("|")[0],) if row["gpu_spec"] else ())
        runtime = max(1.0, float(int(row["deletion_time"]) - int(row["creation_time"])))
        out.append(SimJob(row["name"], float(int(row["creation_time"]) - first), runtime, spec))
    return out
