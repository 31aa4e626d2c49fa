"""A synthetic history for benchmarks: four teams submitting a mix of whole-GPU, fractional and multi-GPU
jobs of three priorities to a cluster, as world inputs for the virtual-time pipeline."""

from __future__ import annotations

import random
from pathlib import Path

from contracts import EventBase, JobSpec, NodeRegistered, QueuePolicyChanged, QueueSpec, SubmitJob
from libs.nodes.sim import load_cluster_csv

TEAMS = {"research": 16, "product": 12, "platform": 8, "demo": 16}


def synthetic_inputs(cluster_csv: str | Path, jobs: int, seed: int = 1, rate_per_s: float = 2.0) -> list[EventBase]:
    rng = random.Random(seed)
    inputs: list[EventBase] = [NodeRegistered(id=f"node-{i}", ts=0.0, source="node-telemetry", node=n)
                               for i, n in enumerate(load_cluster_csv(cluster_csv))]
    inputs += [QueuePolicyChanged(id=f"queue-{q}", ts=0.0, source="operator", version=1,
                                  queue=QueueSpec(name=q, team=q, nominal_gpus=gpus)) for q, gpus in TEAMS.items()]
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(rate_per_s)
        team = rng.choice(sorted(TEAMS))
        priority = rng.choice(["batch", "training", "urgent"])
        shape = rng.random()
        if shape < 0.3:
            spec = JobSpec(team=team, queue=team, gpus=1, gpu_milli=rng.choice([250, 500]), priority=priority,
                           duration_s=rng.uniform(5, 120))
        elif shape < 0.6:
            spec = JobSpec(team=team, queue=team, gpus=1, priority=priority, duration_s=rng.uniform(5, 120))
        else:
            spec = JobSpec(team=team, queue=team, gpus=rng.choice([1, 2, 4]), priority=priority,
                           duration_s=rng.uniform(5, 300))
        inputs.append(SubmitJob(id=f"submit-{i}", ts=t, source="api", job_id=f"job-{i}", spec=spec))
    return inputs
