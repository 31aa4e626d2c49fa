"""Run Kueue's scheduler performance scenario through the real platform: fresh NATS and Redis, the six
services as processes, submissions published on the bus on the scenario's schedule in real time, then the
figures computed from the log. The platform and its servers are stopped whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts import (
    EventBase,
    JobFailed,
    JobFinished,
    JobRejected,
    NodeRegistered,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaReserved,
    SubmitJob,
)
from contracts.codec import decode
from libs.audit.log_reader import read_log_timed
from libs.bench.guarantee_figures import guarantee_figures
from libs.bench.kueue_metrics import compute_metrics, published_figures
from libs.bench.kueue_scenario import (
    GPUS_PER_NODE,
    PlannedJob,
    cluster_csv,
    load_scenario,
    node_count,
    plan_jobs,
    policy_toml,
)
from libs.bench.kueue_virtual import cost_of_decisions
from libs.bench.platform import bench_platform
from libs.bus.jetstream import Bus, BusConfig
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.supervisor import Supervisor

SOURCE = "kueue-bench"
STREAM = "GPUSCHED"
SERVICE_ENV = {"GPUSCHED_TICK_SECONDS": "1", "GPUSCHED_TIME_SCALE": "1", "GPUSCHED_STREAM": STREAM,
               "GPUSCHED_SUBJECT_PREFIX": "gs"}
FINAL_TYPES = (JobFinished, JobFailed, JobRejected)
# (submitted, quota reserved, final, total) job counts.
ProgressFn = Callable[[int, int, int, int], None]


@dataclass(frozen=True, slots=True)
class BenchOptions:
    generator: Path
    scale: float = 1.0
    data: Path | None = None  # None: a temporary folder, removed afterwards
    timeout_s: float = 600.0
    # 8 as in the scenario's description of GPU nodes; 10 tiles the 5-GPU requests without fragmentation.
    gpus_per_node: int = GPUS_PER_NODE
    # GPUs per replica of a request larger than a node (see gang_shape).
    replica_gpus: int = 1
    declare: str = "oracle"  # what each job tells the deciders of its runtime (libs/sim/declare.py)


@dataclass(slots=True)
class Counts:
    submitted: int = 0
    reserved: set[str] = field(default_factory=set)
    final: set[str] = field(default_factory=set)


@dataclass(slots=True)
class SubmitStats:
    max_lag_s: float = 0.0
    lag_sum_s: float = 0.0
    jobs: int = 0


@dataclass(slots=True)
class Backlog:
    """Per durable consumer (= service): the most messages it had not yet handled at one sample."""

    peak: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, pending: int) -> None:
        self.peak[name] = max(self.peak.get(name, 0), pending)


def run_bench(opts: BenchOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    if opts.scale <= 0 or opts.gpus_per_node < 1:
        raise ValueError("--scale must be > 0 and --gpus-per-node >= 1")
    queues = load_scenario(opts.generator, opts.scale)
    jobs = plan_jobs(queues, opts.gpus_per_node, opts.replica_gpus, opts.declare)
    with bench_platform(opts.data, "bench", policy_toml(queues), cluster_csv(queues, opts.gpus_per_node),
                        SERVICE_ENV) as run:
        result = asyncio.run(_drive(BusConfig(url=run.env["NATS_URL"], stream=STREAM), run.sup, run.servers, jobs,
                                    (len(queues), node_count(queues, opts.gpus_per_node)), opts.timeout_s,
                                    progress or (lambda *_: None)))
    readme = opts.generator.parent / "README.md"
    result["kueue"] = published_figures(readme.read_text()) if readme.exists() else {}
    result["scale"] = opts.scale
    result["gpus_per_node"] = opts.gpus_per_node
    result["replica_gpus"] = opts.replica_gpus
    result["declare"] = opts.declare
    return result


async def _drive(config: BusConfig, sup: Supervisor, servers: list[EmbeddedServer], jobs: list[PlannedJob],
                 queues_and_nodes: tuple[int, int], timeout_s: float, progress: ProgressFn) -> dict[str, Any]:
    bus = await Bus.connect(config, name="gpusched-bench")
    try:
        await wait_for_policy_and_nodes(bus, *queues_and_nodes)
        counts, backlog, stats = Counts(), Backlog(), SubmitStats()
        watcher = asyncio.create_task(watch_progress(bus, counts))
        sampler = asyncio.create_task(_sample_backlog(bus, backlog))
        cpu_before = cpu_seconds(sup, servers)
        submitter = asyncio.create_task(_submit_on_schedule(bus, jobs, counts, stats))
        deadline = time.monotonic() + timeout_s
        restarts: list[str] = []
        while time.monotonic() < deadline and not (submitter.done() and len(counts.final) >= len(jobs)):
            if submitter.done() and (err := submitter.exception()) is not None:
                raise err
            restarts += sup.restart_dead()  # crash-only services resume from the log; the run goes on
            progress(counts.submitted, len(counts.reserved), len(counts.final), len(jobs))
            await asyncio.sleep(0.25)
        progress(counts.submitted, len(counts.reserved), len(counts.final), len(jobs))
        timed_out = len(counts.final) < len(jobs)
        cpu_after = cpu_seconds(sup, servers)
        for task in (submitter, watcher, sampler):
            task.cancel()
        await asyncio.gather(submitter, watcher, sampler, return_exceptions=True)
        raw = await read_log_timed(bus)
    finally:
        await bus.close()
    log = [(seq, at, decode(data)) for seq, at, data in raw]
    cpu = {k: cpu_after.get(k, 0.0) - v for k, v in sorted(cpu_before.items())}
    return {**compute_metrics(log), **guarantee_figures([(seq, e) for seq, _, e in log]), "timed_out": timed_out,
            **live_decision_cost(cpu, [e for _, _, e in log]),
            "submit_lag_max_s": round(stats.max_lag_s, 3),
            "submit_lag_mean_s": round(stats.lag_sum_s / stats.jobs, 3) if stats.jobs else None,
            "peak_backlog": dict(sorted(backlog.peak.items())),
            "cpu_s": {k: round(t, 1) for k, t in cpu.items()},
            "service_restarts": restarts}


DECIDERS = ("admission", "quota", "placement", "preemption")


def live_decision_cost(cpu_s: dict[str, float], log: list[EventBase]) -> dict[str, Any]:
    """The cost of one decision through the services: the four deciders' process CPU seconds (receiving,
    decoding, folding, deciding, publishing) over the decisions they logged (events with a chain)."""
    made = Counter(e.source for e in log if e.chain and e.source in DECIDERS)
    return cost_of_decisions({name: cpu_s.get(name, 0.0) for name in DECIDERS}, {name: made[name] for name in DECIDERS})


async def wait_for_policy_and_nodes(bus: Bus, n_queues: int, n_nodes: int, timeout_s: float = 60.0,
                                    classes: bool = True) -> None:
    """Until the queues, the priority classes (`classes`: a policy that keeps the default ones publishes
    none) and every node are in the log: submissions published after them are decided against the
    scenario's policy, in log order, by every service."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events: list[EventBase] = [decode(data) for _, _, data in await read_log_timed(bus)]
        queues = {e.queue.name for e in events if isinstance(e, QueuePolicyChanged)}
        nodes = {e.node.name for e in events if isinstance(e, NodeRegistered)}
        if (len(queues) >= n_queues and len(nodes) >= n_nodes
                and (not classes or any(isinstance(e, PriorityClassesChanged) for e in events))):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the policy ({n_queues} queues) or the cluster ({n_nodes} nodes) never reached the log")


