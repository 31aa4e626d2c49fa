"""The CLI commands that talk to the API about jobs: jobs, job, explain, wait, cancel, usage (how they read:
libs/cli/job_views.py)."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from contracts.views import FINAL_JOB_STATES
from libs.cli.client import Client
from libs.cli.job_views import (
    FIELD_COLUMNS,
    doing,
    is_active,
    job_columns,
    job_fields,
    list_title,
    sort_jobs,
)
from libs.cli.output import add_json_flag, add_table_flags, print_json, wide
from libs.cli.tables import Column, print_table

console = Console()
ACTIVE_STATES = ("running", "pending")


def active_jobs(client: Client, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int, bool]:
    """The active jobs the filters match, how many finished ones were left out, and whether that count is only a
    lower bound. One call when every job fits the limit; past it (the API lists oldest first) the active ones
    come from the per-state lists, so that none is missed however many finished jobs there are."""
    listed = client.jobs(queue=args.queue, team=args.team, limit=args.limit)
    active = [j for j in listed if is_active(j)]
    truncated = len(listed) >= args.limit
    if truncated:
        seen = {j["id"] for j in active}
        for state in ACTIVE_STATES:
            for job in client.jobs(queue=args.queue, state=state, team=args.team, limit=args.limit):
                if job.get("state") == state and job["id"] not in seen:
                    seen.add(job["id"])
                    active.append(job)
    return active, len(listed) - sum(is_active(j) for j in listed), truncated


def cmd_jobs(args: argparse.Namespace) -> None:
    """Active jobs by default (a table people read); -A, --state or --json: every job the filters match."""
    client = Client()
    if args.json or args.every or args.state:
        jobs = client.jobs(queue=args.queue, state=args.state, team=args.team, limit=args.limit)
        if args.json:
            print_json(jobs)
            return
        title = list_title(len(jobs))
    else:
        jobs, hidden, at_least = active_jobs(client, args)
        title = list_title(len(jobs), hidden, at_least, active_only=True)
    print_table(title, job_columns(time.time()), sort_jobs(jobs)[:args.limit], wide(args))


def cmd_job(args: argparse.Namespace) -> None:
    job = Client().job(args.id)
    if args.json:
        print_json(job)
        return
    print_table(f"job {args.id}", FIELD_COLUMNS, job_fields(job, wide(args), time.time()), wide(args))


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
    what it is doing shows on stderr meanwhile (state, reason; how long a running job has run, against what it
    declared)."""
    client, deadline = Client(), time.monotonic() + args.timeout
    with Console(stderr=True).status(f"waiting for {args.id} ...") as status:
        while True:
            job = client.job(args.id)
            if job["state"] in FINAL_JOB_STATES or job["state"] == args.for_:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {args.id} is not {args.for_} after {args.timeout:g}s: it is "
                                   f"{doing(job, time.time())}")
            # One line, never read as markup (a message may hold brackets), cut at the terminal's edge.
            status.update(Text(f"waiting for {args.id}: {doing(job, time.time())}", no_wrap=True,
                               overflow="ellipsis"))
            time.sleep(0.5)
    if args.json:
        print_json(job)
    else:
        console.print(f"{args.id}: {job['state']}" + (f" ({job['reason']})" if job.get("reason") else ""),
                      markup=False)
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
    p = sub.add_parser("jobs", help="list active jobs: running first, then waiting ones in submission order (-A: "
                                    "finished ones too, newest first; --json: every job the filters match)")
    p.add_argument("--queue")
    p.add_argument("--state", help="only jobs in this state (final ones included)")
    p.add_argument("--team")
    p.add_argument("-A", "--all", dest="every", action="store_true", help="finished jobs too")
    p.add_argument("--limit", type=int, default=200, help="at most this many jobs (default: 200)")
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
