"""Deterministic replay: run every decision core over a recorded log and compare, byte for byte, what it
decides with what was recorded for the same trigger."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from contracts.codec import decode, encode
from contracts.events import EventBase
from libs.core.admission import AdmissionDecider
from libs.core.decider import Decider, run_decider
from libs.core.placement import PlacementDecider
from libs.core.preemption import PreemptionDecider
from libs.core.quota import QuotaDecider

DECIDERS: tuple[Callable[[], Decider], ...] = (AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider)


@dataclass(frozen=True, slots=True)
class Mismatch:
    service: str
    trigger_seq: int
    expected: list[str]
    got: list[str]


@dataclass(slots=True)
class ReplayReport:
    events: int = 0
    decisions_checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    undecodable: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def replay(log: Iterable[tuple[int, bytes]]) -> ReplayReport:
    """`log` is (stream sequence, raw payload) in stream order, as recorded."""
    started = time.perf_counter()
    report = ReplayReport()
    entries: list[tuple[int, EventBase]] = []
    event: EventBase
    recorded: dict[tuple[str, int], list[bytes]] = {}
    for seq, raw in log:
        try:
            event = decode(raw)
        except Exception:  # dead-lettered when it was live: it decided nothing
            report.undecodable += 1
            continue
        entries.append((seq, event))
        recorded.setdefault((event.source, event.trigger_seq), []).append(raw)
    report.events = len(entries)
    for make in DECIDERS:
        decider = make()
        accepted = tuple(decider.input_types())
        for seq, event in entries:
            if not isinstance(event, accepted):
                continue
            try:
                got = [encode(d) for d in run_decider(decider, event, seq)]
            except Exception as err:  # an altered log can make a decider fail: that is a finding, not a crash
                got = [f"error: {type(err).__name__}: {err}".encode()]
            expected = recorded.get((decider.name, seq), [])
            report.decisions_checked += len(expected)
            if got != expected:
                report.mismatches.append(Mismatch(decider.name, seq, [e.decode() for e in expected],
                                                  [g.decode() for g in got]))
    report.seconds = time.perf_counter() - started
    return report
