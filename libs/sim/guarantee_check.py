"""The guarantee checker as the simulations use it: `libs.audit.guarantees` when it is there; otherwise the
older log auditors (capacity and quota limits, safety only), reported in the same shape."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from contracts import EventBase

Log = Sequence[tuple[int, EventBase]]
_SEQ = re.compile(r"seq (\d+)")
_JOB = re.compile(r"job (\S+)")


class ViolationLike(Protocol):
    @property
    def guarantee(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def jobs(self) -> tuple[str, ...]: ...
    @property
    def detail(self) -> str: ...


@dataclass(frozen=True)
class Violation:
    guarantee: str
    seq: int
    jobs: tuple[str, ...]
    detail: str


def _checker() -> Any | None:
    try:
        from libs.audit import guarantees
    except ImportError:
        return None
    wanted = ("check", "check_safety", "check_liveness")
    return guarantees if all(hasattr(guarantees, name) for name in wanted) else None


def check_safety(events: Log) -> list[ViolationLike]:
    checker = _checker()
    if checker is not None:
        return list(checker.check_safety(events))
    return _fallback_safety(events)


def check_liveness(events: Log, quiet_s: float | None = None) -> list[ViolationLike]:
    """Liveness, judged when the log ends quiet (for `quiet_s`, or the checker's own default)."""
    checker = _checker()
    if checker is None:
        return []
    return list(checker.check_liveness(events) if quiet_s is None else checker.check_liveness(events, quiet_s=quiet_s))


def check_all(events: Log, replay: bool = False) -> list[ViolationLike]:
    """Every guarantee the checker knows, safety and liveness, in log order; with `replay`, determinism too: the
    log's own decisions replayed through the deciders (libs/audit/guarantees/determinism.py)."""
    checker = _checker()
    found = _fallback_safety(events) if checker is None else list(checker.check(events, liveness=True))
    if replay and checker is not None:
        found += checker.check_replay(events)
    return sorted(found, key=lambda v: (v.seq, v.guarantee, v.jobs))


def _fallback_safety(events: Log) -> list[ViolationLike]:
    from libs.audit.invariants import overallocations
    from libs.audit.quota_audit import quota_violations

    out: list[ViolationLike] = []
    for line in overallocations(events):
        seq, job = _SEQ.search(line), _JOB.search(line)
        out.append(Violation("gpu_capacity", int(seq.group(1)) if seq else 0, (job.group(1),) if job else (), line))
    seq_of = {e.id: seq for seq, e in events}
    for line in quota_violations([e for _, e in events]):
        job_id, _, rest = line.partition(" (")
        event_id = rest.partition(")")[0]
        out.append(Violation("quota_ceiling", seq_of.get(event_id, 0), (job_id,), line))
    return sorted(out, key=lambda v: (v.seq, v.guarantee))
