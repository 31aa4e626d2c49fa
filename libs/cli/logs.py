"""`gpusched logs ID`: a job's output from the node agent that ran it, its last lines, or followed to the end.

The API serves the tail of a job's log by bytes (`GET /v1/jobs/{id}/logs?tail=BYTES`: the log's size, and its
last part). Lines are cut here: the window is widened until it holds the lines asked for (or the whole log),
and a line cut by the window's start is left out. Following polls the API: each answer's size says how much
is new since the last one, and the job's state says when to stop.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, NamedTuple

from contracts.views import FINAL_JOB_STATES
from libs.cli.client import ApiError, Client

WINDOW = 64 << 10  # bytes asked for by default
MOST = 16 << 20  # the API's largest tail
POLL_S = 1.0


def size(n: int) -> str:
    """1536 -> "1.5 KiB"."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" or value >= 100 or value.is_integer() else f"{value:.1f} {unit}"


def lines_of(answer: dict[str, Any]) -> tuple[list[str], bool]:
    """The answer's whole lines, and whether they start at the log's beginning (a line the window cut at its
    start is dropped, unless it is all there is)."""
    text, total = answer["log"], answer["bytes"]
    lines = text.splitlines(keepends=True)
    whole = len(text.encode()) >= total
    if not whole and len(lines) > 1:
        lines = lines[1:]
    return lines, whole


class Excerpt(NamedTuple):
    answer: dict[str, Any]  # the API's: node, bytes (the whole log's size), log (its last `window` bytes)
    lines: list[str]  # the lines to show
    whole: bool  # the window held the whole log
    window: int  # bytes asked for

    def header(self) -> str:
        """`-- 120 lines (last 64 KiB of 1.2 MiB, node a100-0) --`."""
        total = size(self.answer["bytes"])
        extent = f"whole log, {total}" if self.whole else f"last {size(self.window)} of {total}"
        n = len(self.lines)
        return f"-- {n} line{'' if n == 1 else 's'} ({extent}, node {self.answer['node']}) --"


def fetch_lines(client: Client, job: str, tail: int | None, window: int) -> Excerpt:
    """The last `tail` lines (every line in the window when None), the window widened (up to the API's most)
    until it holds them."""
    while True:
        answer = client.logs(job, window)
        lines, whole = lines_of(answer)
        if tail is None or len(lines) >= tail or whole or window >= MOST:
            return Excerpt(answer, lines if tail is None else lines[max(len(lines) - tail, 0):], whole, window)
        window = min(window * 4, MOST)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def show(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """Print the lines asked for (their count on stderr); the answer, for following on from its end."""
    excerpt = fetch_lines(client, args.job, args.tail, args.bytes)
    text = "".join(excerpt.lines)
    if args.json:
        print(json.dumps({**excerpt.answer, "log": text, "lines": len(excerpt.lines)}, indent=2))
    else:
        _note(excerpt.header())
        sys.stdout.write(text)
        sys.stdout.flush()
    return excerpt.answer


class Follower:
    """Prints what a job's log gained since the last answer; a new node (the job runs again elsewhere) starts
    a new log."""

    def __init__(self, client: Client, job: str, node: str = "", offset: int = 0) -> None:
        self.client, self.job, self.node, self.offset = client, job, node, offset

    def poll(self) -> None:
        try:
            answer = self.client.logs(self.job, WINDOW)
        except ApiError as err:
            if err.code in ("no_logs", "unknown_job"):
                return  # not started yet (or its agent is away): maybe next time
            raise
        if answer["node"] != self.node:
            if self.node:
                _note(f"-- the job runs again, on node {answer['node']} --")
            self.node, self.offset = answer["node"], 0
        new = answer["bytes"] - self.offset
        if new <= 0:
            return
        data = answer["log"].encode()
        if new > len(data):
            _note(f"-- {size(new - len(data))} not shown (the output grew faster than it was read) --")
        sys.stdout.write(data[-new:].decode(errors="replace"))
        sys.stdout.flush()
        self.offset = answer["bytes"]


def follow(client: Client, args: argparse.Namespace) -> None:
    """The log's last lines, then what it gains until the job is final; the final state on stderr."""
    follower = Follower(client, args.job)
    try:
        answer = show(client, args)
        follower.node, follower.offset = answer["node"], answer["bytes"]
    except ApiError as err:
        if err.code != "no_logs":
            raise
        _note(f"-- no output yet; following {args.job} until it is final --")
    while True:
        job = client.job(args.job)  # the state first: a log read after it ended is complete
        follower.poll()
        if job["state"] in FINAL_JOB_STATES:
            break
        time.sleep(POLL_S)
    reason = f" ({job['reason']})" if job.get("reason") else ""
    exit_code = f", exit code {job['exit_code']}" if job.get("exit_code") is not None else ""
    _note(f"-- job {args.job} {job['state']}{reason}{exit_code} --")


def cmd_logs(args: argparse.Namespace) -> None:
    if args.follow and args.json:
        raise ValueError("--follow prints the output as it comes; --json prints one document: choose one")
    if args.tail is not None and args.tail < 0:
        raise ValueError("--tail is a number of lines, 0 or more")
    if not 0 < args.bytes <= MOST:
        raise ValueError(f"--bytes must be between 1 and {MOST} (16 MiB)")
    client = Client()
    try:
        follow(client, args) if args.follow else show(client, args)
    except KeyboardInterrupt:
        sys.stdout.flush()
        raise SystemExit(130) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job")
    p.add_argument("--tail", type=int, metavar="N", help="the last N lines (default: every line of the last 64 KiB)")
    p.add_argument("--bytes", type=int, default=WINDOW, metavar="BYTES",
                   help="how much of the log's end to read (default 64 KiB; --tail widens it as its lines need)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the job is final (Ctrl-C stops)")
