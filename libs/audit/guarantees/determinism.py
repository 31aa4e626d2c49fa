"""Same log, same decisions: replay every decider over the log (libs/audit/replay.py) and report each trigger
whose decisions it does not reproduce byte for byte."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from contracts import EventBase
from contracts.codec import encode
from libs.audit.guarantees.violation import DETERMINISM, Violation
from libs.audit.replay import Mismatch, replay

_JOB_FIELDS = ("job_id", "preemptor_id")


def check_replay(events: Sequence[tuple[int, EventBase]], workers: int = 1) -> list[Violation]:
    """One violation per trigger whose recorded decisions replay differently (missing, extra or altered).
    The events are encoded canonically, as the stream stores them."""
    report = replay([(seq, encode(event)) for seq, event in events], workers=workers)
    return [_violation(m) for m in report.mismatches]


def _violation(m: Mismatch) -> Violation:
    jobs = tuple(dict.fromkeys(j for payload in (*m.expected, *m.got) for j in _jobs_of(payload)))
    detail = (f"{m.service} decided differently on replay of trigger {m.trigger_seq}: recorded "
              f"{_summary(m.expected)}, replayed {_summary(m.got)}")
    return Violation(DETERMINISM, m.trigger_seq, jobs, detail)


def _decoded(payload: str) -> dict[str, object]:
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _jobs_of(payload: str) -> list[str]:
    fields = _decoded(payload)
    found = [v for f in _JOB_FIELDS if isinstance(v := fields.get(f), str)]
    victims = fields.get("victims")
    if isinstance(victims, list):
        found += [v["job_id"] for v in victims if isinstance(v, dict) and isinstance(v.get("job_id"), str)]
    return found


def _summary(payloads: list[str]) -> str:
    if not payloads:
        return "nothing"
    kinds = [str(_decoded(p).get("type") or p[:60]) for p in payloads]
    return f"{len(payloads)} ({', '.join(kinds)})"
