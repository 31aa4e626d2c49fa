"""`gpusched bench kueue-baseline`: Kueue's scheduler performance scenario through the real platform."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from libs.cli.bench_output import console, fmt, interrupt, interruptible, report
from libs.cli.output import add_json_flag
from libs.runtime.settings import REPO_ROOT
from libs.sim.declare import DECLARATIONS

# Read in place from the shared data next to the repository; never copied into it.
DEFAULT_GENERATOR = REPO_ROOT.parent / "shared" / "data" / "kueue-baseline" / "generator.yaml"


def cmd_kueue_baseline(args: argparse.Namespace) -> None:
    from libs.bench.kueue_run import BenchOptions, run_bench

    if args.virtual:
        _virtual(args)
        return
    opts = BenchOptions(generator=Path(args.generator), scale=args.scale, timeout_s=args.timeout,
                        data=Path(args.data) if args.data else None, gpus_per_node=args.gpus_per_node,
                        replica_gpus=args.replica_gpus, declare=args.declare)
    if not opts.generator.exists():
        raise FileNotFoundError(f"generator {opts.generator} not found (--generator PATH)")
    signal.signal(signal.SIGTERM, interrupt)  # stop the platform and its servers on SIGTERM too
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        starting = progress.add_task("starting NATS, Redis and the six services", total=None)
        tasks = {name: progress.add_task(name, total=None, visible=False)
                 for name in ("submitted", "quota reserved", "finished")}

        def show(submitted: int, reserved: int, final: int, total: int) -> None:
            progress.update(starting, visible=False)
            for task, done in zip(tasks.values(), (submitted, reserved, final), strict=True):
                progress.update(task, completed=done, total=total, visible=True)

        result = interruptible(lambda: run_bench(opts, progress=show))
    report(args, result, comparison_table, failed=bool(result["timed_out"]))


def cmd_executor(args: argparse.Namespace) -> None:
    from libs.bench.executor_run import ExecutorBenchOptions, run_executor_bench

    opts = ExecutorBenchOptions(jobs=args.jobs, gpus=args.gpus, duration_s=args.duration, timeout_s=args.timeout,
                                data=Path(args.data) if args.data else None)
    signal.signal(signal.SIGTERM, interrupt)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("starting NATS, Redis, the six services and the node agent", total=None)

        def show(submitted: int, final: int, total: int) -> None:
            progress.update(task, description="jobs finished", completed=final, total=total)

        result = interruptible(lambda: run_executor_bench(opts, progress=show))
    report(args, result, executor_table, failed=bool(result["unfinished"]))


def executor_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"{result['jobs']} x sleep {result['duration_s']:g} s on {result['gpus']} GPUs, one agent")
    for c in ("", "gpusched", "Slurm 22.05", "ideal"):
        table.add_column(c)
    # Slurm was measured on the default array only (2,000 x 0.5 s on 64 GPUs).
    slurm = (result["jobs"], result["gpus"], result["duration_s"]) == (2000, 64, 0.5)
    table.add_row("makespan", f"{result['makespan_s']} s", f"~{result['slurm_s']:g} s" if slurm else "n/a",
                  f"{result['ideal_s']:g} s")
    table.add_row("jobs/s", str(result["jobs_per_s"]), f"{result['jobs'] / result['slurm_s']:.1f}" if slurm else "n/a",
                  f"{result['jobs'] / result['ideal_s']:.1f}" if result["ideal_s"] else "")
    table.add_row("finished / failed / unfinished",
                  f"{result['finished']} / {result['failed']} / {result['unfinished']}", "", "")
    return table


def cmd_chaos(args: argparse.Namespace) -> None:
    from libs.bench.chaos_run import ChaosOptions, ChaosProgress, failed, run_chaos

    opts = ChaosOptions(jobs=args.jobs, seed=args.seed, kill_every_s=args.kill_every, window_s=args.window,
                        time_scale=args.time_scale, timeout_s=args.timeout, data=Path(args.data) if args.data else None)
    signal.signal(signal.SIGTERM, interrupt)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console, transient=True) as progress:
        accepted = progress.add_task("starting", total=None, note="NATS, Redis and the six services")
        final = progress.add_task("final", total=None, visible=False, note="")

        def show(p: ChaosProgress) -> None:
            progress.update(accepted, description="accepted", completed=p.accepted, total=p.total, note=p.phase)
            progress.update(final, completed=p.final, total=p.total, visible=True,
                            note=f"kills {p.kills}, NATS restarts {p.nats_restarts}, Redis flushes {p.redis_flushes}")

        result = interruptible(lambda: run_chaos(opts, progress=show))
    report(args, result, chaos_table, failed=failed(result))


def chaos_table(result: dict[str, Any]) -> Table:
    from libs.bench.chaos_run import FAIL_KEYS

    table = Table(title=f"{result['jobs']:,} jobs under faults: {result['kills']} kills, {result['nats_restarts']} "
                        f"NATS restart(s), {result['redis_flushes']} Redis flush(es), {result['wall_s']} s")
    table.add_column("check")
    table.add_column("count", justify="right")
    for key in FAIL_KEYS:
        mark = "[red]" if result[key] else "[green]"
        table.add_row(key.replace("_", " "), f"{mark}{result[key]:,}")
    for key in ("preemptions", "evictions", "events", "finished_before_started", "refused_valid"):
        table.add_row(key.replace("_", " "), f"{result[key]:,}")
    table.add_row("states", ", ".join(f"{k} {v:,}" for k, v in result["states"].items()))
    return table


def cmd_inference(args: argparse.Namespace) -> None:
    from libs.bench.inference_run import InferenceBenchOptions, failed, run_inference_bench
    from libs.bench.inference_virtual import run_day

    if args.virtual:
        with console.status("a day through the deciders in virtual time"):
            result = run_day(seed=args.seed, declare=args.declare)
        report(args, result, inference_table, failed=failed(result))
        return
    opts = InferenceBenchOptions(time_scale=args.time_scale, report_every_s=args.report_every, seed=args.seed,
                                 data=Path(args.data) if args.data else None, declare=args.declare)
    signal.signal(signal.SIGTERM, interrupt)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("starting NATS, Redis and the six services", total=24.0, note="")

        def show(hour: float, note: str) -> None:
            progress.update(task, description=f"day {hour:4.1f} h", completed=hour, note=note)

        result = interruptible(lambda: run_inference_bench(opts, progress=show))
    report(args, result, inference_table, failed=failed(result))


def inference_table(result: dict[str, Any]) -> Table:
    mode = "virtual time, deciders only" if result["mode"] == "virtual" else (
        f"real services on NATS, a day in {result['wall_s']:g} s")
    table = Table(title=f"Inference services and training on 64 GPUs over a day ({mode})")
    for c in ("", "measured", "target"):
        table.add_column(c)
    unit = "day-s" if result["mode"] == "virtual" else "s"
    table.add_row("scale-up p50 / p99 (decision to ready)",
                  f"{result['scale_up_p50_s']} / {result['scale_up_p99_s']} {unit} ({result['scale_ups']} scale-ups)",
                  "p99 <= 2 s")
    table.add_row("service time below desired replicas", f"{result['below_desired_pct']} %", "<= 1 %")
    table.add_row("cluster GPU allocation", f"{result['gpu_allocation_pct']} %", ">= 90 %")
    table.add_row("GPU-hours: training (batch) / inference",
                  f"{result['batch_gpu_hours']} / {result['inference_gpu_hours']}", "")
    table.add_row("training jobs preempted (valleys taken back)", str(result["preempted_jobs"]), "")
    if "replay_mismatches" in result:
        table.add_row("decisions replayed from the log / mismatches",
                      f"{result['decisions_checked']:,} / {result['replay_mismatches']}", "0 mismatches")
    return table


def cmd_throughput(args: argparse.Namespace) -> None:
    from libs.bench.throughput_run import DEFAULT_CLUSTER, StepProgress, ThroughputOptions, run_throughput

    opts = ThroughputOptions(cluster=Path(args.cluster) if args.cluster else DEFAULT_CLUSTER, rate=args.rate,
                             duration_s=args.duration, search=args.search,
                             search_step_s=args.step_duration, search_max=args.search_max,
                             p99_bound_ms=args.p99_bound_ms, http_share=args.http_share,
                             off_path_nice=args.nice_off_path,
                             profile_dir=Path(args.profile) if args.profile else None,
                             data=Path(args.data) if args.data else None)
    signal.signal(signal.SIGTERM, interrupt)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("starting NATS, Redis and the six services", total=None, note="")

        def show(p: StepProgress) -> None:
            progress.update(task, description=p.phase, completed=p.submitted, total=p.total or None,
                            note=f"placed {p.placed:,}")
            if p.result is not None:
                r = p.result
                verdict = "sustained" if r["sustained"] else "not sustained"
                progress.console.print(f"{r['rate']:>7g} jobs/s offered: {fmt(r['placed_per_s'])} placed/s, "
                                       f"p50 {fmt(r['p50_ms'])} ms, p99 {fmt(r['p99_ms'])} ms, backlog at end "
                                       f"{r['backlog_at_end']:,}, all services caught up after "
                                       f"{fmt(r['caught_up_s'])} s: {verdict}")

        result = interruptible(lambda: run_throughput(opts, progress=show))
    report(args, result, throughput_table, failed=result["placed"] < result["jobs"])


def throughput_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"Throughput: {result['rate']:g} jobs/s for {result['duration_s']:g} s on {result['nodes']:,} "
                        f"nodes, {result['gpus']:,} GPUs, six services on NATS")
    for c in ("", "measured", "target"):
        table.add_column(c)
    table.add_row("placed / submitted", f"{result['placed']:,} / {result['submitted']:,}", "")
    table.add_row("placed per second (steady window)", fmt(result["placed_per_s"]), f">= {result['rate']:g}")
    table.add_row("submit-to-placed p50 / p99 / max",
                  f"{fmt(result['p50_ms'])} / {fmt(result['p99_ms'])} / {fmt(result['max_ms'])} ms",
                  "p99 <= 250 ms at 500 jobs/s")
    table.add_row("p99 per hop: admission / quota / placement",
                  " / ".join(f"{fmt(result['stages_ms'][h]['p99_ms'])}" for h in ("admission", "quota", "placement"))
                  + " ms", "")
    table.add_row("backlog when the arrivals stopped", f"{result['backlog_at_end']:,} jobs, drained in "
                                                       f"{fmt(result['drain_s'])} s", "")
    table.add_row("every service caught up", f"{fmt(result['caught_up_s'])} s after the arrivals stopped", "")
    table.add_row("events in the log per job", f"{result['events_per_job']:.2f}", "")
    table.add_row("CPU ms per job", ", ".join(f"{k} {v:g}" for k, v in result["cpu_ms_per_job"].items()), "")
    table.add_row("highest sustained rate", fmt(result["max_sustained_jobs_per_s"], " jobs/s")
                  if result["search"] else "(--search)", ">= 1,000 jobs/s")
    return table


def _virtual(args: argparse.Namespace) -> None:
    from libs.bench.kueue_metrics import published_figures
    from libs.bench.kueue_virtual import run_virtual_bench

    generator = Path(args.generator)
    with Progress(TextColumn("[bold]{task.description}"), TextColumn("{task.completed} events"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("deciding in virtual time", total=None)
        result = run_virtual_bench(generator, args.scale, args.gpus_per_node, args.replica_gpus,
                                   progress=lambda n: progress.update(task, completed=n), declare=args.declare)
    readme = generator.parent / "README.md"
    result["kueue"] = published_figures(readme.read_text()) if readme.exists() else {}
    result["timed_out"] = False
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(comparison_table(result))


def comparison_table(result: dict[str, Any]) -> Table:
    kueue: dict[str, Any] = result.get("kueue", {})
    kueue_tta: dict[str, float] = kueue.get("time_to_admission_s", {})
    mode = ", virtual time: deciders only" if result.get("mode") == "virtual" else ""
    table = Table(title=f"Kueue baseline scenario (scale {result['scale']:g}, {result['gpus_per_node']}-GPU nodes, "
                        f"{result.get('replica_gpus', 1)}-GPU replicas){mode}")
    for column in ("", "gpusched", "Kueue (published)"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row("wall time", fmt(result["wall_time_s"], " s"), fmt(kueue.get("wall_time_s"), " s"))
    for cls in sorted(set(result["time_to_admission_s"]) | set(kueue_tta)):
        p50 = result["time_to_admission_p50_s"].get(cls)
        p90 = result["time_to_admission_p90_s"].get(cls)
        ours = fmt(result["time_to_admission_s"].get(cls), " s")
        if p50 is not None:
            ours = f"{ours} mean (p50 {p50:.1f}, p90 {p90:.1f})"
        table.add_row(f"time to admission, {cls}", ours, fmt(kueue_tta.get(cls), " s"))
    table.add_row("least-used queue's usage", fmt(result["min_queue_usage_pct"], " %"),
                  fmt(kueue.get("min_queue_usage_pct"), " %"))
    table.add_row("jobs completed / submitted", f"{result['jobs_completed']:,} / {result['jobs_submitted']:,}", "")
    for label, key in (("evictions", "evictions"), ("preemptions", "preemptions"),
                       ("quota violations", "quota_violations"), ("events in the log", "events")):
        table.add_row(label, fmt(result[key]), "")
    if "submit_lag_max_s" in result:
        table.add_row("submission lag, max", fmt(result["submit_lag_max_s"], " s"), "")
    cpu = result.get("cpu_s") or result.get("decider_s") or {}
    if cpu:
        table.add_row("CPU s per process" if "cpu_s" in result else "CPU s per decider",
                      ", ".join(f"{name} {seconds:g}" for name, seconds in cpu.items()), "")
    if result.get("decisions"):
        table.add_row("decisions (per decider CPU second)",
                      f"{result['decisions']:,} ({result['decisions_per_s']:,})", "")
        table.add_row("cost of one decision", fmt(result["us_per_decision"], " us"), "")
    if result["timed_out"]:
        table.add_row("[red]timed out[/red]", "not every job reached a final state", "")
    return table


def add_command(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="published scheduler benchmarks through the real platform")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    p = bsub.add_parser("kueue-baseline", help="Kueue's scheduler performance baseline (15,000 workloads)")
    p.add_argument("--generator", default=str(DEFAULT_GENERATOR), help="Kueue generator.yaml")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workloadsSet's count (at least 1)")
    p.add_argument("--data", help="keep NATS, Redis, service logs and the generated policy here (default: a "
                                  "temporary folder, removed afterwards)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every job to be final")
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="GPUs of each simulated node; a request larger than a node becomes a gang")
    p.add_argument("--replica-gpus", type=int, default=1,
                   help="GPUs per replica (1: a request is a gang of 1-GPU replicas, so any free GPU holds a "
                        "piece, as any quota unit does in Kueue's node-less test; 0: shaped as on real nodes)")
    p.add_argument("--virtual", action="store_true",
                   help="the deciders alone in virtual time (no bus, zero-latency pipeline): what the rules achieve")
    p.add_argument("--declare", choices=DECLARATIONS, default="oracle",
                   help="what each job tells the deciders of its runtime (libs/sim/declare.py); it runs its "
                        "scenario runtime whatever it declares (default: oracle, the exact runtime, as Kueue's)")
    add_json_flag(p)
    p.set_defaults(func=cmd_kueue_baseline)
    from libs.cli.bench_sweep import add_parser as add_queue_sweep

    add_queue_sweep(bsub)
    from libs.cli.bench_kube import add_parser as add_kube

    add_kube(bsub)
    p = bsub.add_parser("executor", help="one node agent runs many short one-GPU jobs as processes (vs Slurm)")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=64, help="GPUs of the simulated node the agent exposes")
    p.add_argument("--duration", type=float, default=0.5, help="each job runs `sleep DURATION`")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--data", help="keep NATS, Redis, the service and agent logs here (default: a temporary folder)")
    add_json_flag(p)
    p.set_defaults(func=cmd_executor)
    p = bsub.add_parser("chaos", help="jobs from three teams while services are killed, NATS restarted and Redis "
                                      "flushed: nothing lost, duplicated or over-allocated")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1, help="the workload and the choice of services to kill")
    p.add_argument("--kill-every", type=float, default=3.0, help="seconds between two service kills")
    p.add_argument("--window", type=float, help="seconds over which the jobs are submitted (default: 30 a second, "
                                                 "at least 10 s)")
    p.add_argument("--time-scale", type=float, default=4.0,
                   help="the simulated executor runs each job its declared 1-4 s divided by this")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for every job to be final")
    p.add_argument("--data", help="keep NATS, Redis and the service logs here (default: a temporary folder)")
    add_json_flag(p)
    p.set_defaults(func=cmd_chaos)
    p = bsub.add_parser("inference", help="a day of diurnal load on three autoscaled inference services beside "
                                          "preemptible training, 64 simulated GPUs")
    p.add_argument("--time-scale", type=float, default=720.0, help="day seconds per wall second (720: a day in 2 min)")
    p.add_argument("--report-every", type=float, default=0.25, help="wall seconds between a service's load reports")
    p.add_argument("--seed", type=int, default=1, help="the training backlog's shapes and lengths")
    p.add_argument("--declare", choices=DECLARATIONS, default="oracle",
                   help="what each training job tells the deciders of its runtime (libs/sim/declare.py); it runs its "
                        "planned runtime whatever it declares (default: oracle, the exact runtime)")
    p.add_argument("--virtual", action="store_true",
                   help="the deciders alone in virtual time (no bus, zero-latency pipeline): what the rules achieve")
    p.add_argument("--data", help="keep NATS, Redis and the service logs here (default: a temporary folder)")
    add_json_flag(p)
    p.set_defaults(func=cmd_inference)
    p = bsub.add_parser("throughput", help="short jobs at a steady rate on the openb cluster (1,213 nodes): placed "
                                           "jobs per second, submit-to-placed latency; --search for the highest rate")
    p.add_argument("--cluster", help="node list CSV, openb format (default: "
                                     "../shared/data/openb/openb_node_list_gpu_node.csv, read in place)")
    p.add_argument("--rate", type=float, default=500.0, help="jobs per second offered")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    p.add_argument("--search", action="store_true",
                   help="then find the highest rate sustained (p99 under --p99-bound-ms, >= 95 %% of it placed)")
    p.add_argument("--step-duration", type=float, default=5.0, help="seconds of arrivals per search step")
    p.add_argument("--search-max", type=float, default=4000.0, help="the highest rate the search tries")
    p.add_argument("--p99-bound-ms", type=float, default=1000.0, help="p99 submit-to-placed of a sustained rate")
    p.add_argument("--http-share", type=float, default=0.0, help="share of jobs submitted through POST /v1/jobs")
    p.add_argument("--nice-off-path", type=int, default=None, metavar="N",
                   help="run accounting, preemption and node-telemetry at nice N: on a machine with fewer cores "
                        "than busy processes, the path to a placement gets the CPU first (default: the platform's "
                        "GPUSCHED_OFF_PATH_NICE, 10; 0: all services at one priority)")
    p.add_argument("--profile", help="py-spy every service during the main step; collapsed stacks go here")
    p.add_argument("--data", help="keep NATS, Redis and the service logs here (default: a temporary folder)")
    add_json_flag(p)
    p.set_defaults(func=cmd_throughput)
