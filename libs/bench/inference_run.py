"""`gpusched bench inference`: a day of diurnal load, compressed, on three inference services and a backlog of
preemptible training jobs, through the six real services on real NATS with the simulated executor.

The bench is the world: it submits the backlog, deploys the services, and reports each service's load on
the bus as its gateway would. Everything else is decided by the platform. The figures come from the log
alone, timed by when the server stored each event (an event's own `ts` is its trigger's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from contracts import DeployService, EventBase, ReportServiceLoad, SubmitJob
from contracts.codec import decode
from libs.audit.log_reader import read_log_timed
from libs.audit.replay import DURABLE_OF, replay
from libs.bench import inference_scenario as scenario
from libs.bench.guarantee_figures import guarantee_figures
from libs.bench.inference_metrics import compute_metrics
from libs.bench.kueue_run import cpu_seconds, wait_for_policy_and_nodes
from libs.bench.platform import bench_platform
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.idempotency_keys import job_id_for_key
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.supervisor import Supervisor

SOURCE = "inference-bench"
ProgressFn = Callable[[float, str], None]  # (hour of the day, what is happening)
QUEUES = 3  # the cohort, serving and training


@dataclass(frozen=True, slots=True)
class InferenceBenchOptions:
    # 720: a day in two minutes.
    time_scale: float = 720.0
    # Wall seconds between two load reports of a service.
    report_every_s: float = 0.25
    seed: int = 1
    data: Path | None = None
    declare: str = "oracle"  # what each training job tells the deciders of its runtime (libs/sim/declare.py)


def run_inference_bench(opts: InferenceBenchOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    if opts.time_scale <= 0 or opts.report_every_s <= 0:
        raise ValueError("--time-scale and --report-every must be > 0")
    env = {"GPUSCHED_TIME_SCALE": str(opts.time_scale), "GPUSCHED_TICK_SECONDS": "1"}
    with bench_platform(opts.data, "inference-bench", scenario.policy_toml(opts.time_scale), scenario.cluster_csv(),
                        env) as run:
        return asyncio.run(_drive(BusConfig(url=run.env["NATS_URL"]), run.sup, run.servers, opts,
                                  progress or (lambda *_: None)))


async def _drive(config: BusConfig, sup: Supervisor, servers: list[EmbeddedServer], opts: InferenceBenchOptions,
                 progress: ProgressFn) -> dict[str, Any]:
    bus = await Bus.connect(config, name="gpusched-bench")
    try:
        progress(0.0, "waiting for the cluster")
        await wait_for_policy_and_nodes(bus, QUEUES, scenario.NODES, classes=False)
        cpu_before = cpu_seconds(sup, servers)
        backlog = scenario.training_backlog(opts.seed, declare=opts.declare)
        now = time.time()
        await bus.publish([SubmitJob(id=derived_id(SOURCE, "submit", job_id), ts=now, source=SOURCE,
                                     correlation_id=job_id, job_id=job_id, spec=spec)
                           for i, spec in enumerate(backlog)
                           for job_id in [job_id_for_key(spec.team, f"{SOURCE}-{opts.seed}-{i}")]])
        plans = scenario.services(opts.time_scale)
        start = time.time()
        await bus.publish([DeployService(id=derived_id(SOURCE, "deploy", p.spec.name, start), ts=start, source=SOURCE,
                                         correlation_id=p.spec.name, service=p.spec) for p in plans])
        day_wall = scenario.DAY_S / opts.time_scale
        reports = 0
        while (elapsed := time.time() - start) < day_wall:
            day_s = elapsed * opts.time_scale
            at = time.time()
            await bus.publish([ReportServiceLoad(id=derived_id(SOURCE, "load", p.spec.name, reports), ts=at,
                                                 source=SOURCE, correlation_id=p.spec.name, service=p.spec.name,
                                                 metric=p.spec.autoscaling.metric if p.spec.autoscaling else "",
                                                 value=round(p.curve.at(day_s), 1)) for p in plans])
            reports += 1
            sup.restart_dead()
            progress(day_s / 3600, f"{reports} load reports")
            await asyncio.sleep(max(0.0, start + reports * opts.report_every_s - time.time()))
        end = time.time()
        cpu_after = cpu_seconds(sup, servers)
        progress(24.0, "reading the log")
        # What each service had handled before the log is read: the replay checks its decisions up to there.
        handled = {name: await bus.ack_floor(durable) for name, durable in DURABLE_OF.items()}
        raw = await read_log_timed(bus)
    finally:
        await bus.close()
    # Each event on the server's clock: when it was stored, i.e. decided or reported.
    log: list[EventBase] = [msgspec.structs.replace(e, ts=stored) for _, stored, data in raw
                            for e in [decode(data)]]
    figures = compute_metrics(log, start, end, scenario.TOTAL_GPUS, opts.time_scale, scenario.TRAINING)
    # Every decision of the day, scale decisions included, derived again from the log: the audit's check.
    audit = replay([(seq, data) for seq, _, data in raw], handled=handled)
    figures.update(decisions_checked=audit.decisions_checked, replay_mismatches=len(audit.mismatches),
                   **guarantee_figures([(seq, decode(data)) for seq, _, data in raw]))
    figures.update(mode="real", time_scale=opts.time_scale, declare=opts.declare, seed=opts.seed,
                   wall_s=round(end - start, 1),
                   training_jobs=len(backlog), load_reports=reports * len(plans), events=len(raw),
                   cpu_s={k: round(cpu_after.get(k, 0.0) - v, 1) for k, v in sorted(cpu_before.items())})
    return figures


def failed(result: dict[str, Any]) -> bool:
    """The run's own targets: p99 scale-up <= 2 s, below desired <= 1 %, allocation >= 90 %; and a replay of
    its log re-derives every decision."""
    return (result["scale_up_p99_s"] > 2.0 or result["below_desired_pct"] > 1.0
            or result["gpu_allocation_pct"] < 90.0 or bool(result.get("replay_mismatches")))
