"""Deterministic replay: run every decision core over a recorded log and compare, byte for byte, what it
decides with what was recorded for the same trigger."""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from contracts.codec import decode, encode
from contracts.events import EventBase
from libs.core.admission import AdmissionDecider
from libs.core.decider import Decider, run_decider
from libs.core.nodes import NodeDecider
from libs.core.placement import PlacementDecider
from libs.core.preemption import PreemptionDecider
from libs.core.quota import QuotaDecider

DECIDERS: tuple[Callable[[], Decider], ...] = (AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider,
                                               NodeDecider)
# The deciders that usually take longest over a log, longest first: in parallel they start first, and the
# quick ones fill in after them.
LONGEST_FIRST: tuple[Callable[[], Decider], ...] = (PlacementDecider, QuotaDecider, PreemptionDecider)


def _cost_order() -> list[int]:
    return sorted(range(len(DECIDERS)),
                  key=lambda i: LONGEST_FIRST.index(DECIDERS[i]) if DECIDERS[i] in LONGEST_FIRST
                  else len(LONGEST_FIRST))


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


PARALLEL_FROM = 5000  # events

# The decoded log, shared with forked workers without copying it through pipes.
_SHARED: tuple[list[tuple[int, EventBase]], dict[tuple[str, int], list[bytes]]] = ([], {})


def _replay_one(index: int) -> tuple[int, list[Mismatch]]:
    """Run one decider over the whole log; its decisions checked and its mismatches."""
    entries, recorded = _SHARED
    decider = DECIDERS[index]()
    accepted = tuple(decider.input_types())
    checked, mismatches = 0, []
    for seq, event in entries:
        if not isinstance(event, accepted):
            continue
        try:
            got = [encode(d) for d in run_decider(decider, event, seq)]
        except Exception as err:  # an altered log can make a decider fail: that is a finding, not a crash
            got = [f"error: {type(err).__name__}: {err}".encode()]
        expected = recorded.get((decider.name, seq), [])
        checked += len(expected)
        if got != expected:
            mismatches.append(Mismatch(decider.name, seq, [e.decode() for e in expected], [g.decode() for g in got]))
    return checked, mismatches


def replay(log: Iterable[tuple[int, bytes]], workers: int = 1) -> ReplayReport:
    """`log` is (stream sequence, raw payload) in stream order, as recorded. The deciders are independent
    of each other, so with `workers` > 1 they replay in parallel processes."""
    global _SHARED
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
    _SHARED = (entries, recorded)
    try:
        # Forking costs more than it saves on a short log.
        if workers > 1 and len(entries) >= PARALLEL_FROM and "fork" in multiprocessing.get_all_start_methods():
            order = _cost_order()
            # The decoded log lives as long as the replay: keep the collector off it, here and in the workers
            # (where it would also copy every page it touches).
            gc.freeze()
            try:
                with multiprocessing.get_context("fork").Pool(min(workers, len(DECIDERS))) as pool:
                    done = dict(zip(order, pool.map(_replay_one, order, chunksize=1), strict=True))
            finally:
                gc.unfreeze()
            results = [done[i] for i in range(len(DECIDERS))]
        else:
            results = [_replay_one(i) for i in range(len(DECIDERS))]
    finally:
        _SHARED = ([], {})
    for checked, mismatches in results:
        report.decisions_checked += checked
        report.mismatches.extend(mismatches)
    report.seconds = time.perf_counter() - started
    return report
