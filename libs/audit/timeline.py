"""Every event that touched one job, in log order, with the reason each carries."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts.codec import decode

_DETAIL_FIELDS = ("code", "reason", "message", "queue", "gpu_milli", "exit_code", "checkpoint")


def _touches(event: Any, job_id: str) -> bool:
    if getattr(event, "job_id", None) == job_id or getattr(event, "preemptor_id", None) == job_id:
        return True
    return any(v.job_id == job_id for v in getattr(event, "victims", ()))


def _detail(event: Any, job_id: str) -> str:
    parts = [f"{name}={getattr(event, name)}" for name in _DETAIL_FIELDS
             if getattr(event, name, None) not in (None, "", 0)]
    if getattr(event, "placements", None):
        parts.append("on " + ", ".join(f"{p.node}{list(p.gpu_indices)}" for p in event.placements))
    if getattr(event, "victims", None):
        role = "preemptor" if event.preemptor_id == job_id else "victim"
        parts.append(f"{role}; victims {', '.join(v.job_id for v in event.victims)}")
    return " ".join(parts)


def timeline(log: list[tuple[int, bytes]], job_id: str) -> list[dict[str, Any]]:
    rows = []
    for seq, raw in log:
        try:
            event = decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if _touches(event, job_id):
            rows.append({"seq": seq, "ts": event.ts, "type": type(event).__name__, "source": event.source,
                         "detail": _detail(event, job_id)})
    return rows
