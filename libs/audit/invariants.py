"""Invariants checked from the log alone: no GPU share, GPU memory, MIG slice, CPU, memory or RDMA NIC
allocated beyond capacity at any point, and no job placed twice without being released. A view of the
capacity guarantees of libs.audit.guarantees, one line per violation."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase
from libs.audit.guarantees import check_safety
from libs.audit.guarantees.violation import DOUBLE_PLACEMENT, GPU_CAPACITY, MIG_SLICES

CAPACITY_GUARANTEES = (GPU_CAPACITY, MIG_SLICES, DOUBLE_PLACEMENT)


def overallocations(events: Iterable[tuple[int, EventBase]]) -> list[str]:
    """Every moment some capacity went beyond full, or a job was placed twice without being released."""
    return [str(v) for v in check_safety(list(events)) if v.guarantee in CAPACITY_GUARANTEES]
