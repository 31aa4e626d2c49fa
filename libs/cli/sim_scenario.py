"""`gpusched sim scenario FILE [--check] [--json]`: a scenario file through the real deciders in virtual time,
its decisions as a timeline; with --check, the guarantees and the file's expectations decide the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from contracts import ClockTick, EventBase, JobPlaced, PreemptionDecided
from libs.cli.output import add_json_flag
from libs.sim.guarantee_check import ViolationLike
from libs.sim.scenario import ScenarioRun, run_scenario
from libs.sim.scenario_model import load_scenario

_DETAIL_FIELDS = ("code", "reason", "exit_code", "queue", "gpu_milli", "borrowed_milli", "checkpoint", "message")


def describe(event: EventBase) -> str:
    """The part of an event a reader of the timeline wants: where, why, how much."""
    node = getattr(event, "node", None)
    parts = [f"node {node.name}: {len(node.gpus)} GPUs" if hasattr(node, "gpus") else f"node {node}"] if node else []
    if hasattr(event, "spec") and event.spec is not None:
        spec = event.spec
        size = f"{spec.gpu_milli} milli" if spec.gpu_milli else spec.mig_profile or f"{spec.gpus} GPUs"
        parts.append(f"{spec.queue}: {spec.replicas} x {size}")
    if hasattr(event, "queue") and not isinstance(event.queue, str):
        parts.append(f"queue {event.queue.name}")
    for name in _DETAIL_FIELDS:
        value = getattr(event, name, None)
        if value not in (None, "", 0) and isinstance(value, str | int | float):
            parts.append(f"{name}={value}")
    if isinstance(event, JobPlaced):
        parts.append("on " + ", ".join(f"{p.node}{list(p.gpu_indices)}" for p in event.placements))
    if isinstance(event, PreemptionDecided):
        parts.append("victims " + ", ".join(v.job_id for v in event.victims))
    return " ".join(parts)


def jobs_of(event: EventBase) -> list[str]:
    jobs = [j for j in (getattr(event, "job_id", None), getattr(event, "preemptor_id", None)) if j]
    return jobs + [v.job_id for v in getattr(event, "victims", ())]


def violation_dict(v: ViolationLike) -> dict[str, Any]:
    return {"guarantee": v.guarantee, "seq": v.seq, "jobs": list(v.jobs), "detail": v.detail}


def failures(run: ScenarioRun) -> list[str]:
    """Why --check fails: unmet expectations, and every violation unless the file states which it expects."""
    out = list(run.unmet)
    if run.scenario.expect.violations is None:
        out += [f"violated {v.guarantee} at seq {v.seq} (jobs {', '.join(v.jobs) or 'none'}): {v.detail}"
                for v in run.violations]
    return out


def as_json(run: ScenarioRun, ticks: bool) -> dict[str, Any]:
    start = run.scenario.settings.start
    events = [{"seq": seq, "at": round(e.ts - start, 6), **msgspec.to_builtins(e)}
              for seq, e in run.log if ticks or not isinstance(e, ClockTick)]
    return {"scenario": run.scenario.name, "end_at": round(run.end - start, 6), "events": events,
            "violations": [violation_dict(v) for v in run.violations], "unmet_expectations": run.unmet}


def print_timeline(run: ScenarioRun, ticks: bool) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a file or a pipe: wide enough that details are not folded
    start = run.scenario.settings.start
    table = Table(title=f"scenario {run.scenario.name}" if run.scenario.name else None)
    for column in ("seq", "at (s)", "event", "source", "jobs", "detail"):
        table.add_column(column, justify="right" if column in ("seq", "at (s)") else "left")
    broken = {v.seq for v in run.violations}
    for seq, e in run.log:
        if ticks or not isinstance(e, ClockTick):
            table.add_row(str(seq), f"{e.ts - start:g}", type(e).__name__, e.source, ", ".join(jobs_of(e)),
                          describe(e), style="red" if seq in broken else None)
    console.print(table)
    for v in run.violations:
        console.print(f"[red]violated {v.guarantee}[/red] at seq {v.seq} (jobs {', '.join(v.jobs)}): {v.detail}")
    for line in run.unmet:
        console.print(f"[red]unmet[/red]: {line}")


def cmd_scenario(args: argparse.Namespace) -> None:
    path = Path(args.file)
    run = run_scenario(load_scenario(path), path.parent, replay=args.check)
    if getattr(args, "json", False):
        print(json.dumps(as_json(run, args.ticks), indent=2))
    else:
        print_timeline(run, args.ticks)
    if args.check:
        problems = failures(run)
        if problems:
            print(f"{path}: {problems[0]}", file=sys.stderr)
            sys.exit(1)


def add_parser(ssub: argparse._SubParsersAction) -> None:
    p = ssub.add_parser("scenario", help="run a scenario file (YAML) through the deciders in virtual time")
    p.add_argument("file", help="scenario file, see docs/scenarios.md")
    p.add_argument("--check", action="store_true",
                   help="exit 1 at the first violated guarantee (determinism included: the run's own decision "
                        "log replayed through the deciders) or unmet expectation")
    p.add_argument("--ticks", action="store_true", help="show the clock ticks too")
    add_json_flag(p, help="one JSON document: events, violations")
    p.set_defaults(func=cmd_scenario)
