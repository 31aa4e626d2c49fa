"""The platform's guarantees, checked over an event log: pure functions of the log, no I/O.

- `check_safety`: what must hold at every sequence (capacity, MIG slices, placements, gangs, quota limits,
  nominal quota protected from reclaim).
- `check_liveness`: what must be true once the platform has had time to act (every job running, ended or
  waiting for a true reason; no idle capacity while a job that fits waits; lent quota reclaimed in time; each
  reservation in the first flavor with room of its queue's order).
- `check`: both.
- `check_replay`: replay reproduces every recorded decision.

docs/guarantees.md says why each holds and which tests show it."""

from __future__ import annotations

from collections.abc import Sequence

from contracts import EventBase
from libs.audit.guarantees.determinism import check_replay
from libs.audit.guarantees.liveness import DEFAULT_QUIET_S, check_liveness
from libs.audit.guarantees.safety import check_safety
from libs.audit.guarantees.violation import ALL, LIVENESS, SAFETY, Violation


def check(events: Sequence[tuple[int, EventBase]], *, liveness: bool = True) -> list[Violation]:
    """Safety, then (unless `liveness` is False) liveness, each in log order."""
    found = check_safety(events)
    if liveness:
        found += check_liveness(events)
    return found


__all__ = ["ALL", "DEFAULT_QUIET_S", "LIVENESS", "SAFETY", "Violation", "check", "check_liveness", "check_replay",
           "check_safety"]
