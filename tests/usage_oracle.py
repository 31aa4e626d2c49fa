"""GPU time per team computed straight from the log, independently of the platform's usage fold: each
JobStarted opens a run with the GPUs of the job's last JobPlaced; the job's next JobFinished, JobFailed or
JobEvicted closes it. The usage report and the accounting service must agree with this."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, JobEvicted, JobFailed, JobFinished, JobPlaced, JobStarted, JobSubmitted


def gpu_seconds_by_team(events: Iterable[EventBase], until: float | None = None) -> dict[str, float]:
    team: dict[str, str] = {}
    gpus: dict[str, float] = {}
    started: dict[str, float] = {}
    total: dict[str, float] = {}
    last = 0.0
    for e in events:
        last = max(last, e.ts)
        if isinstance(e, JobSubmitted):
            team[e.job_id] = e.spec.team
        elif isinstance(e, JobPlaced):
            gpus[e.job_id] = sum(len(p.gpu_indices) * p.gpu_milli for p in e.placements) / 1000
        elif isinstance(e, JobStarted):
            started[e.job_id] = e.ts
        elif isinstance(e, JobFinished | JobFailed | JobEvicted) and e.job_id in started:
            t = team[e.job_id]
            total[t] = total.get(t, 0.0) + (e.ts - started.pop(e.job_id)) * gpus[e.job_id]
    end = last if until is None else until
    for job_id, since in started.items():
        t = team[job_id]
        total[t] = total.get(t, 0.0) + max(0.0, end - since) * gpus[job_id]
    return total
