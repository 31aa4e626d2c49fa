"""The guarantee checker's verdict on a benchmark's own log, as figures the benchmark reports beside its
own: how many violations, of which guarantee, and the first few in words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from contracts import EventBase
from libs.audit.guarantees import check


def guarantee_figures(events: Sequence[tuple[int, EventBase]], *, liveness: bool = True) -> dict[str, Any]:
    """Safety at every sequence; liveness too, judged only when the log ends quiet (docs/guarantees.md)."""
    found = check(events, liveness=liveness)
    return {"guarantee_violations": len(found),
            "guarantee_violations_by_id": dict(sorted(Counter(v.guarantee for v in found).items())),
            "first_guarantee_violations": [f"{v.guarantee} at seq {v.seq}: {v.detail}" for v in found[:3]]}
