"""`gpusched audit export|replay`: take the log out, and re-derive every decision from it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from libs.audit.log_reader import read_log
from libs.audit.replay import replay
from libs.bus.jetstream import Bus, BusConfig

console = Console(stderr=True)


def _bus_config() -> BusConfig:
    return BusConfig(url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                     stream=os.environ.get("GPUSCHED_STREAM", "GPUSCHED"),
                     subject_prefix=os.environ.get("GPUSCHED_SUBJECT_PREFIX", "gs"))


async def _read_live() -> list[tuple[int, bytes]]:
    bus = await Bus.connect(_bus_config(), name="gpusched-audit")
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("reading the log", total=None)
            return await read_log(bus, lambda seq, last: progress.update(task, completed=seq, total=last))
    finally:
        await bus.close()


def _read_file(path: Path) -> list[tuple[int, bytes]]:
    """JSON lines `{"seq":N,"event":<the recorded bytes>}` as written by `audit export`: the event's bytes
    are kept verbatim, since replay compares bytes."""
    out = []
    for line_no, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        head, sep, rest = line.partition(b',"event":')
        try:
            if not (sep and head.startswith(b'{"seq":') and rest.endswith(b"}")):
                raise ValueError("expected {\"seq\":N,\"event\":{...}}")
            out.append((int(head[len(b'{"seq":'):]), rest[:-1]))
        except ValueError as err:
            raise ValueError(f"{path}:{line_no}: not an exported log line ({err})") from err
    return out


def cmd_export(args: argparse.Namespace) -> None:
    for seq, raw in asyncio.run(_read_live()):
        sys.stdout.write(f'{{"seq":{seq},"event":{raw.decode()}}}\n')


def cmd_replay(args: argparse.Namespace) -> None:
    log = _read_file(Path(args.log)) if args.log else asyncio.run(_read_live())
    report = replay(log)
    result = {"events": report.events, "decisions_checked": report.decisions_checked,
              "mismatches": len(report.mismatches), "events_per_s": round(report.events_per_s),
              "undecodable": report.undecodable, "ok": report.ok}
    if args.json:
        print(json.dumps({**result, "first_mismatches": [m.__dict__ for m in report.mismatches[:5]]}, indent=2))
    else:
        console.print(f"{report.events} events, {report.decisions_checked} decisions checked, "
                      f"{len(report.mismatches)} mismatches ({report.events_per_s:,.0f} events/s)")
        for m in report.mismatches[:5]:
            console.print(f"[red]{m.service} at trigger {m.trigger_seq}: expected {m.expected} got {m.got}[/red]")
    if not report.ok:
        sys.exit(1)


def add_command(sub: argparse._SubParsersAction) -> None:
    audit = sub.add_parser("audit", help="export the log, replay it through the decision cores")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    p = asub.add_parser("export", help="write the live log as JSON lines to stdout")
    p.set_defaults(func=cmd_export)
    p = asub.add_parser("replay", help="re-derive every decision and compare byte for byte")
    p.add_argument("log", nargs="?", help="an exported log (default: the live stream)")
    p.add_argument("--live", action="store_true", help="read the live stream (the default)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)
