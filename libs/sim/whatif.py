"""What-if: replay a history's submissions under another policy (in virtual time, through the same
decision code) and compare each team's wait and GPU use before and after."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from contracts import (
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    QueuePolicyChanged,
)
from libs.sim.pipeline import run_virtual

QUEUE_FIELDS = {"nominal": "nominal_gpus", "weight": "weight", "placement_policy": "placement_policy"}


class WhatIfError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Change:
    queue: str
    field: str
    value: object


def parse_change(text: str) -> Change:
    """queue.NAME.nominal=N, queue.NAME.weight=W, queue.NAME.placement_policy=P."""
    key, sep, value = text.partition("=")
    parts = key.split(".")
    if not sep or len(parts) < 3 or parts[0] != "queue":
        raise WhatIfError(f"--set {text!r}: expected queue.NAME.FIELD=VALUE")
    name, what = parts[1], parts[2]
    if len(parts) > 3:
        raise WhatIfError(f"--set {text!r}: quotas are per queue here, not per GPU model (drop .{parts[3]})")
    if what not in QUEUE_FIELDS:
        raise WhatIfError(f"--set {text!r}: field must be one of {', '.join(QUEUE_FIELDS)}")
    try:
        parsed: object = int(value) if what == "nominal" else float(value) if what == "weight" else value
    except ValueError:
        raise WhatIfError(f"--set {text!r}: {value!r} is not a number") from None
    return Change(name, QUEUE_FIELDS[what], parsed)


def apply_changes(inputs: list[EventBase], changes: list[Change]) -> list[EventBase]:
    known = {e.queue.name for e in inputs if isinstance(e, QueuePolicyChanged)}
    for c in changes:
        if c.queue not in known:
            raise WhatIfError(f"queue {c.queue!r} is not in the log (it has {', '.join(sorted(known)) or 'none'})")
    out: list[EventBase] = []
    for e in inputs:
        if isinstance(e, QueuePolicyChanged):
            queue = e.queue
            for c in changes:
                if c.queue == queue.name:
                    queue = msgspec.structs.replace(queue, **{c.field: c.value})
            e = msgspec.structs.replace(e, queue=queue)
        out.append(e)
    return out


@dataclass
class TeamFigures:
    jobs: int
    started: int
    mean_wait_s: float
    p95_wait_s: float
    gpu_hours: float
    gpu_utilisation_pct: float


def team_figures(log: Iterable[tuple[int, EventBase]], end: float) -> dict[str, TeamFigures]:
    team_of: dict[str, str] = {}
    submitted: dict[str, float] = {}
    first_start: dict[str, float] = {}
    gpus: dict[str, float] = {}
    started_at: dict[str, float] = {}
    gpu_seconds: dict[str, float] = {}
    capacity = 0
    t0 = None
    for _, e in log:
        t0 = e.ts if t0 is None else t0
        if isinstance(e, NodeRegistered):
            capacity += len(e.node.gpus)
        elif isinstance(e, JobSubmitted):
            team_of[e.job_id], submitted[e.job_id] = e.spec.team, e.ts
        elif isinstance(e, JobPlaced):
            gpus[e.job_id] = sum(len(p.gpu_indices) * p.gpu_milli for p in e.placements) / 1000
        elif isinstance(e, JobStarted):
            first_start.setdefault(e.job_id, e.ts)
            started_at[e.job_id] = e.ts
        elif isinstance(e, JobFinished | JobFailed | JobEvicted) and e.job_id in started_at:
            team = team_of.get(e.job_id, "")
            gpu_seconds[team] = gpu_seconds.get(team, 0.0) + (e.ts - started_at.pop(e.job_id)) * gpus.get(e.job_id, 0)
    for job_id, since in started_at.items():  # still running at the end
        team = team_of.get(job_id, "")
        gpu_seconds[team] = gpu_seconds.get(team, 0.0) + (end - since) * gpus.get(job_id, 0)
    span = max(end - (t0 or end), 1e-9)
    out = {}
    for team in sorted(set(team_of.values())):
        jobs = [j for j, t in team_of.items() if t == team]
        waits = np.array([first_start[j] - submitted[j] for j in jobs if j in first_start])
        out[team] = TeamFigures(
            jobs=len(jobs), started=len(waits),
            mean_wait_s=round(float(waits.mean()), 2) if len(waits) else 0.0,
            p95_wait_s=round(float(np.percentile(waits, 95)), 2) if len(waits) else 0.0,
            gpu_hours=round(gpu_seconds.get(team, 0.0) / 3600, 3),
            gpu_utilisation_pct=round(100 * gpu_seconds.get(team, 0.0) / (capacity * span), 2) if capacity else 0.0)
    return out


def what_if(inputs: list[EventBase], changes: list[Change], tick_s: float = 5.0) -> dict[str, Any]:
    before = run_virtual(inputs, tick_s)
    after = run_virtual(apply_changes(inputs, changes), tick_s)
    b, a = team_figures(before.log, before.end), team_figures(after.log, after.end)
    return {
        "changes": [f"queue.{c.queue}.{c.field}={c.value}" for c in changes],
        "teams": {team: {"before": dataclasses.asdict(b[team]) if team in b else None,
                         "after": dataclasses.asdict(a[team]) if team in a else None}
                  for team in sorted(set(b) | set(a))},
        "makespan_s": {"before": round(before.end - (inputs[0].ts if inputs else 0), 1),
                       "after": round(after.end - (inputs[0].ts if inputs else 0), 1)},
    }
