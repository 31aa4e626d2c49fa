"""The CLI commands that talk to the API: submit, jobs, job, cancel, queues, nodes, usage."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from libs.cli.client import Client

console = Console()


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)


def _gpus(job: dict[str, Any]) -> str:
    # Fields at their default are left out of the payload (see the JobSpec schema for the defaults).
    spec = job.get("spec") or {}
    per = f"{spec['gpu_milli']}m" if spec.get("gpu_milli") else str(spec.get("gpus", 1))
    return f"{spec.get('replicas', 1)}x{per}"


def cmd_submit(args: argparse.Namespace) -> None:
    spec: dict[str, Any] = {"team": args.team, "queue": args.queue, "gpus": args.gpus, "replicas": args.replicas,
                            "priority": args.priority}
    optional = {"gpu_milli": args.gpu_milli, "duration_s": args.duration, "user": args.user, "name": args.name,
                "idempotency_key": args.key, "cpu_milli": args.cpu_milli, "memory_mib": args.memory_mib,
                "project": args.project, "checkpoint_interval_s": args.checkpoint_interval}
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        spec["command"] = command
    spec.update({k: v for k, v in optional.items() if v is not None})
    if args.gpu_milli:
        spec["gpus"] = 1
    if args.model:
        spec["gpu_models"] = args.model
    created = Client().submit(spec)
    if args.json:
        _print_json({**created, "spec": spec})
    else:
        console.print(f"submitted [bold]{created['id']}[/bold] ({created['state']})")


def cmd_jobs(args: argparse.Namespace) -> None:
    jobs = Client().jobs(queue=args.queue, state=args.state, team=args.team, limit=args.limit)
    if args.json:
        _print_json(jobs)
        return
    _table(f"{len(jobs)} job(s)", ["id", "team", "queue", "state", "phase", "gpus", "reason"],
           [[j["id"], j["team"], j["queue"], j["state"], j["phase"], _gpus(j), j.get("reason")] for j in jobs])


def cmd_job(args: argparse.Namespace) -> None:
    job = Client().job(args.id)
    if args.json:
        _print_json(job)
        return
    rows = [[k, job.get(k)] for k in ("id", "state", "phase", "team", "queue", "reason", "message", "submitted_at",
                                       "started_at", "finished_at", "exit_code", "evictions", "gpu_seconds")]
    rows.append(["gpus", _gpus(job)])
    rows += [[f"replica {p['replica']}", f"{p['node']} GPUs {p['gpu_indices']} ({p['gpu_milli']}m)"]
             for p in job.get("placements", [])]
    _table(f"job {args.id}", ["field", "value"], rows)


def cmd_explain(args: argparse.Namespace) -> None:
    answer = Client().explain(args.id)
    if args.json:
        _print_json(answer)
        return
    console.print(f"job [bold]{args.id}[/bold]: {answer['state']} ({answer['phase']})")
    for reason in answer["reasons"]:
        console.print(f"  [yellow]{reason['code']}[/yellow]: {reason['message']}")
    for hint in answer["unblock"]:
        console.print(f"  would unblock: {hint}")
    if answer.get("estimated_start"):
        when = datetime.fromtimestamp(answer["estimated_start"], tz=UTC).isoformat(timespec="seconds")
        console.print(f"  estimated start: {when}")


def cmd_cancel(args: argparse.Namespace) -> None:
    result = Client().cancel(args.id)
    _print_json(result) if args.json else console.print(f"{args.id}: {result['state']}")


def cmd_nodes(args: argparse.Namespace) -> None:
    nodes = Client().nodes()
    if args.json:
        _print_json(nodes)
        return
    _table(f"{len(nodes)} node(s)", ["node", "online", "models", "GPUs", "allocated", "healthy"],
           [[n["name"], n["online"], ",".join(n["models"]), n["gpus"], n["allocated_gpus"], n["healthy_gpus"]]
            for n in nodes])


def cmd_usage(args: argparse.Namespace) -> None:
    usage = Client().usage()
    if args.json:
        _print_json(usage)
        return
    _table("usage", ["team", "GPU-seconds", "jobs finished"],
           [[u["team"], f"{u['gpu_seconds']:.1f}", u["jobs_finished"]] for u in usage])


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job")
    p.add_argument("--team", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--gpus", type=int, default=1, help="whole GPUs per replica")
    p.add_argument("--gpu-milli", type=int, help="a fraction of one GPU per replica, 1..999")
    p.add_argument("--model", action="append", help="allowed GPU model (repeatable)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--priority", default="training", help="priority class")
    p.add_argument("--duration", type=float, help="declared runtime in seconds")
    p.add_argument("--cpu-milli", type=int)
    p.add_argument("--memory-mib", type=int)
    p.add_argument("--user")
    p.add_argument("--name")
    p.add_argument("--key", help="idempotency key: the same key returns the same job")
    p.add_argument("--project", help="what the GPU time is charged to inside the team")
    p.add_argument("--checkpoint-interval", type=float, help="seconds between the job's own checkpoints")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the command node agents run (e.g. -- python train.py --epochs 3)")
    p.set_defaults(func=cmd_submit)
    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--queue")
    p.add_argument("--state")
    p.add_argument("--team")
    p.add_argument("--limit", type=int, default=200)
    p.set_defaults(func=cmd_jobs)
    for name, func, text in (("job", cmd_job, "show one job"), ("cancel", cmd_cancel, "cancel a job"),
                             ("explain", cmd_explain, "why a job waits, what would unblock it, and when")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
        p.set_defaults(func=func)
    for name, func, text in (("nodes", cmd_nodes, "list nodes"),
                             ("usage", cmd_usage, "GPU-seconds per team")):
        sub.add_parser(name, help=text).set_defaults(func=func)
