"""Deterministic replay: run every decision core over a recorded log and compare, byte for byte, what it
decides with what was recorded for the same trigger."""

from __future__ import annotations

import bisect
import gc
import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized

from contracts.codec import decode, encode
from contracts.events import EventBase
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import Decider, run_decider
from libs.core.node_health.decider import NodeDecider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider

DECIDERS: tuple[Callable[[], Decider], ...] = (AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider,
                                               NodeDecider)
DECIDER_NAMES = tuple(decider().name for decider in DECIDERS)
# The durable consumer of the service each decider runs in (node health is decided by node-telemetry).
DURABLE_OF = {name: ("node-telemetry" if name == "node-health" else name) for name in DECIDER_NAMES}
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
_SKIP, _FOLD, _REACT = 0, 1, 2  # what a decider does with an event: not its input, folds it, or may decide

@dataclass(slots=True)
class _Log:
    """The decodable entries of a log, side by side: stream sequences and events; and what each decider
    decided, as recorded: its decisions' payloads by the sequence of their trigger."""

    seqs: list[int] = field(default_factory=list)
    events: list[EventBase] = field(default_factory=list)
    recorded: dict[str, dict[int, list[bytes]]] = field(default_factory=dict)


# The decoded log. Each process of a parallel replay decodes it for itself, forked workers right after the
# fork: what they decode is then their own memory, not pages shared with the parent that every reference
# count update would make the kernel copy.
_SHARED = _Log()
# Per decider, the last trigger sequence its service had handled when the log was read (a running platform's
# services trail the log's end: what they have not handled yet, they have not decided yet). Empty: all.
_HANDLED: dict[str, int] = {}


def _decode_log(log: list[tuple[int, bytes]]) -> _Log:
    """The decodable entries (a payload that does not decode was dead-lettered when it was live: it decided
    nothing)."""
    # Decoding makes only new objects without cycles: nothing for the collector to find, and much for it to
    # walk over and over while the log's objects pile up.
    collecting = gc.isenabled()
    gc.disable()
    try:
        seqs = [seq for seq, _ in log]
        raws = [raw for _, raw in log]
        try:
            events: list[EventBase] = list(map(decode, raws))
        except Exception:  # some entry does not decode: go one by one
            kept: list[tuple[int, EventBase, bytes]] = []
            for seq, raw in log:
                try:
                    kept.append((seq, decode(raw), raw))
                except Exception:
                    continue
            seqs, events, raws = [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]
        return _Log(seqs, events, _by_trigger(events, raws))
    finally:
        if collecting:
            gc.enable()


def _by_trigger(events: list[EventBase], raws: list[bytes]) -> dict[str, dict[int, list[bytes]]]:
    """The deciders' recorded decisions: source -> trigger sequence -> payloads, in log order."""
    recorded: dict[str, dict[int, list[bytes]]] = {name: {} for name in DECIDER_NAMES}
    for event, raw in zip(events, raws, strict=True):
        by_trigger = recorded.get(event.source)
        if by_trigger is None:  # an input, not a decision
            continue
        payloads = by_trigger.get(event.trigger_seq)
        if payloads is None:
            by_trigger[event.trigger_seq] = [raw]
        else:
            payloads.append(raw)
    return recorded


def _replay_one(index: int) -> tuple[int, list[Mismatch]]:
    """Run one decider over the whole log; its decisions checked and its mismatches."""
    decider = DECIDERS[index]()
    accepted = tuple(decider.input_types())
    recorded = _SHARED.recorded.get(decider.name, {})
    # A decider may say which inputs its react can decide anything about (reacts_to): the others are only
    # folded.
    reacting = getattr(decider, "reacts_to", None)
    reacts_to = tuple(reacting()) if reacting is not None else accepted
    checked, mismatches = 0, []
    # event type -> what the decider does with it (_SKIP, _FOLD or _REACT), from isinstance, asked once per type
    takes: dict[type, int] = {}
    expected_for = recorded.get
    seqs, events = _SHARED.seqs, _SHARED.events
    handled = _HANDLED.get(decider.name)
    if handled is not None:  # only what its service had handled
        end = bisect.bisect_right(seqs, handled)
        seqs, events = seqs[:end], events[:end]
    for seq, event in zip(seqs, events, strict=True):
        take = takes.get(type(event))
        if take is None:
            take = takes[type(event)] = (_SKIP if not isinstance(event, accepted) else
                                         _REACT if isinstance(event, reacts_to) else _FOLD)
        if take == _SKIP:
            continue
        try:
            got = [encode(d) for d in run_decider(decider, event, seq, react=take == _REACT)]
        except Exception as err:  # an altered log can make a decider fail: that is a finding, not a crash
            got = [f"error: {type(err).__name__}: {err}".encode()]
        expected = expected_for(seq)
        if expected is None:
            if got:
                mismatches.append(Mismatch(decider.name, seq, [], [g.decode() for g in got]))
            continue
        checked += len(expected)
        if got != expected:
            mismatches.append(Mismatch(decider.name, seq, [e.decode() for e in expected], [g.decode() for g in got]))
    return checked, mismatches


