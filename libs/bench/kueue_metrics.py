"""The figures Kueue's performance test reports, computed from our log alone: wall time, time to admission
per workload class, the least-used queue's usage, plus what Kueue does not report (evictions, preemptions,
quota violations). Times are the stream's storage times, since an event's own `ts` is its trigger's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from contracts import (
    EventBase,
    JobEvicted,
    JobFinished,
    JobRejected,
    PreemptionDecided,
    QueuePolicyChanged,
    QuotaReleased,
    QuotaReserved,
    SubmitJob,
)
from libs.audit.quota_audit import quota_violations
from libs.bench.kueue_scenario import CLASS_LABEL
from libs.bench.stats import percentile
from libs.core.kernel.queue_limits import flavor_quotas

TimedLog = Sequence[tuple[int, float, EventBase]]  # (stream seq, stored at, event)


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(values.items())}


def time_to_admission(log: TimedLog) -> dict[str, list[float]]:
    """Seconds from each job's SubmitJob to its first QuotaReserved, grouped by workload class."""
    submitted: dict[str, tuple[float, str]] = {}
    waits: dict[str, list[float]] = {}
    admitted: set[str] = set()
    for _, at, e in log:
        if isinstance(e, SubmitJob) and e.job_id not in submitted:
            submitted[e.job_id] = (at, e.spec.labels.get(CLASS_LABEL, "unlabelled"))
        elif isinstance(e, QuotaReserved) and e.job_id in submitted and e.job_id not in admitted:
            admitted.add(e.job_id)
            start, cls = submitted[e.job_id]
            waits.setdefault(cls, []).append(at - start)
    return waits


def queue_usage_pct(log: TimedLog, start: float, end: float) -> dict[str, float]:
    """Per queue with a nominal quota: GPUs held under reservation, averaged over [start, end], as % of it."""
    nominal: dict[str, int] = {}
    held: dict[str, tuple[str, float, int]] = {}  # job -> (queue, since, milli)
    area: dict[str, float] = {}  # queue -> milli-GPU-seconds

    def close(job_id: str, until: float) -> None:
        queue, since, milli = held.pop(job_id)
        span = min(until, end) - max(since, start)
        if span > 0:
            area[queue] = area.get(queue, 0.0) + milli * span

    for _, at, e in log:
        if isinstance(e, QueuePolicyChanged):
            nominal[e.queue.name] = sum(f.nominal_gpus for f in flavor_quotas(e.queue)) * 1000
        elif isinstance(e, QuotaReserved):
            if e.job_id in held:  # a second reservation without a release: count the first up to here
                close(e.job_id, at)
            held[e.job_id] = (e.queue, at, e.gpu_milli)
        elif isinstance(e, QuotaReleased) and e.job_id in held:
            close(e.job_id, at)
    for job_id in list(held):
        close(job_id, end)
    wall = end - start
    if wall <= 0:
        return {}
    return {q: 100.0 * area.get(q, 0.0) / (n * wall) for q, n in sorted(nominal.items()) if n > 0}


def compute_metrics(log: TimedLog) -> dict[str, Any]:
    submits = [at for _, at, e in log if isinstance(e, SubmitJob)]
    finishes = [at for _, at, e in log if isinstance(e, JobFinished)]
    start = min(submits, default=0.0)
    end = max(finishes, default=max((at for _, at, _e in log), default=start))
    waits = time_to_admission(log)
    usage = queue_usage_pct(log, start, end)
    return {
        "jobs_submitted": len({e.job_id for _, _, e in log if isinstance(e, SubmitJob)}),
        "jobs_completed": len({e.job_id for _, _, e in log if isinstance(e, JobFinished)}),
        "jobs_rejected": len({e.job_id for _, _, e in log if isinstance(e, JobRejected)}),
        "wall_time_s": round(end - start, 3) if submits and finishes else None,
        "time_to_admission_s": _rounded({c: sum(w) / len(w) for c, w in waits.items()}),
        "time_to_admission_p50_s": _rounded({c: percentile(w, 0.5) or 0.0 for c, w in waits.items()}),
        "time_to_admission_p90_s": _rounded({c: percentile(w, 0.9) or 0.0 for c, w in waits.items()}),
        "min_queue_usage_pct": round(min(usage.values()), 2) if usage else None,
        "mean_queue_usage_pct": round(sum(usage.values()) / len(usage), 2) if usage else None,
        "evictions": sum(isinstance(e, JobEvicted) for _, _, e in log),
        "preemptions": sum(isinstance(e, PreemptionDecided) for _, _, e in log),
        "quota_violations": len(quota_violations(e for _, _, e in log)),
        "events": len(log),
    }


def published_figures(readme: str) -> dict[str, Any]:
    """Kueue's own result as the data set's README states it; {} for a README without one."""
    out: dict[str, Any] = {}
    if m := re.search(r"wall time (\d+(?:\.\d+)?) s", readme):
        out["wall_time_s"] = float(m.group(1))
    _, sep, tail = readme.partition("time to admission:")
    if sep:
        sentence = tail.split(" s.", 1)[0] + " s"
        tta = {name: float(v) for name, v in re.findall(r"(\w+) (\d+(?:\.\d+)?) s\b", sentence)}
        if tta:
            out["time_to_admission_s"] = dict(sorted(tta.items()))
    if m := re.search(r"minimum usage (\d+(?:\.\d+)?) ?%", readme):
        out["min_queue_usage_pct"] = float(m.group(1))
    return out
