"""The FGD paper's evaluation protocol (ATC'23) on the openb trace, through the same Placer the placement
service uses. See docs/fgd-protocol-notes.md for the protocol and where our replay differs (the RNG)."""

from __future__ import annotations

import csv
import functools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contracts import JobSpec, NodeSpec
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL
from libs.core.cluster.pairing import fewest_gpus
from libs.core.cluster.shapes import TypicalShapes, typical_shapes
from libs.nodes.sim import load_cluster_csv

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DEFAULT_NODES = SHARED_DATA / "openb" / "openb_node_list_gpu_node.csv"
CHECKPOINTS = (100, 130)


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    spec: JobSpec
    request_milli: int  # num_gpu x gpu_milli: what "arrived" counts
    per_gpu_milli: int  # what the protocol's inflation loop checks


class PodCsvError(ValueError):
    pass


def load_pods(path: str | Path) -> list[Pod]:
    pods = []
    with open(path, newline="") as f:
        for line_no, row in enumerate(csv.DictReader(f), start=2):
            try:
                num, milli = int(row["num_gpu"]), int(row["gpu_milli"])
                models = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
                fraction = num == 1 and 0 < milli < FULL
                spec = JobSpec(team="sim", queue="sim", cpu_milli=int(row["cpu_milli"]),
                               memory_mib=int(row["memory_mib"]), gpu_models=models, gpus=num,
                               gpu_milli=milli if fraction else 0)
            except (KeyError, ValueError, TypeError) as err:
                raise PodCsvError(f"{path}:{line_no}: bad pod row: {err}") from err
            pods.append(Pod(row["name"], spec, num * milli, milli))
    return pods


def inflate(pods: list[Pod], capacity_milli: int, tune: float, rng: random.Random) -> list[Pod]:
    """Shuffle the list, then draw with replacement until the request would pass tune x capacity
    (the protocol checks each drawn pod's per-GPU share against the target); or drop random pods."""
    workload = sorted(pods, key=lambda p: p.name)
    order = list(workload)
    rng.shuffle(order)
    target = tune * capacity_milli
    total = sum(p.request_milli for p in order)
    if total > target:
        while total > target and order:
            total -= order.pop(rng.randrange(len(order))).request_milli
        return order
    while True:
        p = workload[rng.randrange(len(workload))]
        if total + p.per_gpu_milli > target:
            return order
        total += p.request_milli
        order.append(p)


@dataclass
class RunResult:
    seed: int
    pods: int
    placed: int
    curve: dict[int, float]
    seconds: float
    # GPU % that sharing GPUs must leave idle at arrived 100 in any packing of the fractional pods placed (or
    # offered) by then: the linear relaxation's optimum, a lower bound on the unallocated % (see fraction_floor).
    floor_placed: float = 0.0
    floor_offered: float = 0.0


def fraction_floor(fractions: dict[int, int], total_gpus: int) -> float:
    """The GPU % that any packing of these fractional pods leaves idle: GPUs they need at least (linear
    relaxation) minus their share, over the cluster. A GPU holding a fraction cannot take a whole-GPU pod, so
    a run that placed these pods has at least this much unallocated."""
    share = sum(m * c for m, c in fractions.items()) / FULL
    return 100 * (fewest_gpus(fractions.items()) - share) / total_gpus


def discretise(arrived: np.ndarray, used: np.ndarray, total_gpus: int) -> dict[int, float]:
    """The protocol's curve: for each integer arrived %, the mean allocation % over the pods whose rounded
    arrived % equals it (or lies within one of it when none does)."""
    arrive = np.round(arrived / total_gpus / 10)
    alloc = np.round(used / total_gpus / 10, 2)
    curve = {}
    for k in range(0, 131):
        sel = arrive == k
        if not sel.any():
            sel = (arrive >= k - 1) & (arrive <= k + 1)
        if sel.any():
            curve[k] = round(float(alloc[sel].mean()), 2)
    return curve


