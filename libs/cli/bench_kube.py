"""`gpusched bench kube`: gpusched beside kube-scheduler on one real API server with 1,000 fake GPU nodes
(libs/bench/kube_run.py): pods bound per second, time from creation to bind, GPUs left unallocated."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from libs.cli.bench_output import console, fmt, interrupt, interruptible, report
from libs.cli.output import add_json_flag


def cmd_kube(args: argparse.Namespace) -> None:
    from libs.bench.kube_run import KubeBenchOptions, run_kube_bench

    opts = KubeBenchOptions(nodes=args.nodes, gpus_per_node=args.gpus_per_node, demand=args.demand,
                            seed=args.seed, timeout_s=args.timeout, data=Path(args.data) if args.data else None)
    signal.signal(signal.SIGTERM, interrupt)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("starting", total=None)

        def show(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        result = interruptible(lambda: run_kube_bench(opts, progress=show))
    report(args, result, kube_table, failed=False)


def kube_table(result: dict[str, Any]) -> Table:
    ours, theirs = result["gpusched"], result["kube-scheduler"]
    table = Table(title=f"{result['pods']:,} GPU pods on {result['nodes']:,} fake nodes of {result['gpus_per_node']} "
                        f"GPUs, one real kube-apiserver (seed {result['seed']}, demand {result['demand']:g}x)")
    for column in ("", "gpusched", "kube-scheduler"):
        table.add_column(column, justify="right" if column else "left")
    rows = (("pods bound", "pods_bound", ""), ("pods bound per second", "pods_per_s", ""),
            ("creation to bind, p50", "bind_latency_p50_ms", " ms"), ("creation to bind, p99", "bind_latency_p99_ms",
                                                                     " ms"),
            ("GPUs unallocated", "gpus_unallocated", ""), ("  of the cluster", "unallocated_pct", " %"),
            ("gangs bound whole", "gangs_whole", ""), ("gangs bound in part", "gangs_partial", ""),
            ("GPUs held by partial gangs", "gpus_in_partial_gangs", ""))
    for label, key, unit in rows:
        table.add_row(label, fmt(ours[key], unit), fmt(theirs[key], unit))
    table.add_row("goal met (more pods/s, fewer GPUs stranded)", str(result["met"]), "")
    return table


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("kube", help="gpusched beside kube-scheduler on one real API server with fake GPU nodes")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--demand", type=float, default=1.1, help="GPUs asked for, as a multiple of the cluster's")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per scheduler at most")
    p.add_argument("--data", help="keep the API server's data and the platform's logs here")
    add_json_flag(p)
    p.set_defaults(func=cmd_kube)
