"""`gpusched report usage`: GPU-seconds and cost per any grouping of job, user, team, project, queue, GPU
model and priority class, over a time window, recomputed from the log every time."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from contracts import EventBase
from libs.core.kernel.gpu_time import USAGE_KEYS, GpuRun, UsageBook
from libs.core.kernel.runs import CurrentRuns
from libs.reports.rates import Rates


class ReportError(ValueError):
    pass


def parse_by(text: str) -> tuple[str, ...]:
    """`team,model` -> ("team", "model"), checked against what a run knows."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in USAGE_KEYS]
    if not keys or unknown:
        raise ReportError(f"--by takes a comma-separated list of {', '.join(USAGE_KEYS)}; got {text!r}")
    if len(set(keys)) != len(keys):
        raise ReportError(f"--by names a key twice: {text!r}")
    return keys


@dataclass(slots=True)
class UsageHistory:
    """Every GPU run in a log: the ended ones and those still going when the log ends."""

    runs: list[GpuRun] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float = 0.0

    @classmethod
    def fold(cls, events: Iterable[EventBase]) -> UsageHistory:
        book, history, current = UsageBook(), cls(), CurrentRuns()
        for event in events:
            if history.first_ts is None:
                history.first_ts = event.ts
            history.last_ts = max(history.last_ts, event.ts)
            if current.is_stale(event):
                continue  # about a run already over, as the ledger takes it: it ends nothing
            current.fold(event)
            history.runs.extend(book.fold(event))
        history.runs.extend(book.open_runs())
        return history


def usage_rows(history: UsageHistory, by: tuple[str, ...], rates: Rates, since: float | None = None,
               until: float | None = None) -> list[dict[str, Any]]:
    """One row per group: the grouping keys, `gpu_seconds`, `gpu_hours` and `cost`. Runs still going are
    counted up to `until`, or to the log's last event when no end is given."""
    end = history.last_ts if until is None else until
    totals: dict[tuple[str, ...], list[float]] = {}
    for run in history.runs:
        seconds = run.gpu_seconds(since, end)
        if seconds <= 0.0:
            continue
        acc = totals.setdefault(run.key(by), [0.0, 0.0])
        acc[0] += seconds
        acc[1] += rates.cost(run.model, seconds)
    return [{**dict(zip(by, key, strict=True)), "gpu_seconds": round(acc[0], 3),
             "gpu_hours": round(acc[0] / 3600.0, 6), "cost": round(acc[1], 4)}
            for key, acc in sorted(totals.items())]
