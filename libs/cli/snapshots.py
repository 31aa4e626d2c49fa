"""`gpusched snapshots show`: each service's latest snapshot and who leads it; `gpusched snapshots bench`: a
restart's catch-up with a long log, from a snapshot and without (libs/bench/restart_run.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from libs.bus.fencing import Fence
from libs.bus.jetstream import Bus
from libs.bus.lease import Lease, lease_store
from libs.bus.snapshot_store import SnapshotStore
from libs.cli.audit import live_bus_config
from libs.runtime.settings import SERVICES
from libs.runtime.snapshots import EVERY_EVENTS

# The services the restart bench can run (libs/bench/restart_run.py; named here so the help needs no import).
BENCHED = ("admission", "quota", "placement", "preemption", "accounting")

console = Console(stderr=True)


async def _show() -> list[dict[str, Any]]:
    bus = await Bus.connect(live_bus_config(), name="gpusched-cli")
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
    table = Table(title="Snapshots and leaders")
    for c in ("service", "snapshot at", "size", "decisions", "age", "leader (epoch)"):
        table.add_column(c)
    for r in rows:
        leader = f"{r['leader']} ({r['epoch']})" if r.get("leader") else ("none" if "leader" in r else "-")
        if "sequence" in r:
            table.add_row(r["service"], f"{r['sequence']:,}", f"{r['bytes']:,} B", f"{r['chain_length']:,}",
                          f"{r['age_s']:g} s", leader)
        else:
            table.add_row(r["service"], "none", "", "", "", leader)
    Console().print(table)


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
        Console().print(bench_table(result))
    if not result["met"]:
        sys.exit(1)


def bench_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"Restart with {result['events']:,} events in the log (snapshot every "
                        f"{result['every_events']:,} events; target: caught up in {result['target_s']:g} s)")
    for c in ("service", "its events", "catch-up, all", "snapshot", "tail", "load", "catch-up from snapshot",
              "ready (all / snapshot)", "same state"):
        table.add_column(c)
    for r in result["services"]:
        table.add_row(r["service"], f"{r['service_events']:,}",
                      f"{r['catch_up_s']} s ({r['catch_up_events_per_s']:,}/s)",
                      f"{r['snapshot_bytes'] / 1e6:.2f} MB at {r['snapshot_seq']:,}", f"{r['tail_events']:,}",
                      f"{r['snapshot_load_s']} s", f"{r['catch_up_with_snapshot_s']} s",
                      f"{r['ready_s']} / {r['ready_with_snapshot_s']} s", "yes" if r["same_state"] else "NO")
    return table


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshots", help="services' state snapshots and replica leases (docs/reliability.md)")
    ssub = p.add_subparsers(dest="snapshots_command", required=True)
    show = ssub.add_parser("show", help="each service's latest snapshot and leader (NATS_URL, GPUSCHED_STREAM)")
    show.add_argument("--json", action="store_true")
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
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=cmd_bench)
