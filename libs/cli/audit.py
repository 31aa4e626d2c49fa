"""`gpusched audit export|replay`: take the log out, and re-derive every decision from it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from libs.audit.log_reader import read_log
from libs.audit.replay import replay
from libs.audit.timeline import timeline
from libs.audit.verify import verify
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.endpoints import audit_key_file, nats_endpoint
from libs.cli.output import add_json_flag, add_table_flags, print_json, wide
from libs.cli.tables import Column, print_table
from libs.runtime.settings import nats_auth_from_env

console = Console(stderr=True)


def live_bus_config() -> BusConfig:
    """The live log's server, stream and prefix, with NATS credentials when set (an auditor's user, say)."""
    return BusConfig(url=nats_endpoint().value,
                     stream=os.environ.get("GPUSCHED_STREAM", "GPUSCHED"),
                     subject_prefix=os.environ.get("GPUSCHED_SUBJECT_PREFIX", "gs"),
                     auth=nats_auth_from_env(os.environ))


async def connect_live(name: str = "gpusched-audit") -> Bus:
    """The live log, for a command that runs once: fails within seconds, naming the address it tried."""
    return await Bus.connect_once(live_bus_config(), nats_endpoint().source, name=name)


async def _read_live() -> list[tuple[int, bytes]]:
    console.print(f"reading the live log at {nats_endpoint().describe()}")
    bus = await connect_live()
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


def _bound(text: str | None) -> tuple[int | None, float | None]:
    """--from/--to: a stream sequence (digits) or an ISO time."""
    if not text:
        return None, None
    if text.isdigit():
        return int(text), None
    try:
        return None, datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"--from/--to take a sequence number or an ISO time, not {text!r}") from None


def _in_range(seq: int, raw: bytes, lo: tuple[int | None, float | None], hi: tuple[int | None, float | None]
              ) -> bool:
    if (lo[0] is not None and seq < lo[0]) or (hi[0] is not None and seq > hi[0]):
        return False
    if lo[1] is None and hi[1] is None:
        return True
    ts = json.loads(raw).get("ts", 0.0)
    return (lo[1] is None or ts >= lo[1]) and (hi[1] is None or ts <= hi[1])


def cmd_export(args: argparse.Namespace) -> None:
    lo, hi = _bound(args.from_), _bound(args.to)
    for seq, raw in asyncio.run(_read_live()):
        if _in_range(seq, raw, lo, hi):
            sys.stdout.write(f'{{"seq":{seq},"event":{raw.decode()}}}\n')


async def _handled_live() -> dict[str, int]:
    """Per decider, the last sequence its service had handled (its consumer's ack floor); {} when the user
    may not look consumers up (then every trigger is replayed)."""
    from libs.audit.replay import DURABLE_OF

    bus = await connect_live()
    try:
        return {name: await bus.ack_floor(durable) for name, durable in DURABLE_OF.items()}
    except Exception as err:  # no right to consumer info (an auditor's user), or no such stream
        console.print(f"[yellow]services' progress unknown ({err}): a trailing trigger not yet handled would "
                      "show as a mismatch[/yellow]")
        return {}
    finally:
        await bus.close()


def load_log(path: str | None) -> list[tuple[int, bytes]]:
    """An exported log file, or the live stream when no file is given."""
    return _read_file(Path(path)) if path else asyncio.run(_read_live())


def cmd_verify(args: argparse.Namespace) -> None:
    key_file = Path(args.key_file) if args.key_file else (audit_key_file() if not args.log else None)
    key = key_file.read_bytes().strip() if key_file else None
    report = verify(load_log(args.log), key)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    elif report.ok:
        console.print(f"[green]ok[/green]: {report.events} events, {report.decisions} chained decisions, "
                      f"{report.checkpoints} signed checkpoints verified")
    else:
        bad = report.first_bad
        assert bad is not None
        console.print(f"[red]TAMPERED[/red] at sequence {bad.seq} ({bad.source or 'unknown source'}): {bad.reason}")
    if not report.ok:
        sys.exit(1)


def cmd_timeline(args: argparse.Namespace) -> None:
    rows = timeline(load_log(args.log), args.job)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        raise ValueError(f"no event in the log touches job {args.job}")
    print_table(f"job {args.job}", TIMELINE_COLUMNS, rows, wide(args))


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


TIMELINE_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("SEQ", lambda r: r["seq"], right=True),
    Column("TIME", lambda r: _stamp(r["ts"])),
    Column("EVENT", lambda r: r["type"]),
    Column("BY", lambda r: r["source"], wide=True),
    Column("DETAIL", lambda r: r["detail"], fit="wrap"),
]


def cmd_replay(args: argparse.Namespace) -> None:
    # Live: the services trail the log's end, so each decider is checked up to what its service had handled.
    handled = None if args.log else asyncio.run(_handled_live())
    log = load_log(args.log)
    report = replay(log, workers=args.workers, handled=handled)
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


def cmd_check(args: argparse.Namespace) -> None:
    """The guarantee checker over a log (docs/guarantees.md): exit 1 at any violation."""
    from contracts.codec import decode
    from libs.audit.guarantees import check

    events = [(seq, decode(raw)) for seq, raw in load_log(args.log)]
    with console.status(f"checking the guarantees over {len(events):,} events ..."):
        found = check(events, liveness=not args.safety_only)
    counts: dict[str, int] = {}
    for v in found:
        counts[v.guarantee] = counts.get(v.guarantee, 0) + 1
    if args.json:
        print_json({"events": len(events), "ok": not found, "violations_by_guarantee": counts,
                    "first_violations": [{"guarantee": v.guarantee, "seq": v.seq, "jobs": list(v.jobs),
                                          "detail": v.detail} for v in found[:20]]})
    elif not found:
        console.print(f"[green]ok[/green]: {len(events):,} events, every guarantee held"
                      + (" (safety only)" if args.safety_only else ""))
    else:
        for v in found[:20]:
            console.print(f"[red]{v.guarantee}[/red] at seq {v.seq} (jobs {', '.join(v.jobs) or 'none'}): {v.detail}")
        console.print(f"{len(found)} violation(s): " + ", ".join(f"{g} {n}" for g, n in sorted(counts.items())))
    if found:
        sys.exit(1)


def cmd_whatif(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from rich.progress import BarColumn, TaskID, TextColumn, TimeElapsedColumn

    from contracts.codec import decode
    from libs.sim.pipeline import world_inputs
    from libs.sim.whatif import parse_change, what_if

    changes = [parse_change(text) for text in args.set]
    events = [decode(raw) for _, raw in load_log(args.log)]
    inputs = world_inputs(enumerate(events))
    # The bar: virtual time replayed against the log's span (a replay under the change may run past its end).
    span = max((e.ts for e in events), default=0.0) - min((e.ts for e in inputs), default=0.0)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        tasks: dict[str, TaskID] = {}

        def show(which: str, logged: int, virtual_s: float) -> None:
            if which not in tasks:
                tasks[which] = progress.add_task(f"replaying {which} the change", total=max(span, 1.0), note="")
            progress.update(tasks[which], completed=min(virtual_s, span),
                            note=f"{logged:,} events, {timedelta(seconds=round(virtual_s))} of the log's "
                                 f"{timedelta(seconds=round(span))} in virtual time")

        result = what_if(inputs, changes, tick_s=args.tick, recorded=events, progress=show)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table("what if " + ", ".join(result["changes"]), WHATIF_COLUMNS, list(result["teams"].items()),
                    wide(args))
    if result["runtimes"]["note"]:  # how the jobs that declare no runtime ran, under the figures it explains
        sys.stdout.flush()
        console.print(result["runtimes"]["note"], markup=False, highlight=False, soft_wrap=True)


TeamBeforeAfter = tuple[str, dict[str, Any]]  # a team, and its figures before and after the change


def _before_after(key: str) -> Callable[[TeamBeforeAfter], str]:
    def pair(row: TeamBeforeAfter) -> str:
        before, after = row[1]["before"] or {}, row[1]["after"] or {}
        return f"{before.get(key, '-')} -> {after.get(key, '-')}"
    return pair


def _jobs(row: TeamBeforeAfter) -> Any:
    before, after = row[1]["before"] or {}, row[1]["after"] or {}
    return before.get("jobs", after.get("jobs"))


# Each figure as "before -> after" (seconds of wait, GPU-hours, % of the GPUs used).
WHATIF_COLUMNS: list[Column[TeamBeforeAfter]] = [
    Column("TEAM", lambda r: r[0]),
    Column("JOBS", _jobs, right=True),
    Column("MEAN-WAIT-S", _before_after("mean_wait_s"), right=True),
    Column("P95-WAIT-S", _before_after("p95_wait_s"), right=True),
    Column("GPU-USE-%", _before_after("gpu_utilisation_pct"), right=True),
    Column("GPU-HOURS", _before_after("gpu_hours"), wide=True, right=True),
]


def add_command(sub: argparse._SubParsersAction) -> None:
    audit = sub.add_parser("audit", help="export the log, replay it through the decision cores")
    asub = audit.add_subparsers(dest="audit_command", required=True)
    p = asub.add_parser("export", help="write the live log as JSON lines to stdout")
    p.add_argument("--from", dest="from_", help="first sequence number or ISO time")
    p.add_argument("--to", help="last sequence number or ISO time")
    p.set_defaults(func=cmd_export)
    p = asub.add_parser("verify", help="check the hash chains, checkpoints and order of the log")
    p.add_argument("log", nargs="?", help="an exported log (default: the live stream)")
    p.add_argument("--live", action="store_true", help="read the live stream (the default)")
    p.add_argument("--key-file", help="the audit key, to verify the signed checkpoints (default for the live "
                   "stream: the local platform's, as `gpusched up` wrote it)")
    add_json_flag(p)
    p.set_defaults(func=cmd_verify)
    p = asub.add_parser("timeline", help="every event that touched one job")
    p.add_argument("job")
    p.add_argument("--log", help="an exported log (default: the live stream)")
    add_table_flags(p)
    p.set_defaults(func=cmd_timeline)
    p = asub.add_parser("replay", help="re-derive every decision and compare byte for byte")
    p.add_argument("log", nargs="?", help="an exported log (default: the live stream)")
    p.add_argument("--live", action="store_true", help="read the live stream (the default)")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                   help="deciders replayed in parallel processes (default: the cores, at most 4)")
    add_json_flag(p)
    p.set_defaults(func=cmd_replay)
    p = asub.add_parser("check", help="the guarantee checker over the log: safety at every sequence, liveness at "
                        "its quiet end (docs/guarantees.md)")
    p.add_argument("log", nargs="?", help="an exported log (default: the live stream)")
    p.add_argument("--safety-only", action="store_true", help="skip liveness (a log cut in the middle of work)")
    add_json_flag(p)
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("whatif", help="replay a log's submissions under changed queue policy, compare teams")
    p.add_argument("--log", help="an exported log (gpusched audit export); default: the live stream")
    p.add_argument("--set", action="append", default=[], required=True,
                   help="queue.NAME.nominal=N | queue.NAME.weight=W | queue.NAME.placement_policy=P")
    p.add_argument("--tick", type=float, default=5.0, help="clock tick of the virtual run, seconds")
    add_table_flags(p)
    p.set_defaults(func=cmd_whatif)
