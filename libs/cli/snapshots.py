"""`gpusched snapshots show`: each service's latest snapshot and who leads it; `gpusched snapshots bench`: a
restart's catch-up with a long log, from a snapshot and without (libs/bench/restart_run.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from libs.bus.fencing import Fence
from libs.bus.lease import Lease, lease_store
from libs.bus.snapshot_store import SnapshotStore
from libs.cli.audit import connect_live
from libs.cli.output import add_table_flags, wide
from libs.cli.tables import Column, print_table
from libs.runtime.settings import SERVICES
from libs.runtime.snapshots import EVERY_EVENTS

# The services the restart bench can run (libs/bench/restart_run.py; named here so the help needs no import).
BENCHED = ("admission", "quota", "placement", "preemption", "accounting")

console = Console(stderr=True)


async def _show() -> list[dict[str, Any]]:
    bus = await connect_live("gpusched-cli")
    try:
        try:
            leases = await lease_store(bus, 5.0, create=False)
        except Exception:  # no replica ever ran with GPUSCHED_STANDBY
            leases = None
        rows = []
        for service in SERVICES:
            found = await SnapshotStore(bus, service).manifest()
            row: dict[str, Any] = {"service": service}
            if found is not None:
                m = found[0]
                row.update(sequence=m.seq, bytes=m.size, chain_length=m.chain_length,
                           age_s=round(time.time() - m.taken_at, 1), format=m.format, code=m.code)
            if leases is not None:
                row["leader"] = await Lease(leases, service, "").holder_now()
                row["epoch"] = await Fence(bus, service).current()
            rows.append(row)
        return rows
    finally:
        await bus.close()


def cmd_show(args: argparse.Namespace) -> None:
    rows = asyncio.run(_show())
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print_table("snapshots and leaders", SNAPSHOT_COLUMNS, rows, wide(args))


def _leader(r: dict[str, Any]) -> str:
    return f"{r['leader']} ({r['epoch']})" if r.get("leader") else ("none" if "leader" in r else "-")


def _taken(key: str, show: Callable[[Any], str]) -> Callable[[dict[str, Any]], str | None]:
    """A snapshot's figure, shown by `show`; "none" in the first column of a service without a snapshot."""
    return lambda r: show(r[key]) if key in r else ("none" if key == "sequence" else None)


SNAPSHOT_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("SERVICE", lambda r: r["service"]),
    Column("SEQUENCE", _taken("sequence", lambda v: f"{v:,}"), right=True),
    Column("SIZE", _taken("bytes", lambda v: f"{v:,} B"), right=True),
    Column("DECISIONS", _taken("chain_length", lambda v: f"{v:,}"), right=True),
    Column("AGE", _taken("age_s", lambda v: f"{v:g} s"), right=True),
    Column("LEADER", _leader),
    Column("FORMAT", _taken("format", str), wide=True),
    Column("CODE", _taken("code", str), wide=True),
]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_bench(args: argparse.Namespace) -> None:
    from libs.bench.restart_run import RestartBenchOptions, run_restart_bench

    opts = RestartBenchOptions(events=args.events, services=tuple(s for s in args.services.split(",") if s),
                               every_events=args.every, rate_per_s=args.rate, seed=args.seed,
                               data=Path(args.data) if args.data else None)
    signal.signal(signal.SIGTERM, _interrupt)  # the temporary NATS server is stopped on SIGTERM too
    with console.status("making the log") as status:
        result = run_restart_bench(opts, progress=lambda note: status.update(note))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(bench_title(result), BENCH_COLUMNS, result["services"], wide(args))
    if not result["met"]:
        sys.exit(1)


def bench_title(result: dict[str, Any]) -> str:
    return (f"restart with {result['events']:,} events in the log (snapshot every {result['every_events']:,} "
            f"events; target: caught up in {result['target_s']:g} s)")


# Catch-up and readiness replaying the whole log against starting from a snapshot (SNAP-) by default; what
# the snapshot's catch-up is made of with -o wide.
BENCH_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("SERVICE", lambda r: r["service"]),
    Column("EVENTS", lambda r: f"{r['service_events']:,}", right=True),
    Column("CATCH-UP", lambda r: f"{r['catch_up_s']} s", right=True),
    Column("RATE", lambda r: f"{r['catch_up_events_per_s']:,}/s", wide=True, right=True),
    Column("SNAPSHOT", lambda r: f"{r['snapshot_bytes'] / 1e6:.2f} MB at {r['snapshot_seq']:,}", wide=True),
    Column("TAIL", lambda r: f"{r['tail_events']:,}", wide=True, right=True),
    Column("LOAD", lambda r: f"{r['snapshot_load_s']} s", wide=True, right=True),
    Column("SNAP-CATCH-UP", lambda r: f"{r['catch_up_with_snapshot_s']} s", right=True),
    Column("READY", lambda r: f"{r['ready_s']} s", right=True),
    Column("SNAP-READY", lambda r: f"{r['ready_with_snapshot_s']} s", right=True),
    Column("SAME", lambda r: "yes" if r["same_state"] else "NO"),
]


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshots", help="services' state snapshots and replica leases (docs/reliability.md)")
    ssub = p.add_subparsers(dest="snapshots_command", required=True)
    show = ssub.add_parser("show", help="each service's latest snapshot and leader (NATS_URL, GPUSCHED_STREAM)")
    add_table_flags(show)
    show.set_defaults(func=cmd_show)
    bench = ssub.add_parser("bench", help="catch-up after a restart with a long log, with and without a snapshot")
    bench.add_argument("--events", type=int, default=1_000_000, help="events in the log")
    bench.add_argument("--services", default=",".join(BENCHED),
                       help=f"comma-separated, of {', '.join(BENCHED)}")
    bench.add_argument("--every", type=int, default=EVERY_EVENTS,
                       help="snapshot policy: the snapshot is this many of the service's events old")
    bench.add_argument("--rate", type=float, default=0.15, help="jobs per second of virtual time (demo cluster)")
    bench.add_argument("--seed", type=int, default=1)
    bench.add_argument("--data", help="keep the NATS store here (default: a temporary folder)")
    add_table_flags(bench)
    bench.set_defaults(func=cmd_bench)