def run_once(nodes: list[NodeSpec], pods: list[Pod], typical: TypicalShapes, policy: str, seed: int,
             tune: float, progress: Callable[[int], None] | None = None) -> RunResult:
    started = time.perf_counter()
    cluster = Cluster()
    for n in nodes:
        cluster.register(n)
    total_gpus = sum(len(n.gpus) for n in nodes)
    offered = inflate(pods, total_gpus * FULL, tune, random.Random(seed))
    placer = Placer(cluster, typical)
    arrived = np.zeros(len(offered), dtype=np.int64)
    used = np.zeros(len(offered), dtype=np.int64)
    a = u = placed = 0
    offered_fractions: Counter[int] = Counter()  # GPU share -> pods, up to arrived 100
    placed_fractions: Counter[int] = Counter()
    for i, pod in enumerate(offered):
        a += pod.request_milli
        p = placer.place_replica(pod.spec, 0, policy, salt=seed)
        if p is not None:
            placed += 1
            u += pod.request_milli
        if pod.spec.gpu_milli and a <= total_gpus * FULL:
            offered_fractions[pod.spec.gpu_milli] += 1
            if p is not None:
                placed_fractions[pod.spec.gpu_milli] += 1
        arrived[i], used[i] = a, u
        if progress is not None and i % 500 == 0:
            progress(i)
    seconds = time.perf_counter() - started
    return RunResult(seed, len(offered), placed, discretise(arrived, used, total_gpus), seconds,
                     fraction_floor(placed_fractions, total_gpus), fraction_floor(offered_fractions, total_gpus))


@dataclass
class Summary:
    policy: str
    pods_csv: str
    seeds: list[int]
    runs: list[RunResult] = field(default_factory=list)

    def alloc_at(self, k: int) -> float:
        return round(float(np.mean([r.curve[k] for r in self.runs if k in r.curve])), 2)

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "pods": Path(self.pods_csv).name,
            "pods_offered_mean": round(float(np.mean([r.pods for r in self.runs])), 1),
            "seeds": self.seeds,
            "alloc_pct": {str(k): self.alloc_at(k) for k in CHECKPOINTS},
            "unallocated_pct_at_100": round(100 - self.alloc_at(100), 2),
            # The least unallocated % at arrived 100 of any packing of the fractional pods this policy placed
            # by then, and of all those offered by then (linear relaxation: no policy does better with them).
            "fraction_floor_pct_at_100": {
                "placed": round(float(np.mean([r.floor_placed for r in self.runs])), 2),
                "offered": round(float(np.mean([r.floor_offered for r in self.runs])), 2),
            },
            "seconds_per_run": round(float(np.mean([r.seconds for r in self.runs])), 2),
            "curve": {str(k): round(float(np.mean([r.curve.get(k, np.nan) for r in self.runs])), 2)
                      for k in range(0, 131, 10)},
        }


def inflate_size(pods_csv: str | Path, nodes_csv: str | Path, tune: float, seed: int) -> int:
    """How many pods one run offers (for progress bars)."""
    capacity = sum(len(n.gpus) for n in load_cluster_csv(nodes_csv)) * FULL
    return len(inflate(load_pods(pods_csv), capacity, tune, random.Random(seed)))


def simulate(pods_csv: str | Path, nodes_csv: str | Path, policy: str, seeds: list[int], tune: float,
             progress: Callable[[int, int], None] | None = None) -> Summary:
    nodes = [n for n in load_cluster_csv(nodes_csv) if n.gpus]
    pods = load_pods(pods_csv)
    typical = typical_shapes(p.spec for p in pods)
    summary = Summary(policy, str(pods_csv), seeds)
    for seed in seeds:
        report: Callable[[int], None] | None = None
        if progress is not None:
            report = functools.partial(progress, seed)
        summary.runs.append(run_once(nodes, pods, typical, policy, seed, tune, report))
    return summary
