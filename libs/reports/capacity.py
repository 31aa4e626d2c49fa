"""`gpusched report capacity`: per GPU model and day, the peak demand (GPUs held by running jobs plus asked
for by waiting ones) against the healthy capacity, and a straight-line forecast of the peaks ahead.

Demand comes from the accounting ledger's own fold, so the trend agrees with the live
gpusched_gpu_demand_gpus gauge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contracts import (
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
)
from libs.core.accounting.ledger import Ledger
from libs.core.accounting.state import ALL_MODELS

DAY_S = 86400.0
# Events after which demand cannot have changed: skipping them keeps the sweep fast on long logs.
_DEMAND_EVENTS = (JobSubmitted, JobRejected, JobStarted, JobFinished, JobFailed, JobEvicted, JobCancelled)


@dataclass(slots=True)
class Bucket:
    peak_demand: float = 0.0
    peak_allocated: float = 0.0
    capacity: int = 0


@dataclass(slots=True)
class CapacitySweep:
    bucket_s: float = DAY_S
    ledger: Ledger = field(default_factory=Ledger)
    # node -> healthy GPUs per model it contributes now (nothing while it is lost)
    contribution: dict[str, Counter[str]] = field(default_factory=dict)
    capacity: Counter[str] = field(default_factory=Counter)
    buckets: dict[tuple[int, str], Bucket] = field(default_factory=dict)

    def apply(self, seq: int, event: EventBase) -> None:
        self.ledger.fold(event, seq)
        if isinstance(event, NodeRegistered | NodeLost | GpuHealthChanged):
            self._recount(event.node.name if isinstance(event, NodeRegistered) else event.node)
        elif not isinstance(event, _DEMAND_EVENTS):
            return
        self._sample(int(event.ts // self.bucket_s))

    def _recount(self, name: str) -> None:
        node = self.ledger.state.cluster.nodes.get(name)
        self.capacity.subtract(self.contribution.pop(name, Counter()))
        if node is not None and node.online:
            self.contribution[name] = Counter(g.model for g in node.gpus if g.healthy)
            self.capacity.update(self.contribution[name])

    def _sample(self, bucket: int) -> None:
        held: dict[str, float] = {ALL_MODELS: 0.0}
        for (_, model), gpus in self.ledger.state.usage.held.items():
            held[model] = held.get(model, 0.0) + gpus
            held[ALL_MODELS] += gpus
        demand = self.ledger.state.demand()
        for model in {*demand, *self.capacity, ALL_MODELS}:
            b = self.buckets.setdefault((bucket, model), Bucket())
            b.peak_demand = max(b.peak_demand, round(demand.get(model, 0.0), 3))
            b.peak_allocated = max(b.peak_allocated, round(float(held.get(model, 0.0)), 3))
            cap = sum(self.capacity.values()) if model == ALL_MODELS else self.capacity.get(model, 0)
            b.capacity = max(b.capacity, cap)


def linear_fit(ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against 0, 1, 2...; a flat line through one point."""
    n = len(ys)
    if n < 2:
        return (ys[0] if ys else 0.0), 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sxx
    return my - slope * mx, slope


def _label(bucket: int, bucket_s: float) -> str:
    start = datetime.fromtimestamp(bucket * bucket_s, tz=UTC)
    return start.date().isoformat() if bucket_s == DAY_S else start.isoformat(timespec="seconds")


def capacity_report(events: Iterable[tuple[int, EventBase]], bucket_s: float = DAY_S,
                    horizon: int = 7) -> dict[str, Any]:
    """Per model: the buckets' peaks and capacity, the trend, and the forecast `horizon` buckets ahead."""
    sweep = CapacitySweep(bucket_s=bucket_s)
    for seq, event in events:
        sweep.apply(seq, event)
    models = []
    for model in sorted({m for _, m in sweep.buckets}):
        rows = sorted((b, v) for (b, m), v in sweep.buckets.items() if m == model)
        first, last = rows[0][0], rows[-1][0]
        by_bucket = dict(rows)
        # Buckets without events keep the last known figures: demand did not change in them.
        filled, prev = [], Bucket()
        for b in range(first, last + 1):
            prev = by_bucket.get(b, Bucket(prev.peak_demand, prev.peak_allocated, prev.capacity))
            filled.append((b, prev))
        intercept, slope = linear_fit([v.peak_demand for _, v in filled])
        capacity = filled[-1][1].capacity
        ahead = [(_label(last + k, bucket_s), round(max(0.0, intercept + slope * (len(filled) - 1 + k)), 2))
                 for k in range(1, horizon + 1)]
        exceeds = next((period for period, peak in ahead if peak > capacity), None)
        forecast = [{"period": period, "peak_demand": peak} for period, peak in ahead]
        models.append({
            "model": model, "capacity": capacity, "slope_gpus_per_period": round(slope, 3),
            "periods": [{"period": _label(b, bucket_s), "peak_demand": v.peak_demand,
                         "peak_allocated": v.peak_allocated, "capacity": v.capacity} for b, v in filled],
            "forecast": forecast, "demand_exceeds_capacity_at": exceeds})
    return {"bucket_s": bucket_s, "horizon": horizon, "models": models}
