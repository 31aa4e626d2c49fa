"""`gpusched bench queue-sweep`: the cost of one decision as the queue count grows, from 30 to 3,000 queues at
the same job rate and load (the Kueue-format generators of libs/bench/generators/), in virtual time or through
the six services on NATS."""

from __future__ import annotations

import argparse
import json
import signal
from functools import partial
from pathlib import Path
from typing import Any

from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from libs.cli.bench_output import console, interrupt, interruptible
from libs.cli.output import add_json_flag
from libs.runtime.settings import REPO_ROOT

GENERATORS = REPO_ROOT / "libs" / "bench" / "generators"
SWEEP = (30, 300, 3000)
TARGET = 2.0  # one decision at the most queues may cost at most this many times one at the fewest


def cmd_queue_sweep(args: argparse.Namespace) -> None:
    from libs.bench.kueue_run import BenchOptions, run_bench
    from libs.bench.kueue_virtual import run_virtual_bench

    signal.signal(signal.SIGTERM, interrupt)
    runs: list[dict[str, Any]] = []
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        for queues in SWEEP:
            generator = GENERATORS / f"queues-{queues}.yaml"
            task = progress.add_task(f"{queues} queues, {'virtual time' if args.virtual else 'six services on NATS'}")
            if args.virtual:
                result = run_virtual_bench(generator)
            else:
                options = BenchOptions(generator=generator, timeout_s=args.timeout)
                result = interruptible(partial(run_bench, options))
            progress.remove_task(task)
            runs.append(summary(queues, generator, result))
    ratio = runs[-1]["us_per_decision"] / runs[0]["us_per_decision"] if runs[0]["us_per_decision"] else 0.0
    out = {"mode": "virtual" if args.virtual else "live", "runs": runs, "ratio": round(ratio, 2), "target": TARGET,
           "met": ratio <= TARGET}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        console.print(table(out))


def summary(queues: int, generator: Path, result: dict[str, Any]) -> dict[str, Any]:
    cpu = result.get("cpu_s") or result.get("decider_s") or {}
    return {"queues": queues, "generator": str(generator.relative_to(REPO_ROOT)), "wall_time_s": result["wall_time_s"],
            "cpu_s": cpu, "time_to_admission_s": result["time_to_admission_s"], "decisions": result["decisions"],
            "decisions_per_s": result["decisions_per_s"], "us_per_decision": result["us_per_decision"],
            "jobs_completed": result["jobs_completed"], "quota_violations": result["quota_violations"],
            "guarantee_violations": result["guarantee_violations"]}


def table(out: dict[str, Any]) -> Table:
    # (Columns: seconds of quota's and of all four deciders' CPU, mean time to admission per class, the cost of
    # one decision, quota and guarantee violations.)
    t = Table(title=f"One decision as queues grow ({out['mode']}): {out['ratio']:g}x from the fewest to the most "
                    f"queues (target <= {out['target']:g}x: {'met' if out['met'] else 'NOT met'})")
    for column in ("queues", "wall s", "quota s", "all s", "wait s", "decisions", "us", "bad"):
        t.add_column(column, justify="right")
    for r in out["runs"]:
        deciders = sum(v for k, v in r["cpu_s"].items() if k in ("admission", "quota", "placement", "preemption"))
        t.add_row(f"{r['queues']:,}", f"{r['wall_time_s']:.1f}", f"{r['cpu_s'].get('quota', 0.0):g}",
                  f"{deciders:.2f}", "/".join(f"{v:.1f}" for v in r["time_to_admission_s"].values()),
                  f"{r['decisions']:,}", f"{r['us_per_decision']:.1f}",
                  f"{r['quota_violations']}+{r['guarantee_violations']}")
    return t


def add_parser(bsub: argparse._SubParsersAction) -> None:
    p = bsub.add_parser("queue-sweep", help="the cost of one decision at 30, 300 and 3,000 queues (same job rate "
                                            "and load)")
    p.add_argument("--virtual", action="store_true", help="the deciders alone in virtual time (seconds, not minutes)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every job of a live run")
    add_json_flag(p)
    p.set_defaults(func=cmd_queue_sweep)
