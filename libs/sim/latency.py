"""How long the placement service's decider takes to decide one job on a large cluster: the real
PlacementDecider, fed NodeRegistered, JobSubmitted and QuotaReserved events as the log would."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np

from contracts import JobSubmitted, NodeRegistered, QuotaReserved
from libs.core.kernel.decider import run_decider
from libs.core.placement.decider import PlacementDecider
from libs.nodes.sim import load_cluster_csv
from libs.sim.fgd import load_pods


def decide_latency(pods_csv: str | Path, nodes_csv: str | Path, jobs: int = 3000, seed: int = 42
                   ) -> dict[str, float]:
    decider = PlacementDecider()
    seq = 0
    for node in load_cluster_csv(nodes_csv):
        if node.gpus:
            seq += 1
            run_decider(decider, NodeRegistered(id=f"n{seq}", ts=0.0, source="bench", node=node), seq)
    pods = [p for p in load_pods(pods_csv) if p.spec.gpus > 0]
    rng = random.Random(seed)
    timings = []
    placed = 0
    for i in range(jobs):
        spec = rng.choice(pods).spec
        job_id = f"job-{i}"
        seq += 1
        run_decider(decider, JobSubmitted(id=f"s{i}", ts=float(i), source="bench", job_id=job_id, spec=spec), seq)
        seq += 1
        started = time.perf_counter()
        out = run_decider(decider, QuotaReserved(id=f"r{i}", ts=float(i), source="bench", job_id=job_id,
                                                 queue=spec.queue, gpu_milli=0), seq)
        timings.append(time.perf_counter() - started)
        placed += any(type(e).__name__ == "JobPlaced" for e in out)
    ms = np.array(timings) * 1000
    return {"jobs": jobs, "placed": placed, "median_ms": round(float(np.median(ms)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3), "nodes": len(decider.cluster.nodes)}
