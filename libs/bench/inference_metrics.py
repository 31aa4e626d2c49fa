"""The inference benchmark's figures, computed from the log alone (so a recorded run can be judged again):
scale-up times, time below desired replicas, cluster GPU allocation and the GPU-hours batch work got."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from contracts import EventBase, PreemptionDecided
from libs.bench.stats import percentile
from libs.core.kernel.gpu_time import GpuRun, UsageBook
from libs.reports.inference import ServiceTracker


def compute_metrics(log: Iterable[EventBase], start: float, end: float, total_gpus: int, time_scale: float,
                    batch_queue: str) -> dict[str, Any]:
    """Figures for the window [start, end] of the log's clock. GPU-hours are in day time (x time_scale)."""
    tracker = ServiceTracker()
    usage = UsageBook()
    runs: list[GpuRun] = []
    victims = 0
    for event in log:
        tracker.apply(event)
        runs.extend(usage.fold(event))
        if isinstance(event, PreemptionDecided):
            victims += len(event.victims)
    tracker.finish(end)
    runs.extend(usage.open_runs())
    seconds = {"all": 0.0, "batch": 0.0, "inference": 0.0}
    for run in runs:
        s = run.gpu_seconds(start, end)
        seconds["all"] += s
        seconds["batch" if run.queue == batch_queue else "inference"] += s
    window = max(end - start, 1e-9)
    ups = tracker.scale_up_times()
    per_service = {
        name: {"below_desired_pct": round(100 * t.below_s / t.service_s, 3) if t.service_s else 0.0,
               "scale_ups": len(t.scale_up_s), "scale_up_p99_s": round(percentile(t.scale_up_s, 0.99) or 0.0, 3)}
        for name, t in sorted(tracker.services.items())}
    return {
        "scale_ups": len(ups),
        "scale_up_p50_s": round(percentile(ups, 0.5) or 0.0, 3),
        "scale_up_p99_s": round(percentile(ups, 0.99) or 0.0, 3),
        "scale_up_max_s": round(max(ups, default=0.0), 3),
        "below_desired_pct": round(tracker.below_desired_pct(), 3),
        "gpu_allocation_pct": round(100 * seconds["all"] / (total_gpus * window), 2),
        "batch_gpu_hours": round(seconds["batch"] * time_scale / 3600, 1),
        "inference_gpu_hours": round(seconds["inference"] * time_scale / 3600, 1),
        "preempted_jobs": victims,
        "services": per_service,
    }
