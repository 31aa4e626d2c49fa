"""A trace's jobs through the platform's own deciders in virtual time (libs/sim/pipeline.py), in one set-up,
and each job's fate read back out of the log; or through a textbook policy (libs/sim/textbook.py).

The world: each team's share as nodes of 8 GPUs (one pool: a team's quota, not its nodes, is what it owns)
and one leaf queue per team with its share as nominal quota.
- `partitioned`: no cohort, so nothing is lent: a team waits for its own quota.
- `shared`: one cohort, so idle quota is lent; a team under its nominal with work waiting reclaims it from
  borrowers after `reclaim_after_s` (the queue's `reclaim_after_s`);
- `pooled`: no team quota at all, one queue of the whole cluster whose users are the teams (its round robin by
  GPUs held goes team by team): what the shared set-up's guarantees cost, measured against it;
- `-las` after any of them: each queue orders its jobs by least attained service
  (libs/core/kernel/attained_service.py), a job
  that has held more than LAS_THRESHOLD_GPU_HOURS behind, and preempted for, those that have held less.

Every job is of priority class `batch` (preemptible, one class for all so that only quota decides who
waits), checkpoints every CHECKPOINT_INTERVAL_S (30 min, a common interval for training jobs) and does not
save on a stop signal: its checkpoint write is scripted (`sim/checkpoint-s`) to outlast its class's grace,
so a preempted run is stopped at the end of the grace and keeps its last periodic checkpoint. That is the
cost a reclaim has: the work since that checkpoint (`JobOutcome.lost_gpu_s`).

A job of more GPUs than a node (8) is a gang of replicas, each as large as divides both the job and the node
(16 -> 2 x 8, 12 -> 3 x 4, 24 -> 3 x 8; libs/bench/kueue_scenario.gang_shape): the GPU count is the trace's.

What the scheduler is told of a job's runtime (`declare`): none, oracle or noisy, as libs/sim/declare.py makes
them; the simulated executor always runs a job for its actual runtime.

A job that can never fit its set-up (more GPUs than its team's quota when partitioned, than the cluster
otherwise) is not submitted: it is `rejected`.

Ticks: the pipeline ticks every `tick_s` (5 s for scenarios); a trace of months uses TRACE_TICK_S (60 s), a
tick that time-driven decisions (reclaim after 600 s, nomination lapses) still see to the minute, and that
makes two months 88k ticks instead of a million.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from contracts import (
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobRejected,
    JobSpec,
    JobStarted,
    NodeRegistered,
    QueuePolicyChanged,
    QueueSpec,
    SubmitJob,
)
from contracts.events import RUNTIME_LIMIT
from contracts.model import GpuSpec, NodeSpec
from libs.bench.kueue_scenario import gang_shape
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.sim import executor as sim_executor
from libs.sim.declare import check_declaration, declared
from libs.sim.pipeline import VirtualWorld
from libs.sim.trace_outcome import JobOutcome, TraceJob
from libs.sim.trace_waits import WaitReasons

GPUS_PER_NODE = 8
GPU_MODEL = "V100"
NODE_CPU_MILLI = 96_000
NODE_MEMORY_MIB = 786_432
TRACE_TICK_S = 60.0
PRIORITY = "batch"
CHECKPOINT_INTERVAL_S = 1800.0
RECLAIM_AFTER_S = 600.0
# The `-las` set-ups' threshold: a job that has held more than a GPU-hour waits behind, and may be preempted
# for, its team's jobs that have held less (Tiresias' first queue boundary is of this order).
LAS_THRESHOLD_GPU_HOURS = 1.0
COHORT = "cluster"
# With nothing else left, the run goes on this long past the last submission plus the longest runtime.
TAIL_S = 7 * 86400.0

POOLS = ("partitioned", "shared")  # the textbook policies' (their shared pool is one queue for everyone)
# The platform's: each team's quota its own, lent in one cohort, or no team quota at all (one queue of the whole
# cluster, teams as its users: what the shared pool costs in fairness, against it)
PLATFORM_POOLS = (*POOLS, "pooled")
POOL = "pool"
TEXTBOOK_POLICIES = ("fifo", "sjf", "srtf")
PREEMPTED = ("preempted", "grace_expired")


def _grace_s() -> float:
    return next(c.checkpoint_grace_s for c in DEFAULT_PRIORITY_CLASSES if c.name == PRIORITY)


assert next(c.preemptible for c in DEFAULT_PRIORITY_CLASSES if c.name == PRIORITY)


@dataclass(frozen=True, slots=True)
class Setup:
    """One way to run the trace: the platform's deciders (`policy` "platform") with a declaration, or a
    textbook policy; on partitioned or shared quota."""

    name: str
    policy: str  # "platform", or a TEXTBOOK_POLICIES entry
    pool: str  # "partitioned" or "shared"
    declare: str = ""  # platform set-ups only
    # platform set-ups: each team's queue orders by least attained service (libs/core/kernel/attained_service.py)
    las: bool = False

    @property
    def baseline(self) -> str:
        """The set-up whose per-team waits this one's are compared with: partitioned, same family."""
        if self.policy == "platform":
            return platform_name("partitioned", self.declare)
        return f"{self.policy}-partitioned"


