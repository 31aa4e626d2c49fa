"""The chaos benchmark's workload: three teams sharing one cohort on a small simulated cluster, jobs of mixed
shapes and priorities, a few duplicate submissions and cancellations, spread over a submission window. Pure: a
seed in, values out; the runner does the I/O.

Preemption must happen in every run, however fast or slow the machine: how often the random mix needs one
depends on timing (on a slow machine the backlog is admitted in priority order and nothing has to give way).
So the first job holds every T4 GPU for a few seconds at the lowest priority, and an urgent job that needs
T4s arrives halfway through: only an eviction can place it before the holder ends. The hold is short and
bounded: an evicted holder starts again from the beginning, so a hold that spanned a long window would be
evicted again and again and keep the run waiting for it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from contracts import JobSpec
from libs.core.admission.idempotency_keys import job_id_for_key

TEAMS = ("alpha", "beta", "gamma")
COHORT = "org"

# 10 nodes, 50 GPUs of three models: the shapes below all fit, some only on the larger nodes.
CLUSTER_CSV = """sn,cpu_milli,memory_mib,gpu,model
chaos-a100-0,96000,786432,8,A100
chaos-a100-1,96000,786432,8,A100
chaos-a100-2,96000,786432,8,A100
chaos-a100-3,96000,786432,8,A100
chaos-v100-0,64000,262144,4,V100M32
chaos-v100-1,64000,262144,4,V100M32
chaos-v100-2,64000,262144,4,V100M32
chaos-t4-0,32000,131072,2,T4
chaos-t4-1,32000,131072,2,T4
chaos-t4-2,32000,131072,2,T4
"""
NODES = 10
MODELS = ("A100", "V100M32", "T4")

# Three team queues in one cohort: nominal quotas that add up to less than the cluster, borrowing on top,
# and one queue that keeps part of its quota for itself. Preemption may act on jobs of any length.
POLICY_TOML = f"""
[settings]
preempt_min_remaining_s = 0.0
starvation_after_s = 20.0

[[queues]]
name = "{COHORT}"
team = "{COHORT}"

[[queues]]
name = "alpha"
team = "alpha"
parent = "{COHORT}"
nominal_gpus = 16
borrowing_limit_gpus = 8

[[queues]]
name = "beta"
team = "beta"
parent = "{COHORT}"
nominal_gpus = 16
borrowing_limit_gpus = 8
lending_limit_gpus = 8

[[queues]]
name = "gamma"
team = "gamma"
parent = "{COHORT}"
nominal_gpus = 12
borrowing_limit_gpus = 8
"""
QUEUES = 4  # the cohort's parent and the three team queues

# Shares of the workload.
BUS_SHARE = 0.25  # submitted as SubmitJob commands on the bus; the rest through the HTTP API
DUPLICATE_EVERY = 50  # every 50th job is submitted a second time (same idempotency key, or same job id)
CANCEL_EVERY = 97  # and every 97th is cancelled soon after its submission
PRIORITIES = ("batch", "batch", "training", "training", "training", "urgent")
# Jobs per second of the submission window, when the window is not given.
DEFAULT_RATE = 30.0
MIN_WINDOW_S = 10.0
# The preemption probe: the holder (a gang on every T4 GPU) runs for this share of the window but at most
# HOLD_MAX_S wall seconds; the urgent job that needs its GPUs arrives halfway through.
HOLD_SHARE = 0.8
HOLD_MAX_S = 8.0
T4_NODES = 3
T4_GPUS = 2

Via = Literal["http", "bus"]


@dataclass(frozen=True, slots=True)
class Submission:
    index: int
    at_s: float  # after the first submission
    via: Via
    job_id: str  # known in advance: from the idempotency key (HTTP) or chosen by the producer (bus)
    spec: dict[str, Any]  # JobSpec fields, as the HTTP API takes them
    again_at_s: float | None = None  # submitted a second time then
    cancel_at_s: float | None = None  # cancelled then

    def job_spec(self) -> JobSpec:
        return msgspec.convert(self.spec, JobSpec)


def submission_window(jobs: int, window_s: float | None = None) -> float:
    return window_s if window_s is not None else max(MIN_WINDOW_S, jobs / DEFAULT_RATE)


def random_spec(rng: random.Random, i: int) -> dict[str, Any]:
    """One job: fractional, whole-GPU or a two-replica gang; a few pinned to one model; a few seconds long."""
    team = rng.choice(TEAMS)
    spec: dict[str, Any] = {"team": team, "queue": team, "name": f"chaos-{i}", "user": f"u{i % 7}",
                            "priority": rng.choice(PRIORITIES), "duration_s": round(rng.uniform(1.0, 4.0), 2)}
    shape = rng.random()
    if shape < 0.3:
        spec.update(gpus=1, gpu_milli=rng.choice([250, 500, 750]))
    elif shape < 0.88:
        spec.update(gpus=rng.choice([1, 1, 2, 4]))
    else:
        spec.update(gpus=rng.choice([2, 4]), replicas=2)
    if rng.random() < 0.15 and spec["gpus"] <= 2:  # every model has nodes of 2 or more GPUs
        spec["gpu_models"] = [rng.choice(MODELS)]
    return spec


def holder_spec(i: int, hold_s: float) -> dict[str, Any]:
    """Every T4 GPU, at the lowest priority, for `hold_s` job seconds."""
    return {"team": "gamma", "queue": "gamma", "name": f"chaos-{i}-t4-holder", "user": f"u{i % 7}",
            "priority": "batch", "duration_s": round(hold_s, 2), "gpus": T4_GPUS, "replicas": T4_NODES,
            "gpu_models": ["T4"]}


def probe_spec(i: int, duration_s: float) -> dict[str, Any]:
    """An urgent job that only T4s can run: it waits for the holder unless the holder is evicted."""
    return {"team": "gamma", "queue": "gamma", "name": f"chaos-{i}-t4-urgent", "user": f"u{i % 7}",
            "priority": "urgent", "duration_s": duration_s, "gpus": T4_GPUS, "gpu_models": ["T4"]}


def plan(jobs: int, seed: int, window_s: float, time_scale: float = 1.0) -> list[Submission]:
    """The submissions in time order. HTTP ones carry an idempotency key, so that a retry after an error
    (the API down, NATS restarting) can never make a second job; bus ones carry the producer's job id.
    `time_scale`: job seconds per wall second of the executor, so that the holder holds for wall seconds."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0.0, window_s) for _ in range(jobs))
    hold_s = min(window_s * HOLD_SHARE, HOLD_MAX_S)
    probe = next((i for i, at in enumerate(times) if i > 0 and at >= hold_s / 2), None)
    out: list[Submission] = []
    for i, at in enumerate(times):
        spec = random_spec(rng, i)  # drawn for every job, so that the probe leaves the others as they were
        if i == 0:
            spec = holder_spec(i, hold_s * time_scale)
        elif i == probe:
            spec = probe_spec(i, spec["duration_s"])
        via: Via = "bus" if rng.random() < BUS_SHARE else "http"
        if via == "http":
            spec["idempotency_key"] = f"chaos-{seed}-{i}"
            job_id = job_id_for_key(spec["team"], spec["idempotency_key"])
        else:
            job_id = f"chaos-{seed}-bus-{i:05d}"
        again = at + rng.uniform(0.0, 3.0) if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1 else None
        cancel = at + rng.uniform(0.2, 2.0) if i % CANCEL_EVERY == CANCEL_EVERY - 1 else None
        out.append(Submission(i, round(at, 3), via, job_id, spec, again_at_s=again, cancel_at_s=cancel))
    return out
