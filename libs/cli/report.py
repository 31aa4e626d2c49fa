"""`gpusched report usage|capacity`: chargeback and the capacity trend, recomputed from the log."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from contracts import EventBase
from contracts.codec import decode
from libs.cli.audit import load_log
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
        _usage_table(rows, by, rates.currency)


def _usage_table(rows: list[dict[str, Any]], by: tuple[str, ...], currency: str) -> None:
    table = Table(title=f"GPU usage by {', '.join(by)}")
    for c in (*by, "GPU-hours", f"cost ({currency})"):
        table.add_column(c, justify="left" if c in by else "right")
    for r in rows:
        table.add_row(*(str(r[k]) for k in by), f"{r['gpu_hours']:.3f}", f"{r['cost']:.2f}")
    table.add_row(*("total" if i == 0 else "" for i in range(len(by))),
                  f"{sum(r['gpu_hours'] for r in rows):.3f}", f"{sum(r['cost'] for r in rows):.2f}")
    Console().print(table)


def cmd_capacity(args: argparse.Namespace) -> None:
    if args.bucket_s <= 0 or args.horizon < 0:
        raise ValueError("--bucket-s must be positive and --horizon not negative")
    report = capacity_report(_events(args.log), bucket_s=args.bucket_s, horizon=args.horizon)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    table = Table(title="peak demand against healthy capacity, per GPU model")
    for c in ("model", "period", "peak demand", "allocated", "capacity"):
        table.add_column(c)
    for m in report["models"]:
        for p in m["periods"][-args.show:]:
            table.add_row(m["model"], p["period"], f"{p['peak_demand']:g}", f"{p['peak_allocated']:g}",
                          str(p["capacity"]))
        last = m["forecast"][-1] if m["forecast"] else None
        if last is not None:
            note = f"exceeds capacity from {m['demand_exceeds_capacity_at']}" if m["demand_exceeds_capacity_at"] \
                else "within capacity"
            table.add_row(m["model"], f"{last['period']} (forecast)", f"{last['peak_demand']:g}", "",
                          f"{m['capacity']} ({note})")
    Console().print(table)


def add_command(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="GPU usage and cost, and the capacity trend, from the log")
    rsub = report.add_subparsers(dest="report_command", required=True)
    p = rsub.add_parser("usage", help="GPU-seconds and cost grouped by team, model, queue, user, project, ...")
    p.add_argument("--from", dest="from_", help="start: Unix seconds or ISO time (default: the log's start)")
    p.add_argument("--to", help="end: Unix seconds or ISO time (default: the log's last event)")
    p.add_argument("--by", default="team", help="comma-separated: team,queue,project,user,model,priority,job")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--rates", help="rates file (default $GPUSCHED_RATES or infra/config/rates.toml)")
    p.add_argument("--log", help="an exported log (gpusched audit export); default: the live stream")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.set_defaults(func=cmd_usage)
    p = rsub.add_parser("capacity", help="daily peak demand against capacity per GPU model, with a forecast")
    p.add_argument("--bucket-s", type=float, default=DAY_S, help="period length in seconds (default a day)")
    p.add_argument("--horizon", type=int, default=7, help="periods to forecast")
    p.add_argument("--show", type=int, default=14, help="most recent periods to print per model")
    p.add_argument("--log", help="an exported log (gpusched audit export); default: the live stream")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_capacity)
