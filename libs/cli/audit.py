"""`gpusched audit export|replay`: take the log out, and re-derive every decision from it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from libs.audit.log_reader import read_log
from libs.audit.replay import replay
from libs.audit.timeline import timeline
from libs.audit.verify import verify
from libs.bus.jetstream import Bus, BusConfig
from libs.runtime.settings import nats_auth_from_env

console = Console(stderr=True)


def live_bus_config() -> BusConfig:
    """The live log's server, stream and prefix, with NATS credentials when set (an auditor's user, say)."""
    return BusConfig(url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                     stream=os.environ.get("GPUSCHED_STREAM", "GPUSCHED"),
                     subject_prefix=os.environ.get("GPUSCHED_SUBJECT_PREFIX", "gs"),
                     auth=nats_auth_from_env(os.environ))


async def _read_live() -> list[tuple[int, bytes]]:
    bus = await Bus.connect(live_bus_config(), name="gpusched-audit")
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

    bus = await Bus.connect(live_bus_config(), name="gpusched-audit")
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
    key = Path(args.key_file).read_bytes().strip() if args.key_file else None
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
    table = Table(title=f"job {args.job}")
    for column in ("seq", "time", "event", "by", "detail"):
        table.add_column(column)
    for row in rows:
        when = datetime.fromtimestamp(row["ts"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        table.add_row(str(row["seq"]), when, row["type"], row["source"], row["detail"])
    console.print(table)


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


def cmd_whatif(args: argparse.Namespace) -> None:
    from contracts.codec import decode
    from libs.sim.pipeline import world_inputs
    from libs.sim.whatif import parse_change, what_if

    changes = [parse_change(text) for text in args.set]
    log = [(seq, decode(raw)) for seq, raw in _read_file(Path(args.log))]
    with console.status("replaying the history twice in virtual time..."):
        result = what_if(world_inputs(log), changes, tick_s=args.tick)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title="what if " + ", ".join(result["changes"]))
    for column in ("team", "jobs", "mean wait s (before -> after)", "p95 wait s", "GPU-hours", "GPU use %"):
        table.add_column(column)
    for team, both in result["teams"].items():
        b, a = both["before"] or {}, both["after"] or {}

        def pair(key: str, b: dict = b, a: dict = a) -> str:
            return f"{b.get(key, '-')} -> {a.get(key, '-')}"

        table.add_row(team, str(b.get("jobs", a.get("jobs"))), pair("mean_wait_s"), pair("p95_wait_s"),
                      pair("gpu_hours"), pair("gpu_utilisation_pct"))
    console.print(table)


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
    p.add_argument("--key-file", help="the audit key, to verify the signed checkpoints")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)
    p = asub.add_parser("timeline", help="every event that touched one job")
    p.add_argument("job")
    p.add_argument("--log", help="an exported log (default: the live stream)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_timeline)
    p = asub.add_parser("replay", help="re-derive every decision and compare byte for byte")
    p.add_argument("log", nargs="?", help="an exported log (default: the live stream)")
    p.add_argument("--live", action="store_true", help="read the live stream (the default)")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                   help="deciders replayed in parallel processes (default: the cores, at most 4)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("whatif", help="replay a log's submissions under changed queue policy, compare teams")
    p.add_argument("--log", required=True, help="an exported log (gpusched audit export)")
    p.add_argument("--set", action="append", default=[], required=True,
                   help="queue.NAME.nominal=N | queue.NAME.weight=W | queue.NAME.placement_policy=P")
    p.add_argument("--tick", type=float, default=5.0, help="clock tick of the virtual run, seconds")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_whatif)