def platform_name(pool: str, declare: str) -> str:
    return pool if declare == "none" else f"{pool}/{declare}"


def parse_setups(setups: list[str], declares: list[str]) -> list[Setup]:
    """`partitioned`/`shared` (and their `-las` forms) once per declaration, `<policy>-<pool>` as they are;
    ValueError for unknown."""
    for d in declares:
        check_declaration(d)
    out: list[Setup] = []
    for name in setups:
        pool, _, las = name.partition("-")
        if pool in PLATFORM_POOLS and las in ("", "las"):
            out += [Setup(platform_name(name, d), "platform", pool, d, las=bool(las)) for d in declares]
            continue
        policy, _, pool = name.partition("-")
        if policy not in TEXTBOOK_POLICIES or pool not in POOLS:
            known = [*PLATFORM_POOLS, *(f"{p}-las" for p in PLATFORM_POOLS),
                     *(f"{p}-{q}" for p in TEXTBOOK_POLICIES for q in POOLS)]
            raise ValueError(f"unknown set-up {name!r}: use {', '.join(known)}")
        out.append(Setup(name, policy, pool))
    seen: dict[str, None] = {}
    return [s for s in out if not (s.name in seen or seen.setdefault(s.name, None))]


def needs_baseline(setups: list[Setup]) -> list[Setup]:
    """The set-ups with, added before them, the partitioned runs their per-team ratios need."""
    names = {s.name for s in setups}
    extra: list[Setup] = []
    for s in setups:
        if s.baseline not in names:
            names.add(s.baseline)
            extra.append(Setup(s.baseline, s.policy, "partitioned", s.declare))
    return extra + setups


def fits(job: TraceJob, pool: str, team_nodes: dict[str, int], gpus_per_node: int = GPUS_PER_NODE) -> bool:
    """Whether the set-up could ever hold the job at once."""
    limit = team_nodes[job.team] if pool == "partitioned" else sum(team_nodes.values())
    return job.gpus <= limit * gpus_per_node


def job_spec(job: TraceJob, declare: str, seed: int, pooled: bool = False) -> JobSpec:
    """The job as submitted: to its team's queue, or (`pooled`) to the one queue of everyone, as a user named
    after its team (so that the queue's round robin by GPUs held goes team by team)."""
    replicas, per = gang_shape(job.gpus, GPUS_PER_NODE, replica_gpus=0)
    team, user = (POOL, job.team) if pooled else (job.team, "")
    spec = JobSpec(team=team, queue=team, user=user, name=job.job_id, priority=PRIORITY, replicas=replicas,
                   gpus=per, checkpoint_interval_s=CHECKPOINT_INTERVAL_S,
                   labels={sim_executor.SIM_CHECKPOINT_S: f"{_grace_s() + 1:g}"})
    return declared(spec, job.runtime_s, declare, seed, key=job.job_id)


def cluster_nodes(team_nodes: dict[str, int]) -> list[NodeSpec]:
    total = sum(team_nodes.values())
    return [NodeSpec(name=f"node-{i:04d}", cpu_milli=NODE_CPU_MILLI, memory_mib=NODE_MEMORY_MIB,
                     gpus=tuple(GpuSpec(index=g, model=GPU_MODEL, memory_mib=32_768, uuid=f"SIM-{i}-{g}",
                                        nvlink_group=0) for g in range(GPUS_PER_NODE)))
            for i in range(total)]


def world_inputs(jobs: list[TraceJob], team_nodes: dict[str, int], setup: Setup, seed: int = 1,
                 reclaim_after_s: float = RECLAIM_AFTER_S) -> tuple[list[EventBase], list[TraceJob]]:
    """The world's inputs for a platform set-up (inventory and queues just before 0, each job at its submit
    time), and the jobs it could never hold (not submitted)."""
    inputs: list[EventBase] = [NodeRegistered(id=f"trace-node-{n.name}", ts=-10.0, source="node-telemetry",
                                              correlation_id=n.name, node=n) for n in cluster_nodes(team_nodes)]
    shared, pooled = setup.pool == "shared", setup.pool == "pooled"
    las = LAS_THRESHOLD_GPU_HOURS if setup.las else None
    shares = {POOL: sum(team_nodes.values())} if pooled else team_nodes
    for team, nodes in sorted(shares.items()):
        queue = QueueSpec(name=team, team=team, nominal_gpus=nodes * GPUS_PER_NODE,
                          cohort=COHORT if shared else "", reclaim_after_s=reclaim_after_s if shared else 0.0,
                          las_threshold_gpu_hours=las)
        inputs.append(QueuePolicyChanged(id=f"trace-queue-{team}", ts=-5.0, source="operator", correlation_id=team,
                                         queue=queue, version=1))
    rejected = [j for j in jobs if not fits(j, setup.pool, team_nodes)]
    refused = {j.job_id for j in rejected}
    inputs += [SubmitJob(id=f"trace-{j.job_id}", ts=j.submit_s, source="trace", job_id=j.job_id,
                         spec=job_spec(j, setup.declare, seed, pooled)) for j in jobs if j.job_id not in refused]
    return inputs, rejected


