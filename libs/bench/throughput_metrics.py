"""The figures of one throughput step, from the log alone: how many of the step's jobs were placed per second
while they arrived, how long each waited from its `SubmitJob` to its `JobPlaced` (both as the server stored
them: an event's own `ts` is its trigger's), how long each hop took, what was left when the arrivals stopped,
and how many events the log holds per job."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from contracts import EventBase, JobAdmitted, JobPlaced, JobRejected, QuotaReserved, SubmitJob
from libs.bench.stats import percentile

TimedLog = Sequence[tuple[int, float, EventBase]]  # (stream seq, stored at, event)
# The hops of a job on its way to a GPU, each ending at the first event of its kind for the job.
HOPS = (("admission", JobAdmitted), ("quota", QuotaReserved), ("placement", JobPlaced))
# The first part of the arrivals is left out of the rates: the pipeline is still filling.
WARMUP_SHARE = 0.2
WARMUP_MAX_S = 1.0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _firsts(log: TimedLog, kind: type[EventBase], jobs: set[str]) -> dict[str, float]:
    """When each job's first event of `kind` was stored."""
    out: dict[str, float] = {}
    for _, at, e in log:
        if isinstance(e, kind):
            job = getattr(e, "job_id", "")
            if job in jobs and job not in out:
                out[job] = at
    return out


def _latency(start: dict[str, float], end: dict[str, float]) -> dict[str, float | None]:
    waits = [end[j] - at for j, at in start.items() if j in end]
    return {"p50_ms": _ms(percentile(waits, 0.5)), "p99_ms": _ms(percentile(waits, 0.99)),
            "max_ms": _ms(max(waits, default=None))}


def step_figures(log: TimedLog, jobs: set[str], rate: float) -> dict[str, Any]:
    """`log`: the events stored from the step's first submission until its jobs were done with; `jobs`: the
    step's job ids; `rate`: the jobs per second it offered."""
    submitted = _firsts(log, SubmitJob, jobs)
    placed = _firsts(log, JobPlaced, jobs)
    first, last = min(submitted.values(), default=0.0), max(submitted.values(), default=0.0)
    # The steady window: the arrivals once the pipeline has filled.
    begin = first + min(WARMUP_MAX_S, WARMUP_SHARE * (last - first))
    window = last - begin
    # Half open, (begin, last]: n arrivals one interval apart span n intervals.
    placed_in = sum(1 for at in placed.values() if begin < at <= last)
    submitted_in = sum(1 for at in submitted.values() if begin < at <= last)
    stages: dict[str, dict[str, float | None]] = {}
    before = submitted
    for name, kind in HOPS:
        after = _firsts(log, kind, jobs)
        stages[name] = _latency(before, after)
        before = after
    types = Counter(type(e).__name__ for _, _, e in log)
    n = len(jobs)
    return {
        "rate": rate, "jobs": n, "submitted": len(submitted), "placed": len(placed),
        "rejected": len(_firsts(log, JobRejected, jobs)),
        "submitted_per_s": round(submitted_in / window, 1) if window > 0 else None,
        "placed_per_s": round(placed_in / window, 1) if window > 0 else None,
        **_latency(submitted, placed),
        "stages_ms": stages,
        # Jobs submitted but not placed when the last one arrived, and how long the rest took to place.
        "backlog_at_end": sum(1 for j, at in submitted.items() if at <= last and placed.get(j, math.inf) > last),
        "drain_s": round(max(placed.values()) - last, 3) if placed else None,
        "events": len(log),
        "events_per_job": round(len(log) / n, 2) if n else None,
        "events_per_job_by_type": {k: round(v / n, 2) for k, v in sorted(types.items())} if n else {},
    }


def sustained(figures: dict[str, Any], p99_bound_ms: float, min_share: float) -> bool:
    """Every job placed, the placed rate within `min_share` of the offered one, p99 under the bound."""
    placed_per_s = figures["placed_per_s"] or 0.0
    return (figures["placed"] == figures["jobs"] and placed_per_s >= min_share * figures["rate"]
            and figures["p99_ms"] is not None and figures["p99_ms"] <= p99_bound_ms)
