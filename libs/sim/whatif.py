"""What-if: replay a history's submissions under another policy (in virtual time, through the same
decision code) and compare each team's wait and GPU use before and after. A job that declares no runtime
runs, in both replays, as long as the recorded log shows it ran (libs/sim/log_runtimes.py), and the result
says how many there were."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from contracts import EventBase, FlavorQuota, QueuePolicyChanged, QueueSpec
from libs.core.accounting.ledger import Ledger
from libs.core.kernel.queue_limits import flavor_quotas
from libs.sim.log_runtimes import with_log_runtimes
from libs.sim.pipeline import VirtualRun, VirtualWorld

QUEUE_FIELDS = {"nominal": "nominal_gpus", "weight": "weight", "placement_policy": "placement_policy",
                "borrowing_limit": "borrowing_limit_gpus", "lending_limit": "lending_limit_gpus"}
QUOTA_FIELDS = ("nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus")  # per GPU model, too
# A replay gives up on what still waits this long after its first input (as run_virtual does).
HORIZON_S = 30 * 86400.0
# Steps (clock ticks or events) between two progress reports: often enough for the eye, cheap beside a step.
PROGRESS_EVERY = 2000
# progress(replay, events logged so far, virtual seconds since the replay's first input): "before" or "after".
OnProgress = Callable[[str, int, float], None]


class WhatIfError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Change:
    queue: str
    field: str
    value: object
    model: str | None = None  # a quota field of one GPU model's flavor


def parse_change(text: str) -> Change:
    """queue.NAME.nominal=N (also borrowing_limit, lending_limit; each optionally .MODEL for one GPU model's
    quota), queue.NAME.weight=W, queue.NAME.placement_policy=P."""
    key, sep, value = text.partition("=")
    parts = key.split(".")
    if not sep or len(parts) < 3 or parts[0] != "queue":
        raise WhatIfError(f"--set {text!r}: expected queue.NAME.FIELD[.MODEL]=VALUE")
    name, what = parts[1], parts[2]
    if what not in QUEUE_FIELDS:
        raise WhatIfError(f"--set {text!r}: field must be one of {', '.join(QUEUE_FIELDS)}")
    field = QUEUE_FIELDS[what]
    model = ".".join(parts[3:]) or None
    if model is not None and field not in QUOTA_FIELDS:
        raise WhatIfError(f"--set {text!r}: only quota fields ({', '.join(QUOTA_FIELDS)}) are per GPU model")
    try:
        parsed: object = (int(value) if field in QUOTA_FIELDS else float(value) if what == "weight" else value)
    except ValueError:
        raise WhatIfError(f"--set {text!r}: {value!r} is not a number") from None
    return Change(name, field, parsed, model)


def changed_queue(queue: QueueSpec, c: Change) -> QueueSpec:
    if c.model is None:
        if queue.flavors and c.field in QUOTA_FIELDS:
            models = ", ".join(f.model for f in queue.flavors)
            raise WhatIfError(f"queue {queue.name} has quotas per GPU model ({models}): set "
                              f"queue.{queue.name}.{c.field.removesuffix('_gpus')}.MODEL")
        return msgspec.structs.replace(queue, **{c.field: c.value})
    flavors = list(flavor_quotas(queue))
    for i, f in enumerate(flavors):
        if f.model == c.model:
            flavors[i] = msgspec.structs.replace(f, **{c.field: c.value})
            break
    else:
        flavors.append(msgspec.structs.replace(FlavorQuota(model=c.model), **{c.field: c.value}))
    return msgspec.structs.replace(queue, flavors=tuple(flavors), nominal_gpus=None, borrowing_limit_gpus=None,
                                   lending_limit_gpus=None)


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
                    queue = changed_queue(queue, c)
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
    """Per team: waits (submission to first start) and GPU time, from the accounting ledger's fold; runs
    still going at `end` are charged up to it."""
    ledger = Ledger()
    t0: float | None = None
    for seq, event in log:
        t0 = event.ts if t0 is None else t0
        ledger.fold(event, seq)
    capacity = sum(len(n.gpus) for n in ledger.state.cluster.sorted_nodes())
    gpu_seconds = {team: usage.gpu_seconds for team, usage in ledger.state.teams.items()}
    for run in ledger.state.usage.open_runs():  # still running at the end
        gpu_seconds[run.team] = gpu_seconds.get(run.team, 0.0) + run.gpu_seconds(until=end)
    span = max(end - (t0 if t0 is not None else end), 1e-9)
    submitted = [v for v in ledger.state.jobs.values() if v.state != "rejected"]
    out = {}
    for team in sorted({v.team for v in submitted}):
        jobs = [v for v in submitted if v.team == team]
        waits = np.array([v.first_started_at - (v.submitted_at or 0.0) for v in jobs
                          if v.first_started_at is not None])
        used = gpu_seconds.get(team, 0.0)
        out[team] = TeamFigures(
            jobs=len(jobs), started=len(waits),
            mean_wait_s=round(float(waits.mean()), 2) if len(waits) else 0.0,
            p95_wait_s=round(float(np.percentile(waits, 95)), 2) if len(waits) else 0.0,
            gpu_hours=round(used / 3600, 3),
            gpu_utilisation_pct=round(100 * used / (capacity * span), 2) if capacity else 0.0)
    return out


def replay(inputs: list[EventBase], tick_s: float, name: str = "", progress: OnProgress | None = None) -> VirtualRun:
    """run_virtual's run, reporting its progress as it goes (a long history takes a while)."""
    world = VirtualWorld(tick_s)
    world.feed(inputs)
    if not world.heap:
        return VirtualRun(world.log, 0.0, world.seconds, world.decisions)
    world.begin()
    start, steps = world.now, 0
    while world.busy():
        if world.step() and world.now - start > HORIZON_S:
            break
        steps += 1
        if progress is not None and steps % PROGRESS_EVERY == 0:
            progress(name, len(world.log), world.now - start)
    if progress is not None:
        progress(name, len(world.log), world.now - start)
    return VirtualRun(world.log, world.now, world.seconds, world.decisions)


def what_if(inputs: list[EventBase], changes: list[Change], tick_s: float = 5.0,
            recorded: Sequence[EventBase] | None = None, progress: OnProgress | None = None) -> dict[str, Any]:
    """Both replays and the teams' figures. `recorded`: the whole log the inputs come from, which says how long
    the jobs that declare no runtime ran (None: the inputs are all there is)."""
    inputs, runtimes = with_log_runtimes(inputs, recorded)
    before = replay(inputs, tick_s, "before", progress)
    after = replay(apply_changes(inputs, changes), tick_s, "after", progress)
    b, a = team_figures(before.log, before.end), team_figures(after.log, after.end)
    return {
        "changes": [f"queue.{c.queue}.{c.field}={c.value}" for c in changes],
        "teams": {team: {"before": dataclasses.asdict(b[team]) if team in b else None,
                         "after": dataclasses.asdict(a[team]) if team in a else None}
                  for team in sorted(set(b) | set(a))},
        "makespan_s": {"before": round(before.end - (inputs[0].ts if inputs else 0), 1),
                       "after": round(after.end - (inputs[0].ts if inputs else 0), 1)},
        "runtimes": runtimes.as_json(),
    }
