"""A run's log as a small, exact record of its decisions.

Per deciding service: how many decisions it made and a SHA-256 over their canonical bytes (contracts/codec.py
`encode`, each followed by a newline) in log order; every `every` decisions the running digest's first 12 hex
digits (a checkpoint), so that a difference can be narrowed to a window of decisions without storing them.
With them the log's length (a decision of a service not named here still changes it) and a digest of the
world's inputs (a changed input file is told apart from a changed decider)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, TypedDict

from contracts.codec import encode
from contracts.events import ClockTick, EventBase
from libs.sim.executor import SOURCE as EXECUTOR

# The sources the deciders stamp on their decisions (the SERVICE constants of libs/core/admission/decider.py, quota.py,
# placement.py, preemption.py and nodes.py). Spelled out rather than imported: they are part of the log's
# format, and the net must still load while the modules that define them are being moved about.
DECIDERS = ("admission", "quota", "placement", "preemption", "node-health")
CHECKPOINT_HEX = 12

Log = list[tuple[int, EventBase]]


class ServiceRecord(TypedDict):
    count: int
    sha256: str
    checkpoints: list[str]


class RunRecord(TypedDict):
    events: int
    inputs: str
    decisions: dict[str, ServiceRecord]


class _Running:
    """One service's digest as its decisions come."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.hash = hashlib.sha256()
        self.count = 0
        self.checkpoints: list[str] = []

    def add(self, payload: bytes) -> None:
        self.hash.update(payload)
        self.hash.update(b"\n")
        self.count += 1
        if self.count % self.every == 0:
            self.checkpoints.append(self.hash.hexdigest()[:CHECKPOINT_HEX])

    def record(self) -> ServiceRecord:
        return {"count": self.count, "sha256": self.hash.hexdigest(), "checkpoints": self.checkpoints}


def digest_of(events: Iterable[Any]) -> str:
    """SHA-256 over the events' canonical bytes, one line each."""
    h = hashlib.sha256()
    for event in events:
        h.update(encode(event))
        h.update(b"\n")
    return h.hexdigest()


def inputs_of(log: Log) -> list[EventBase]:
    """What came from outside: neither a decision, nor an executor's report, nor a clock tick."""
    return [e for _, e in log if e.source not in DECIDERS and e.source != EXECUTOR and not isinstance(e, ClockTick)]


def record_of(log: Log, every: int) -> RunRecord:
    """The record of a run's log; a checkpoint every `every` decisions of each service."""
    running = {name: _Running(every) for name in DECIDERS}
    for _, event in log:
        service = running.get(event.source)
        if service is not None:
            service.add(encode(event))
    return {"events": len(log), "inputs": digest_of(inputs_of(log)),
            "decisions": {name: r.record() for name, r in running.items()}}
