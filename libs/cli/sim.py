"""`gpusched sim fgd`: the FGD paper's protocol on the openb trace, through the service's own Placer."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from libs.cli import sim_npu, sim_scenario, sim_trace
from libs.cli.output import add_json_flag
from libs.core.cluster.scoring import POLICIES
from libs.runtime.settings import DEFAULT_CLUSTER
from libs.sim.fgd import DEFAULT_NODES, inflate_size, simulate
from libs.sim.published import published_unallocated

console = Console(stderr=True)


def parse_seeds(text: str) -> list[int]:
    """"42-51" or "42,43,45" or "42"."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad seeds {text!r}: use 42-51 or 42,43") from None
    return seeds


def cmd_fgd(args: argparse.Namespace) -> None:
    pods_csv, nodes_csv = Path(args.pods), Path(args.nodes)
    for path in (pods_csv, nodes_csv):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found")
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        total = inflate_size(pods_csv, nodes_csv, args.tune, args.seeds[0]) * len(args.seeds)
        task = progress.add_task(f"{args.policy} on {pods_csv.name}", total=total)
        done: dict[int, int] = {}

        def advance(seed: int, offered: int) -> None:
            done[seed] = offered
            progress.update(task, completed=sum(done.values()))

        summary = simulate(pods_csv, nodes_csv, args.policy, args.seeds, args.tune, progress=advance)
    result = summary.as_json()
    published = published_unallocated(pods_csv.stem)
    if published:
        result["published_unallocated_pct_at_100"] = published
    if args.plot:
        from libs.sim.plot import plot_curves

        plot_curves(summary, Path(args.plot))
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result, indent=2))
        return
    console.print(f"[bold]{args.policy}[/bold] on {pods_csv.name}, seeds {args.seeds[0]}-{args.seeds[-1]}, "
                  f"tune {args.tune}: allocated {result['alloc_pct']['100']} % at arrived 100 "
                  f"({result['unallocated_pct_at_100']} % unallocated), {result['alloc_pct']['130']} % at 130; "
                  f"{result['seconds_per_run']} s per run")
    for name, value in (published or {}).items():
        console.print(f"  published {name}: {value} % unallocated")


def cmd_latency(args: argparse.Namespace) -> None:
    from libs.sim.latency import decide_latency

    with console.status("placing jobs through the placement decider..."):
        result = decide_latency(args.pods, args.nodes, args.jobs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(f"{result['jobs']} jobs on {result['nodes']} nodes: median {result['median_ms']} ms, "
                      f"p99 {result['p99_ms']} ms per decision ({result['placed']} placed)")


def cmd_replay_bench(args: argparse.Namespace) -> None:
    from contracts.codec import encode
    from libs.audit.replay import replay
    from libs.sim.pipeline import run_virtual
    from libs.sim.workload import synthetic_inputs

    with console.status(f"making a history of {args.jobs} jobs in virtual time..."):
        run = run_virtual(synthetic_inputs(args.cluster, args.jobs), tick_s=5.0)
        log = [(seq, encode(e)) for seq, e in run.log]
    with console.status(f"replaying {len(log)} events..."):
        report = replay(log, workers=args.workers)
    result = {"jobs": args.jobs, "events": report.events, "decisions_checked": report.decisions_checked,
              "mismatches": len(report.mismatches), "events_per_s": round(report.events_per_s),
              "workers": args.workers}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(f"{result['events']} events, {result['decisions_checked']} decisions checked, "
                      f"{result['mismatches']} mismatches: {result['events_per_s']:,} events/s "
                      f"with {args.workers} worker(s)")


def add_command(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="offline simulations with the platform's own decision code")
    ssub = sim.add_subparsers(dest="sim_command", required=True)
    p = ssub.add_parser("fgd", help="the FGD paper's protocol (ATC'23) on an openb pod list")
    p.add_argument("--pods", required=True, help="pod list CSV, e.g. ../shared/data/openb/openb_pod_list_default.csv")
    p.add_argument("--nodes", default=str(DEFAULT_NODES), help="node list CSV")
    p.add_argument("--policy", default="packing", choices=POLICIES)
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("42-51"))
    p.add_argument("--tune", type=float, default=1.3, help="inflate the workload to this multiple of capacity")
    p.add_argument("--plot", help="draw the allocation curve against the published ones (PNG)")
    add_json_flag(p)
    p.set_defaults(func=cmd_fgd)
    p = ssub.add_parser("latency", help="time the placement decider deciding one job on a large cluster")
    p.add_argument("--pods", required=True, help="pod list CSV to draw jobs from")
    p.add_argument("--nodes", default=str(DEFAULT_NODES))
    p.add_argument("--jobs", type=int, default=3000)
    add_json_flag(p)
    p.set_defaults(func=cmd_latency)
    p = ssub.add_parser("replay-bench", help="make a synthetic history in virtual time and time its replay")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--cluster", default=str(DEFAULT_CLUSTER), help="node list CSV")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4))
    add_json_flag(p)
    p.set_defaults(func=cmd_replay_bench)
    sim_scenario.add_parser(ssub)
    sim_npu.add_parser(ssub)
    sim_trace.add_parser(ssub)
