"""`gpusched sim trace`: a job trace replayed in virtual time on a cluster given as teams' shares, through the
platform's deciders and textbook policies, in several set-ups side by side (libs/sim/trace_run.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from libs.cli.output import add_json_flag
from libs.sim.trace_metrics import figures
from libs.sim.trace_model import TraceError, parse_time, read_teams, read_trace
from libs.sim.trace_outcome import JobOutcome
from libs.sim.trace_run import (
    GPUS_PER_NODE,
    RECLAIM_AFTER_S,
    TRACE_TICK_S,
    needs_baseline,
    parse_setups,
    run_setup,
)

console = Console(stderr=True)
DEFAULT_SETUPS = "partitioned,shared,fifo-partitioned,srtf-partitioned,srtf-shared"


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and unit == "s":
        return f"{value / 3600:.2f} h" if value >= 3600 else f"{value:.0f} s"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], Any], str], ...] = (
    ("offered load", lambda f: f["offered_load"], ""),
    ("jobs", lambda f: f["jobs"], ""),
    ("rejected", lambda f: f["rejected"], ""),
    ("unfinished", lambda f: f["unfinished"], ""),
    *((f"JCT {s}", lambda f, s=s: f["jct_s"][s], "s") for s in ("mean", "median", "p99")),
    *((f"queueing delay {s}", lambda f, s=s: f["queueing_delay_s"][s], "s") for s in ("mean", "median", "p99")),
    ("mean bounded slowdown", lambda f: f["mean_bounded_slowdown"], ""),
    ("GPU utilisation", lambda f: f["gpu_utilisation"], ""),
    ("preemptions", lambda f: f["preemptions"], ""),
    ("lost GPU-hours", lambda f: f["lost_gpu_hours"], ""),
    ("run seconds", lambda f: f["wall_seconds"], ""),
)


def run_trace(args: argparse.Namespace) -> dict[str, Any]:
    """Read, run every set-up, and the figures as one JSON-able object (plus the outcomes, for --plot)."""
    team_nodes = read_teams(Path(args.teams), args.scale)
    start = parse_time(args.start, "--start") if args.start else None
    end = parse_time(args.end, "--end") if args.end else None
    trace = read_trace(Path(args.trace), team_nodes, start, end, args.limit)
    try:
        wanted = parse_setups(_list(args.setups), _list(args.declare))
    except ValueError as err:
        raise TraceError(str(err)) from None
    setups = needs_baseline(wanted)
    jobs = list(trace.jobs)
    gpus = sum(team_nodes.values()) * GPUS_PER_NODE
    runs: dict[str, list[JobOutcome]] = {}
    seconds: dict[str, tuple[float, float]] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=args.quiet) as progress:
        for setup in setups:
            task = progress.add_task(f"{setup.name}: {len(jobs):,} jobs", total=1.0)

            def show(done: float, total: float, task: Any = task) -> None:
                progress.update(task, completed=done / total if total else 1.0)

            began, cpu = time.perf_counter(), time.process_time()
            runs[setup.name] = run_setup(setup, jobs, team_nodes, args.seed, args.reclaim_after, args.tick, show)
            seconds[setup.name] = (round(time.perf_counter() - began, 2), round(time.process_time() - cpu, 2))
            progress.update(task, visible=False)
    by_name = {s.name: s for s in setups}
    result: dict[str, Any] = {
        "trace": args.trace, "teams_file": args.teams, "scale": args.scale, "seed": args.seed,
        "window_start": trace.start,
        "window_start_utc": datetime.fromtimestamp(trace.start, UTC).isoformat(timespec="seconds"),
        "window_s": trace.length_s, "jobs": len(jobs),
        "dropped_jobs": sum(trace.dropped_teams.values()), "dropped_teams": trace.dropped_teams,
        "teams": team_nodes, "cluster_gpus": gpus, "tick_s": args.tick, "reclaim_after_s": args.reclaim_after,
        "setups": {},
    }
    for setup in setups:
        base = runs.get(setup.baseline)
        figs = figures(runs[setup.name], gpus, trace.length_s, base,
                       {team: nodes * GPUS_PER_NODE for team, nodes in team_nodes.items()})
        figs.update(policy=setup.policy, pool=setup.pool, declare=setup.declare or None,
                    baseline=setup.baseline, wall_seconds=seconds[setup.name][0],
                    cpu_seconds=seconds[setup.name][1])
        result["setups"][setup.name] = figs
    result["_runs"] = {name: runs[name] for name in by_name}
    return result


def print_tables(result: dict[str, Any]) -> None:
    out = Console()
    out.print(f"{result['jobs']:,} jobs ({result['dropped_jobs']:,} of teams not in the teams file dropped) on "
              f"{result['cluster_gpus']:,} GPUs, window {result['window_s'] / 86400:.1f} days, scale {result['scale']}")
    table = Table(title="set-ups")
    table.add_column("")
    for name in result["setups"]:
        table.add_column(name, justify="right")
    for label, get, unit in ROWS:
        table.add_row(label, *(_fmt(get(f), unit) for f in result["setups"].values()))
    out.print(table)
    teams = Table(title="mean queueing delay per team (x its partitioned figure)")
    teams.add_column("team")
    teams.add_column("nodes", justify="right")
    teams.add_column("asked of quota", justify="right")
    for name in result["setups"]:
        teams.add_column(name, justify="right")
    for team, nodes in result["teams"].items():
        cells = []
        for f in result["setups"].values():
            t = f["teams"].get(team)
            if t is None:
                cells.append("-")
                continue
            ratio = t["ratio_to_partitioned"]
            cells.append(_fmt(t["mean_queueing_delay_s"], "s") + ("" if ratio is None else f" ({ratio:g}x)"))
        first = next((f["teams"][team] for f in result["setups"].values() if "role" in f["teams"].get(team, {})), None)
        role = "-" if first is None else f"{first['asked_of_quota']:g} ({first['role']})"
        teams.add_row(team, str(nodes), role, *cells)
    out.print(teams)
    told = {name: f["mean_wait_by_reason_s"] for name, f in result["setups"].items() if f["mean_wait_by_reason_s"]}
    if told:
        why = Table(title="mean queueing delay by why jobs waited (the reason last told)")
        why.add_column("reason")
        for name in told:
            why.add_column(name, justify="right")
        for reason in dict.fromkeys(r for parts in told.values() for r in parts):
            why.add_row(reason, *(_fmt(parts.get(reason, 0.0), "s") for parts in told.values()))
        out.print(why)


def cmd_trace(args: argparse.Namespace) -> None:
    if args.plot:
        from libs.sim.trace_plot import can_plot

        problem = can_plot()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    try:
        result = run_trace(args)
    except TraceError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    runs = result.pop("_runs")
    if args.plot:
        from libs.sim.trace_plot import plot_delay_cdf

        plot_delay_cdf(runs, Path(args.plot), title=f"{Path(args.trace).name}: queueing delay, scale {args.scale}")
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print_tables(result)


def add_parser(ssub: argparse._SubParsersAction) -> None:
    p = ssub.add_parser("trace", help="replay a job trace on teams' shares: partitioned vs shared quota, and "
                                      "textbook policies, in virtual time")
    p.add_argument("--trace", required=True, help="jobs CSV: Philly's timestamp,duration,num_gpus,gpu_time,cluster "
                                                  "or submit,runtime,gpus,team")
    p.add_argument("--teams", required=True, help="nodes per team CSV: vc,node num (Helios) or team,nodes")
    p.add_argument("--start", help="window start, YYYY-MM-DD[ HH:MM:SS] UTC (default: the first submission)")
    p.add_argument("--end", help="window end, exclusive (default: past the last submission)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply each team's nodes (rounded up, at least 1)")
    p.add_argument("--setups", default=DEFAULT_SETUPS,
                   help="comma-separated: partitioned, shared, pooled (one queue, no team quota), each also with -las "
                        "(least attained service in its queues); fifo|sjf|srtf-partitioned|shared")
    p.add_argument("--declare", default="none", help="what jobs tell the platform's set-ups of their runtime, "
                                                     "comma-separated: none, oracle (duration_s = runtime), noisy "
                                                     "(max_runtime_s = runtime x U[1, 4]); textbook set-ups know "
                                                     "every runtime")
    p.add_argument("--reclaim-after", type=float, default=RECLAIM_AFTER_S,
                   help="shared: seconds a team under its quota waits before reclaiming it")
    p.add_argument("--limit", type=int, help="only the window's first N jobs")
    p.add_argument("--seed", type=int, default=1, help="seed of the noisy declarations")
    p.add_argument("--tick", type=float, default=TRACE_TICK_S, help="virtual clock tick, seconds")
    p.add_argument("--plot", help="draw each set-up's queueing-delay CDF (PNG; needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_json_flag(p)
    p.set_defaults(func=cmd_trace)
