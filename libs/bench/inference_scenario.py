"""The inference benchmark's world: a day of diurnal load on three inference services sharing a 64-GPU
cluster with a backlog of preemptible training jobs. Pure: a seed and a time scale in, values out; the
runners (virtual time, or the real services on NATS) do the I/O.

The serving queue's nominal quota covers the services' peak; in the valleys the training queue borrows what
the services leave idle and gives it back (preempted, checkpointing) when the load rises again.
Times are in day seconds; `time_scale` compresses them (720: a day in two minutes), and the autoscaling
windows are compressed with them, because the services judge time on the log's clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from contracts import Autoscaling, JobSpec, NodeSpec, ServiceSpec
from libs.nodes.sim import parse_cluster_csv
from libs.sim.declare import redeclared

DAY_S = 86_400.0
NODES = 8
GPUS_PER_NODE = 8
RACKS = 4
SERVING, TRAINING, COHORT = "serving", "training", "pool"
SERVING_TEAM, TRAINING_TEAM = "web", "ml"


def cluster_csv() -> str:
    rows = ["sn,cpu_milli,memory_mib,gpu,model,gpu_memory_mib,nvlink,rack"]
    for i in range(NODES):
        rows.append(f"inf-{i},128000,1048576,{GPUS_PER_NODE},A100,81920,8,r{i % RACKS}")
    return "\n".join(rows) + "\n"


def nodes() -> list[NodeSpec]:
    return parse_cluster_csv(cluster_csv(), "inference cluster")


TOTAL_GPUS = NODES * GPUS_PER_NODE

def policy_toml(time_scale: float) -> str:
    """Queues and settings; the starvation limit (4 hours of the day) compressed like every other time."""
    return f"""
[settings]
preempt_min_remaining_s = 0.0
starvation_after_s = {4 * 3600 / time_scale}

[[queues]]
name = "{COHORT}"
team = "{COHORT}"

[[queues]]
name = "{SERVING}"
team = "{SERVING_TEAM}"
parent = "{COHORT}"
nominal_gpus = 40

[[queues]]
name = "{TRAINING}"
team = "{TRAINING_TEAM}"
parent = "{COHORT}"
nominal_gpus = 24
"""


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """Requests per second over the day: a trough, a peak at `peak_hour`, a smooth (raised cosine) swing."""

    trough: float
    peak: float
    peak_hour: float

    def at(self, day_s: float) -> float:
        phase = 2 * math.pi * (day_s / DAY_S - self.peak_hour / 24)
        return self.trough + (self.peak - self.trough) * (1 + math.cos(phase)) / 2


@dataclass(frozen=True, slots=True)
class ServicePlan:
    spec: ServiceSpec
    curve: LoadCurve


def services(time_scale: float) -> list[ServicePlan]:
    """Three services of different shapes and rhythms; windows compressed by `time_scale`."""

    def scaling(target: float) -> Autoscaling:
        # HPA's defaults in day time: act on a rise at once; let a fall settle for 10 minutes.
        return Autoscaling(metric="requests_per_s", target_per_replica=target, tolerance=0.1,
                           scale_up_window_s=0.0, scale_down_window_s=600.0 / time_scale)

    def replica(gpus: int, gpu_milli: int = 0, gpu_memory_mib: int = 0) -> JobSpec:
        return JobSpec(team=SERVING_TEAM, queue=SERVING, priority="production-inference", workload="inference",
                       cpu_milli=4000, memory_mib=16384, gpus=gpus, gpu_milli=gpu_milli,
                       gpu_memory_mib=gpu_memory_mib)

    return [
        ServicePlan(ServiceSpec(name="chat", replica=replica(gpus=1), min_replicas=2, max_replicas=18,
                                autoscaling=scaling(100.0)), LoadCurve(150.0, 1500.0, 14.0)),
        ServicePlan(ServiceSpec(name="embed", replica=replica(gpus=1, gpu_milli=500, gpu_memory_mib=40960),
                                min_replicas=1, max_replicas=16, autoscaling=scaling(200.0)),
                    LoadCurve(200.0, 2400.0, 11.0)),
        ServicePlan(ServiceSpec(name="rank", replica=replica(gpus=2), min_replicas=1, max_replicas=8,
                                autoscaling=scaling(50.0)), LoadCurve(40.0, 350.0, 20.0)),
    ]


def training_backlog(seed: int, gpu_hours: float = 3 * TOTAL_GPUS * 24, declare: str = "oracle") -> list[JobSpec]:
    """Preemptible, checkpointing training jobs worth `gpu_hours` (day time): more than the day can run, so
    whatever the services leave idle has takers. Each declares its runtime exactly (`oracle`) or as `declare`
    says (libs/sim/declare.py)."""
    rng = random.Random(seed)
    jobs: list[JobSpec] = []
    total = 0.0
    while total < gpu_hours:
        gpus = rng.choice((1, 1, 1, 2, 2, 4))
        hours = rng.uniform(1.0, 6.0)
        spec = JobSpec(team=TRAINING_TEAM, queue=TRAINING, priority="training", gpus=gpus, cpu_milli=8000 * gpus,
                       memory_mib=65536 * gpus, duration_s=round(hours * 3600, 1), checkpoint_interval_s=900.0,
                       name=f"train-{len(jobs)}")
        jobs.append(redeclared(spec, declare, seed, key=spec.name))
        total += gpus * hours
    return jobs


def report_times(period_s: float) -> list[float]:
    """Day times of the load reports."""
    return [i * period_s for i in range(int(DAY_S // period_s) + 1)]
