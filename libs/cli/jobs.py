"""The CLI commands that talk to the API about jobs: jobs, job, explain, wait, cancel, usage."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from libs.cli.client import Client
from libs.cli.output import add_json_flag, add_table_flags, print_json, wide
from libs.cli.tables import Column, print_table
from libs.core.ledger import FINAL_STATES

console = Console()


def _gpus(job: dict[str, Any]) -> str:
    # Fields at their default are left out of the payload (see the JobSpec schema for the defaults).
    spec = _spec(job)
    per = f"{spec['gpu_milli']}m" if spec.get("gpu_milli") else str(spec.get("gpus", 1))
    return f"{spec.get('replicas', 1)}x{per}"


def age(seconds: float | None) -> str:
    """A duration as kubectl shows an age: 42s, 7m, 5h, 3d."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    return job.get("spec") or {}


def _nodes(job: dict[str, Any]) -> str:
    return ",".join(dict.fromkeys(p["node"] for p in job.get("placements", [])))


def job_columns(now: float) -> list[Column[dict[str, Any]]]:
    """`gpusched jobs`: id, queue, state, GPUs and why it waits by default (the id alone takes 36 of 80
    columns); the rest with -o wide."""
    return [
        Column("ID", lambda j: j["id"]),
        Column("TEAM", lambda j: j["team"], wide=True),
        Column("QUEUE", lambda j: j["queue"]),
        Column("STATE", lambda j: j["state"]),
        Column("PHASE", lambda j: j.get("phase"), wide=True),
        Column("PRIORITY", lambda j: _spec(j).get("priority", "training"), wide=True),
        Column("USER", lambda j: _spec(j).get("user"), wide=True),
        Column("GPUS", _gpus),
        Column("MODELS", lambda j: ",".join(_spec(j).get("gpu_models") or []) or "any", wide=True),
        Column("NODES", _nodes, wide=True),
        Column("EVICTIONS", lambda j: j.get("evictions", 0), wide=True, right=True),
        Column("AGE", lambda j: age(now - j["submitted_at"]) if j.get("submitted_at") else None, wide=True,
               right=True),
        Column("REASON", lambda j: j.get("reason"), fit="cut"),
        Column("MESSAGE", lambda j: j.get("message"), wide=True, fit="cut"),
    ]


def _when(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="seconds")


FIELD_COLUMNS: list[Column[tuple[str, Any]]] = [
    Column("FIELD", lambda f: f[0]),
    Column("VALUE", lambda f: f[1], fit="wrap"),
]
# `gpusched job ID`: these fields by default, the others only with -o wide.
JOB_FIELDS = ("id", "state", "phase", "team", "queue", "reason", "message", "submitted_at", "started_at",
              "finished_at", "exit_code", "evictions", "gpu_seconds")
WIDE_JOB_FIELDS = ("admitted_at", "first_started_at", "retries", "progress_s", "lost_gpu_seconds",
                   "shortfall_milli", "seq")


def job_fields(job: dict[str, Any], every: bool = False) -> list[tuple[str, Any]]:
    """The job's fields as (name, value), times in UTC; `every`: the wide set."""
    names = JOB_FIELDS + WIDE_JOB_FIELDS if every else JOB_FIELDS
    fields = [(k, _when(job.get(k)) if k.endswith("_at") else job.get(k)) for k in names]
    fields.append(("gpus", _gpus(job)))
    if every:
        spec = _spec(job)
        fields += [("priority", spec.get("priority", "training")), ("user", spec.get("user")),
                   ("models", ",".join(spec.get("gpu_models") or []) or "any")]
    fields += [(f"replica {p['replica']}", f"{p['node']} GPUs {p['gpu_indices']} ({p['gpu_milli']}m)")
               for p in job.get("placements", [])]
    return fields


def cmd_jobs(args: argparse.Namespace) -> None:
    jobs = Client().jobs(queue=args.queue, state=args.state, team=args.team, limit=args.limit)
    if args.json:
        print_json(jobs)
        return
    print_table(f"{len(jobs)} job(s)", job_columns(time.time()), jobs, wide(args))


