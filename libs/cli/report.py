"""`gpusched report usage|capacity`: chargeback and the capacity trend, recomputed from the log."""

from __future__ import annotations

import argparse
import csv
import json
import operator
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import Progress

from contracts import EventBase
from contracts.codec import decode
from libs.cli.audit import load_log
from libs.cli.output import add_table_flags, wide
from libs.cli.tables import Column, print_table
from libs.reports.capacity import DAY_S, capacity_report
from libs.reports.rates import load_rates
from libs.reports.usage import UsageHistory, parse_by, usage_rows

console = Console(stderr=True)


def time_arg(text: str | None) -> float | None:
    """--from/--to: Unix seconds or an ISO time (a time without a zone is local time)."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"--from/--to take Unix seconds or an ISO time such as 2026-11-30T08:00, not {text!r}"
                         ) from None


def _events(path: str | None) -> Iterator[tuple[int, EventBase]]:
    """The log's events in order, with a progress bar while they are decoded and folded."""
    log = load_log(path)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("folding the log", total=len(log))
        for i, (seq, raw) in enumerate(log):
            yield seq, decode(raw)
            if i % 5000 == 0:
                progress.update(task, completed=i)


def cmd_usage(args: argparse.Namespace) -> None:
    by, rates = parse_by(args.by), load_rates(args.rates)
    since, until = time_arg(args.from_), time_arg(args.to)
    if since is not None and until is not None and until <= since:
        raise ValueError("--to must be later than --from")
    history = UsageHistory.fold(e for _, e in _events(args.log))
    rows = usage_rows(history, by, rates, since, until)
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(json.dumps(rows, indent=2))
    elif fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=[*by, "gpu_seconds", "gpu_hours", "cost"])
        writer.writeheader()
        writer.writerows(rows)
    else:
        total = {**dict.fromkeys(by, ""), by[0]: "total", **{k: sum(r[k] for r in rows) for k in
                                                                ("gpu_seconds", "gpu_hours", "cost")}}
        print_table(f"GPU usage by {', '.join(by)}", usage_columns(by, rates.currency), [*rows, total], wide(args))


def usage_columns(by: tuple[str, ...], currency: str) -> list[Column[dict[str, Any]]]:
    groups: list[Column[dict[str, Any]]] = [Column(key.upper(), operator.itemgetter(key)) for key in by]
    return [*groups,
            Column("GPU-HOURS", lambda r: f"{r['gpu_hours']:.3f}", right=True),
            Column(f"COST-{currency}", lambda r: f"{r['cost']:.2f}", right=True),
            Column("GPU-SECONDS", lambda r: f"{r['gpu_seconds']:.1f}", wide=True, right=True)]


CapacityRow = tuple[dict[str, Any], dict[str, Any], str]  # a model, one of its periods, a note

CAPACITY_COLUMNS: list[Column[CapacityRow]] = [
    Column("MODEL", lambda r: r[0]["model"]),
    Column("PERIOD", lambda r: r[1]["period"]),
    Column("PEAK-DEMAND", lambda r: f"{r[1]['peak_demand']:g}", right=True),
    Column("ALLOCATED", lambda r: None if "peak_allocated" not in r[1] else f"{r[1]['peak_allocated']:g}",
           right=True),
    Column("CAPACITY", lambda r: r[1].get("capacity", r[0]["capacity"]), right=True),
    Column("NOTE", lambda r: r[2], fit="wrap"),
]


def capacity_rows(report: dict[str, Any], show: int) -> list[CapacityRow]:
    """The last `show` periods of each model, then its last forecast period."""
    rows: list[CapacityRow] = []
    for m in report["models"]:
        rows += [(m, p, "") for p in m["periods"][-show:]]
        if m["forecast"]:
            exceeds = m["demand_exceeds_capacity_at"]
            rows.append((m, m["forecast"][-1], f"forecast: exceeds capacity from {exceeds}" if exceeds
                         else "forecast: within capacity"))
    return rows


def cmd_capacity(args: argparse.Namespace) -> None:
    if args.bucket_s <= 0 or args.horizon < 0:
        raise ValueError("--bucket-s must be positive and --horizon not negative")
    report = capacity_report(_events(args.log), bucket_s=args.bucket_s, horizon=args.horizon)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print_table("peak demand against healthy capacity, per GPU model", CAPACITY_COLUMNS,
                capacity_rows(report, args.show), wide(args))


def add_command(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="GPU usage and cost, and the capacity trend, from the log")
    rsub = report.add_subparsers(dest="report_command", required=True)
    p = rsub.add_parser("usage", help="GPU-seconds and cost grouped by team, model, queue, user, project, ...")
    p.add_argument("--from", dest="from_", help="start: Unix seconds or ISO time (default: the log's start)")
    p.add_argument("--to", help="end: Unix seconds or ISO time (default: the log's last event)")
    p.add_argument("--by", default="team",
                   help="comma-separated: team,queue,project,user,model,vendor,kind,priority,job")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--rates", help="rates file (default $GPUSCHED_RATES or infra/config/rates.toml)")
    p.add_argument("--log", help="an exported log (gpusched audit export); default: the live stream")
    add_table_flags(p)  # --json: the same as --format json
    p.set_defaults(func=cmd_usage)
    p = rsub.add_parser("capacity", help="daily peak demand against capacity per GPU model, with a forecast")
    p.add_argument("--bucket-s", type=float, default=DAY_S, help="period length in seconds (default a day)")
    p.add_argument("--horizon", type=int, default=7, help="periods to forecast")
    p.add_argument("--show", type=int, default=14, help="most recent periods to print per model")
    p.add_argument("--log", help="an exported log (gpusched audit export); default: the live stream")
    add_table_flags(p)
    p.set_defaults(func=cmd_capacity)
