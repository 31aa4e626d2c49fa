"""A mixed cluster, GPUs and Ascend NPUs, run in virtual time under three ways of placing NPUs: how many NPUs
sit idle while a job waits for a whole ring, when rings are kept whole or not.

The cluster is the openb trace's GPU nodes beside Ascend 910 servers (8 NPUs in two HCCS rings of 4). GPU pods
come from an openb pod list, NPU jobs from the Philly trace (its GPU counts as NPU counts, rounded up to what a
910 server gives one replica: 1, 2, 4 or 8; more than 8 is a gang of 8-NPU replicas). Arrival times are scaled
so that the NPU jobs offer `load` of the NPUs. Jobs wait first come first served with backfill: at every arrival
and end, each waiting job is tried in order, and one that fits starts. Placement is the platform's own
(libs/core/cluster/job_fit.py); only the NPU order changes (libs/core/cluster/device_groups.py):
`gpusched` (the fewest NPUs left unusable, then Volcano's ring order), `volcano` (Ascend for Volcano's
documented order), `ignore_rings` (best fit by node, rings ignored: a replica across two rings would fail when
it starts; it is counted, and let run as if it had not).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contracts import JobSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster.device_groups import group_of
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
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
    policy: str
    npu_jobs: int = 0
    gpu_jobs: int = 0
    npu_started: int = 0
    gpu_started: int = 0
    across_rings: int = 0  # NPU replicas placed across two rings (they would fail when they start)
    idle_while_big_waits_npu_h: float = 0.0  # free NPUs x hours while a job of 4 or more NPUs waited
    busy_npu_h: float = 0.0
    span_h: float = 0.0
    waits: dict[int, list[float]] = field(default_factory=dict)  # NPUs per replica -> waits (s)

    def row(self, npus: int) -> dict[str, float | int | str]:
        mean = {k: sum(v) / len(v) if v else 0.0 for k, v in sorted(self.waits.items())}
        return {"policy": self.policy, "npu_jobs_started": self.npu_started, "gpu_jobs_started": self.gpu_started,
                "replicas_across_rings": self.across_rings,
                "npu_hours_idle_while_a_4_or_8_npu_job_waits": round(self.idle_while_big_waits_npu_h, 1),
                "npu_utilisation": round(self.busy_npu_h / (npus * self.span_h), 4) if self.span_h else 0.0,
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
    out = 0
    for p in placements:
        node = cluster.nodes[p.node]
        size = accelerator(p.model).group_size
        if kind_of(p.model) != NPU or not size or len(p.gpu_indices) > size:
            continue
        if len({group_of(node.gpu(i), size) for i in p.gpu_indices}) > 1:
            out += 1
    return out


def run_policy(policy: str, nodes: Sequence[NodeSpec], jobs: Sequence[SimJob],
               progress: Callable[[str], None] | None = None) -> PolicyFigures:
    """Every job through the cluster in virtual time, NPUs placed by `policy`."""
    cluster = Cluster()
    for node in nodes:
        cluster.register(node)
    placer = Placer(cluster, typical=typical_shapes(j.spec for j in jobs))
    figures = PolicyFigures(policy, npu_jobs=sum(j.npu for j in jobs), gpu_jobs=sum(not j.npu for j in jobs))
    npus = sum(1 for n in nodes for g in n.gpus if kind_of(g.model) == NPU)
    events: list[tuple[float, int, int]] = [(j.submit_s, 1, i) for i, j in enumerate(jobs)]  # (time, 0 end / 1 arrive)
    heapq.heapify(events)
    waiting: list[int] = []
    running: dict[int, tuple[ReplicaPlacement, ...]] = {}
    busy = now = 0.0
    while events:
        at, kind, index = heapq.heappop(events)
        big_waits = any(jobs[w].npu and jobs[w].spec.gpus >= 4 for w in waiting)
        figures.busy_npu_h += busy * (at - now) / 3600
        if big_waits:
            figures.idle_while_big_waits_npu_h += (npus - busy) * (at - now) / 3600
        now = at
        if kind == 0:  # an end frees devices of one kind: only waiting jobs of that kind may start now
            placements = running.pop(index)
            cluster.release(placements)
            busy -= sum(len(p.gpu_indices) for p in placements if kind_of(p.model) == NPU)
            tried = [w for w in waiting if jobs[w].npu == jobs[index].npu]
        else:  # an arrival frees nothing: only it may start
            waiting.append(index)
            tried = [index]
        started: set[int] = set()
        for w in tried:
            placed = placer.place_gang(jobs[w].spec, policy=policy if jobs[w].npu else "fgd")
            if not isinstance(placed, tuple):
                continue
            started.add(w)
            running[w] = placed
            heapq.heappush(events, (now + jobs[w].runtime_s, 0, w))
            job = jobs[w]
            if job.npu:
                figures.npu_started += 1
                figures.across_rings += across_rings(cluster, placed)
                figures.waits.setdefault(job.spec.gpus, []).append(now - job.submit_s)
                busy += job.spec.gpus * job.spec.replicas
            else:
                figures.gpu_started += 1
        if started:
            waiting = [w for w in waiting if w not in started]
        if progress is not None and kind == 1 and index % 1000 == 0:
            progress(f"{policy}: {index} of {len(jobs)} jobs arrived, {len(waiting)} waiting")
    figures.span_h = now / 3600
    return figures


def shuffle_ties(jobs: list[SimJob], seed: int) -> list[SimJob]:
    """Jobs in submit order, those submitted at the same second in a seeded order (reproducible)."""
    rng = random.Random(seed)
    return sorted(jobs, key=lambda j: (j.submit_s, rng.random()))


def philly_npu_jobs(path: str, limit: int) -> list[SimJob]:
    """The first `limit` jobs of a Philly trace as NPU jobs (npu_count), submit times from the first."""
    from libs.sim.trace_model import read_trace

    out = []
    for job in read_trace(Path(path), limit=limit).jobs:
        replicas, each = npu_count(job.gpus)
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
