"""`gpusched bench executor`: one node agent with the process executor runs many short one-GPU jobs
through the six services on real NATS, as Slurm would run a job array; makespan from the first submission
to the last finish. Slurm 22.05 (one slurmd with 64 GPUs, an array of 2,000 `sleep 0.5` jobs) needs about
67 s on a 2-core machine; the ideal is jobs / GPUs x duration (15.6 s)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts import JobFailed, JobFinished, JobRejected, JobSpec, JobStarted, NodeRegistered, SubmitJob
from contracts.codec import decode
from libs.audit.log_reader import read_log_timed
from libs.bench.kueue_run import Counts, cpu_seconds, proc_cpu, watch_progress
from libs.bench.platform import bench_platform
from libs.bus.jetstream import Bus, BusConfig
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.supervisor import Supervisor

SOURCE = "executor-bench"
NODE = "bench-node-0"
SLURM_S = 67.0  # Slurm 22.05 on this kind of machine, same array
POLICY = '[[queues]]\nname = "bench"\nteam = "bench"\n'
ProgressFn = Callable[[int, int, int], None]  # (submitted, final, total)


@dataclass(frozen=True, slots=True)
class ExecutorBenchOptions:
    jobs: int = 2000
    gpus: int = 64
    duration_s: float = 0.5
    timeout_s: float = 300.0
    data: Path | None = None


def run_executor_bench(opts: ExecutorBenchOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    if opts.jobs < 1 or opts.gpus < 1 or opts.duration_s < 0:
        raise ValueError("--jobs and --gpus must be at least 1 and --duration not negative")
    agent: subprocess.Popen[bytes] | None = None
    with bench_platform(opts.data, "exec-bench", POLICY, "sn,cpu_milli,memory_mib,gpu,model\n",
                        {"GPUSCHED_NODE_BACKEND": "agents", "GPUSCHED_TICK_SECONDS": "1"}) as run:
        try:
            with open(run.data / "agent.log", "wb") as agent_log:
                agent = subprocess.Popen(
                    [sys.executable, "-m", "services.agent", "--node", NODE, "--backend", "sim", "--gpus",
                     str(opts.gpus), "--port", str(free_port()), "--workdir", str(run.data / "agent")],
                    env={**os.environ, **run.env}, stdout=agent_log, stderr=subprocess.STDOUT)
            result = asyncio.run(_drive(BusConfig(url=run.env["NATS_URL"]), run.sup, run.servers, agent, opts,
                                        progress or (lambda *_: None)))
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(timeout=15)
    return result


async def _drive(config: BusConfig, sup: Supervisor, servers: list[EmbeddedServer], agent: subprocess.Popen[bytes],
                 opts: ExecutorBenchOptions, progress: ProgressFn) -> dict[str, Any]:
    bus = await Bus.connect(config, name="gpusched-bench")
    try:
        await _wait_for_node(bus, agent)
        counts = Counts()
        watcher = asyncio.create_task(watch_progress(bus, counts))
        cpu_before = cpu_seconds(sup, servers) | _agent_cpu(agent)
        spec = JobSpec(team="bench", queue="bench", gpus=1, command=("sleep", f"{opts.duration_s:g}"),
                       duration_s=opts.duration_s)
        ids = [f"exec-{i:06d}" for i in range(opts.jobs)]
        now = time.time()
        await bus.publish([SubmitJob(id=derived_id(SOURCE, "submit", j), ts=now, source=SOURCE, correlation_id=j,
                                     job_id=j, spec=spec) for j in ids])
        counts.submitted = len(ids)
        deadline = time.monotonic() + opts.timeout_s
        while time.monotonic() < deadline and len(counts.final) < len(ids):
            sup.restart_dead()
            progress(counts.submitted, len(counts.final), len(ids))
            await asyncio.sleep(0.25)
        progress(counts.submitted, len(counts.final), len(ids))
        cpu_after = cpu_seconds(sup, servers) | _agent_cpu(agent)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        raw = await read_log_timed(bus)
    finally:
        await bus.close()
    figures = _figures([(at, decode(data)) for _, at, data in raw], set(ids), opts)
    figures["cpu_s"] = {k: round(cpu_after.get(k, 0.0) - v, 1) for k, v in sorted(cpu_before.items())}
    return figures


async def _wait_for_node(bus: Bus, agent: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"the node agent exited with code {agent.returncode}; see agent.log")
        if any(isinstance(decode(d), NodeRegistered) for _, _, d in await read_log_timed(bus)):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the node agent never registered its node")


def _figures(log: list[tuple[float, Any]], ids: set[str], opts: ExecutorBenchOptions) -> dict[str, Any]:
    """Makespan from the first submission stored to the last job's end stored, from the log alone."""
    submitted = [at for at, e in log if isinstance(e, SubmitJob) and e.job_id in ids]
    ends = {e.job_id: (at, e) for at, e in log if isinstance(e, JobFinished | JobFailed | JobRejected)
            and e.job_id in ids}
    starts = {e.job_id: at for at, e in log if isinstance(e, JobStarted) and e.job_id in ids}
    first = min(submitted)
    last = max((at for at, _ in ends.values()), default=first)
    makespan = last - first
    ideal = round(opts.jobs / opts.gpus * opts.duration_s, 2)  # every GPU busy all the time
    waits = sorted(starts[j] - first for j in starts)
    return {
        "jobs": opts.jobs, "gpus": opts.gpus, "duration_s": opts.duration_s,
        "finished": sum(1 for _, e in ends.values() if isinstance(e, JobFinished) and e.exit_code == 0),
        "failed": sum(1 for _, e in ends.values() if not (isinstance(e, JobFinished) and e.exit_code == 0)),
        "unfinished": len(ids) - len(ends),
        "makespan_s": round(makespan, 2), "jobs_per_s": round(opts.jobs / makespan, 1) if makespan else None,
        "ideal_s": ideal, "efficiency_pct": round(100 * ideal / makespan, 1) if makespan else None,
        "slurm_s": SLURM_S, "last_start_s": round(waits[-1], 2) if waits else None,
        "events": len(log),
    }


def _agent_cpu(agent: subprocess.Popen[bytes]) -> dict[str, float]:
    cpu = proc_cpu(agent.pid)
    return {} if cpu is None else {"agent": cpu}