def outcomes(log: list[tuple[int, EventBase]], jobs: list[TraceJob], rejected: list[TraceJob]) -> list[JobOutcome]:
    """Each job's fate as the log tells it: first start, end, preemptions and the work they threw away
    (the run's progress when it stopped less the progress its eviction saved, times its GPUs)."""
    first: dict[str, float] = {}
    started: dict[str, float] = {}  # the current run's start
    saved: dict[str, float] = {}
    end: dict[str, float] = {}
    limit_stopped: dict[str, None] = {}
    refused = {j.job_id for j in rejected}
    preemptions: dict[str, int] = {}
    lost: dict[str, float] = {}
    gpus = {j.job_id: j.gpus for j in jobs}
    waits = WaitReasons({j.job_id: j.submit_s for j in jobs if j.job_id not in refused})
    for _, e in log:
        waits.fold(e)
        if isinstance(e, JobStarted):
            first.setdefault(e.job_id, e.ts)
            started[e.job_id] = e.ts
        elif isinstance(e, JobFinished):
            end[e.job_id] = e.ts
        elif isinstance(e, JobFailed):
            end[e.job_id] = e.ts
            if e.reason == RUNTIME_LIMIT:
                limit_stopped[e.job_id] = None
        elif isinstance(e, JobRejected):
            refused.add(e.job_id)
        elif isinstance(e, JobEvicted) and e.source == sim_executor.SOURCE:
            begun = started.pop(e.job_id, None)
            if e.reason in PREEMPTED:
                preemptions[e.job_id] = preemptions.get(e.job_id, 0) + 1
                if begun is not None:
                    progress = saved.get(e.job_id, 0.0) + (e.ts - begun)
                    lost[e.job_id] = lost.get(e.job_id, 0.0) + max(0.0, progress - e.progress_s) * gpus.get(e.job_id, 0)
            saved[e.job_id] = e.progress_s
    return [JobOutcome(job=j, first_start_s=first.get(j.job_id), end_s=end.get(j.job_id),
                       rejected=j.job_id in refused, preemptions=preemptions.get(j.job_id, 0),
                       lost_gpu_s=lost.get(j.job_id, 0.0), limit_stopped=j.job_id in limit_stopped,
                       waited_for=waits.waited.get(j.job_id, {})) for j in jobs]


def horizon_s(jobs: list[TraceJob]) -> float:
    """When the run gives up on what is still waiting: past the last submission and the longest job by TAIL_S,
    and past the whole trace run back to back by none of it."""
    return max(j.submit_s for j in jobs) + max(j.runtime_s for j in jobs) + TAIL_S


def run_platform(jobs: list[TraceJob], team_nodes: dict[str, int], setup: Setup, seed: int = 1,
                 reclaim_after_s: float = RECLAIM_AFTER_S, tick_s: float = TRACE_TICK_S,
                 progress: Callable[[float, float], None] | None = None) -> list[JobOutcome]:
    """The set-up through the deciders; `progress(virtual seconds done, expected)` now and then."""
    inputs, rejected = world_inputs(jobs, team_nodes, setup, seed, reclaim_after_s)
    world = VirtualWorld(tick_s)
    world.feed(inputs)
    world.begin()
    start, limit = world.now, horizon_s(jobs)
    expected = max(j.submit_s + j.runtime_s for j in jobs)
    next_report = 0.0
    while world.busy():
        if world.step() and world.now - start > limit:
            break
        if progress is not None and world.now >= next_report:
            progress(min(world.now, expected), expected)
            next_report = world.now + expected / 500
    if progress is not None:
        progress(expected, expected)
    return outcomes(world.log, jobs, rejected)


def run_setup(setup: Setup, jobs: list[TraceJob], team_nodes: dict[str, int], seed: int = 1,
              reclaim_after_s: float = RECLAIM_AFTER_S, tick_s: float = TRACE_TICK_S,
              progress: Callable[[float, float], None] | None = None) -> list[JobOutcome]:
    if setup.policy == "platform":
        return run_platform(jobs, team_nodes, setup, seed, reclaim_after_s, tick_s, progress)
    return run_textbook_setup(setup, jobs, team_nodes, progress)


def run_textbook_setup(setup: Setup, jobs: list[TraceJob], team_nodes: dict[str, int],
                       progress: Callable[[float, float], None] | None = None) -> list[JobOutcome]:
    try:
        textbook: Any = import_module("libs.sim.textbook")
    except ImportError as err:
        raise RuntimeError(f"set-up {setup.name} needs libs/sim/textbook.py (run_textbook), not there yet") from err
    total = float(len(jobs))

    def done(count: int) -> None:  # run_textbook counts jobs done
        if progress is not None:
            progress(float(count), total)

    return list(textbook.run_textbook(setup.policy, jobs, team_nodes, setup.pool == "shared",
                                      gpus_per_node=GPUS_PER_NODE, progress=done))