def _load(log: list[tuple[int, bytes]], freeze: bool) -> tuple[int, int]:
    """Decode the log into _SHARED; (events, undecodable). `freeze`: keep the collector off it from then on."""
    global _SHARED
    _SHARED = _decode_log(log)
    if freeze:
        gc.freeze()
    events = len(_SHARED.events)
    return events, len(log) - events


def _release() -> None:
    global _SHARED
    _SHARED = _Log()


Done = dict[int, tuple[int, list[Mismatch]]]


def _take(order: list[int], taken: Synchronized[int]) -> Iterator[tuple[int, tuple[int, list[Mismatch]]]]:
    """Replay the deciders of `order` that no other process has taken yet, one after the other."""
    while True:
        with taken.get_lock():
            k = taken.value
            taken.value = k + 1
        if k >= len(order):
            return
        yield order[k], _replay_one(order[k])


def _worker(order: list[int], taken: Synchronized[int], results: Connection, log: list[tuple[int, bytes]],
            freeze: bool) -> None:
    try:
        _load(log, freeze)
        for item in _take(order, taken):
            results.send(item)
    finally:
        results.close()


def _replay_parallel(workers: int, log: list[tuple[int, bytes]], report: ReplayReport, freeze: bool) -> Done:
    """The deciders replayed by this process and `workers` - 1 forked ones, each taking the next decider not
    yet taken (longest first) as soon as it is free."""
    ctx = multiprocessing.get_context("fork")
    order = _cost_order()
    taken: Synchronized[int] = ctx.Value("i", 0)
    children = []
    for _ in range(min(workers, len(order)) - 1):
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_worker, args=(order, taken, send, log, freeze), daemon=True)
        child.start()
        send.close()
        children.append((child, receive))
    report.events, report.undecodable = _load(log, freeze)
    done: Done = dict(_take(order, taken))
    # This process is done with the decoded log: let it go while the workers finish, rather than after.
    _release()
    for child, receive in children:
        try:
            while True:
                index, result = receive.recv()
                done[index] = result
        except EOFError:
            pass
        receive.close()
        child.join()
    missing = [index for index in order if index not in done]
    if missing:  # taken by a worker that died before answering: replay it here
        _load(log, freeze)
        for index in missing:
            done[index] = _replay_one(index)
    return done


def replay(log: Iterable[tuple[int, bytes]], workers: int = 1, handled: Mapping[str, int] | None = None
           ) -> ReplayReport:
    """`log` is (stream sequence, raw payload) in stream order, as recorded. The deciders are independent
    of each other, so with `workers` > 1 they replay in parallel processes. `handled`: per decider, the last
    stream sequence its service had handled (a live log read while the services run): later triggers are not
    replayed, since their decisions may not be in the log yet."""
    global _HANDLED
    started = time.perf_counter()
    report = ReplayReport()
    _HANDLED = dict(handled or {})
    # What exists already, and the decoded log, live as long as the replay: the collector need not walk
    # them over and over (nor, in forked workers, copy every page it would touch). Unless the process keeps
    # objects frozen itself: then it is left as it is.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        logged = list(log)
        # Forking costs more than it saves on a short log.
        if workers > 1 and len(logged) >= PARALLEL_FROM and "fork" in multiprocessing.get_all_start_methods():
            done = _replay_parallel(workers, logged, report, freeze)
            results = [done[i] for i in range(len(DECIDERS))]
        else:
            report.events, report.undecodable = _load(logged, freeze)
            results = [_replay_one(i) for i in range(len(DECIDERS))]
    finally:
        _release()
        _HANDLED = {}
        if freeze:
            gc.unfreeze()
    for checked, mismatches in results:
        report.decisions_checked += checked
        report.mismatches.extend(mismatches)
    report.seconds = time.perf_counter() - started
    return report