def cmd_job(args: argparse.Namespace) -> None:
    job = Client().job(args.id)
    if args.json:
        print_json(job)
        return
    print_table(f"job {args.id}", FIELD_COLUMNS, job_fields(job, wide(args)), wide(args))


def cmd_explain(args: argparse.Namespace) -> None:
    answer = Client().explain(args.id)
    if args.json:
        print_json(answer)
        return
    console.print(f"job [bold]{args.id}[/bold]: {answer['state']} ({answer['phase']})")
    for reason in answer["reasons"]:
        console.print(f"  [yellow]{reason['code']}[/yellow]: {reason['message']}")
    for hint in answer["unblock"]:
        console.print(f"  would unblock: {hint}")
    if answer.get("estimated_start"):
        when = datetime.fromtimestamp(answer["estimated_start"], tz=UTC).isoformat(timespec="seconds")
        console.print(f"  estimated start: {when}")


def cmd_wait(args: argparse.Namespace) -> None:
    """Until the job is final (as `kubectl wait`): exit 0 when it ends in the state asked for, 1 otherwise;
    the state it is in shows on stderr meanwhile."""
    client, deadline = Client(), time.monotonic() + args.timeout
    with Console(stderr=True).status(f"waiting for {args.id} ...") as status:
        while True:
            job = client.job(args.id)
            if job["state"] in FINAL_STATES or job["state"] == args.for_:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {args.id} is still {job['state']} after {args.timeout:g}s"
                                   + (f" ({job['reason']})" if job.get("reason") else ""))
            status.update(f"waiting for {args.id}: {job['state']}" + (f" ({job['reason']})" if job.get("reason")
                                                                      else ""))
            time.sleep(0.5)
    if args.json:
        print_json(job)
    else:
        console.print(f"{args.id}: {job['state']}" + (f" ({job['reason']})" if job.get("reason") else ""))
    if job["state"] != args.for_:
        raise SystemExit(1)


def cmd_cancel(args: argparse.Namespace) -> None:
    result = Client().cancel(args.id)
    print_json(result) if args.json else console.print(f"{args.id}: {result['state']}")


USAGE_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("TEAM", lambda u: u["team"]),
    Column("GPU-HOURS", lambda u: f"{u['gpu_seconds'] / 3600:.2f}", right=True),
    Column("LOST-GPU-HOURS", lambda u: f"{u.get('lost_gpu_seconds', 0.0) / 3600:.2f}", right=True),
    Column("JOBS-FINISHED", lambda u: u["jobs_finished"], right=True),
    Column("GPU-SECONDS", lambda u: f"{u['gpu_seconds']:.1f}", wide=True, right=True),
    Column("LOST-GPU-SECONDS", lambda u: f"{u.get('lost_gpu_seconds', 0.0):.1f}", wide=True, right=True),
]


def cmd_usage(args: argparse.Namespace) -> None:
    usage = Client().usage()
    if args.json:
        print_json(usage)
        return
    print_table("usage", USAGE_COLUMNS, usage, wide(args))


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--queue")
    p.add_argument("--state")
    p.add_argument("--team")
    p.add_argument("--limit", type=int, default=200)
    add_table_flags(p)
    p.set_defaults(func=cmd_jobs)
    for name, func, text in (("job", cmd_job, "show one job"), ("cancel", cmd_cancel, "cancel a job"),
                             ("explain", cmd_explain, "why a job waits, what would unblock it, and when")):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
        if func is cmd_job:
            add_table_flags(p)
        else:
            add_json_flag(p)
        p.set_defaults(func=func)
    p = sub.add_parser("wait", help="wait until a job is final; exit 0 when it ends in --for's state")
    p.add_argument("id")
    p.add_argument("--for", dest="for_", default="succeeded", help="the state to wait for (default: succeeded)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait at most (default: 120)")
    add_json_flag(p)
    p.set_defaults(func=cmd_wait)
    p = sub.add_parser("usage", help="GPU-hours per team")
    add_table_flags(p)
    p.set_defaults(func=cmd_usage)