async def _submit_on_schedule(bus: Bus, jobs: list[PlannedJob], counts: Counts, stats: SubmitStats) -> None:
    """Publish each job when it is due, all jobs due at one instant in one pipelined batch. A batch that is
    late (the bus or this loop could not keep up) is published at once and its lag recorded."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    i = 0
    while i < len(jobs):
        delay = t0 + jobs[i].at_ms / 1000 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now_ms = (loop.time() - t0) * 1000
        j = i + 1
        while j < len(jobs) and jobs[j].at_ms <= now_ms:
            j += 1
        batch = jobs[i:j]
        now = time.time()
        await bus.publish([SubmitJob(id=derived_id(SOURCE, "submit", p.job_id), ts=now, source=SOURCE,
                                     correlation_id=p.job_id, job_id=p.job_id, spec=p.spec) for p in batch])
        stored = loop.time()
        for p in batch:
            lag = stored - (t0 + p.at_ms / 1000)
            stats.max_lag_s = max(stats.max_lag_s, lag)
            stats.lag_sum_s += lag
        stats.jobs += len(batch)
        counts.submitted = i = j


async def watch_progress(bus: Bus, counts: Counts) -> None:
    """Follow reservations and final states for the progress display and the end condition."""
    reader = await bus.reader([bus.subject_for_type(t) for t in (QuotaReserved, *FINAL_TYPES)])
    try:
        while True:
            for m in await reader.fetch(2000, timeout=0.5):
                e = decode(m.data)
                if isinstance(e, QuotaReserved):
                    counts.reserved.add(e.job_id)
                elif isinstance(e, FINAL_TYPES):
                    counts.final.add(e.job_id)
    finally:
        await reader.close()


async def _sample_backlog(bus: Bus, backlog: Backlog, every_s: float = 2.0) -> None:
    """How far behind the log each service is, sampled: the service whose backlog grows is the bottleneck."""
    while True:
        with contextlib.suppress(Exception):  # a sample lost to a busy server is not worth failing the run
            for info in await bus.js.consumers_info(bus.config.stream):
                if info.config.durable_name:
                    backlog.add(info.config.durable_name, int(info.num_pending or 0) + int(info.num_ack_pending or 0))
        await asyncio.sleep(every_s)


def cpu_seconds(sup: Supervisor, servers: list[EmbeddedServer]) -> dict[str, float]:
    """CPU time (user + system) of every process of the platform and of this one, from /proc (Linux only)."""
    pids = {name: child.proc.pid for name, child in sup.children.items() if child.proc is not None}
    pids |= {f"{s.name}-server": s.proc.pid for s in servers}
    out = {name: cpu for name, pid in pids.items() if (cpu := proc_cpu(pid)) is not None}
    own = os.times()
    out["bench"] = own.user + own.system
    return out


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # utime and stime are fields 14 and 15 of stat; after the ")" of the command name they are 12 and 13.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
