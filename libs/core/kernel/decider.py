"""The shape every service core has: `fold` takes an event into the state, `react` decides.

`react` applies each decision it makes to its own state at once (through `Decisions.emit`), so that the
next decision within the same trigger, and the next trigger, see it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import msgspec

from contracts.events import EventBase, JobPlaced
from libs.core.kernel.runs import RUN_REPORTS, CurrentRuns

_ENCODE = msgspec.json.Encoder().encode
# The events a book of current runs looks at (CurrentRuns.is_stale and fold compare exact types): placements and
# executors' reports.
_RUN_EVENTS = frozenset({JobPlaced, *RUN_REPORTS})
_REPLACE = msgspec.structs.replace
# A fixed namespace: decision ids are uuid5(namespace, "service/trigger-id/index").
DECISION_NAMESPACE = uuid.UUID("6f1d3a44-1c0e-5b7a-9a53-2f6c0c7e5a10")


_SHA256 = hashlib.sha256
# sha1 over the namespace, ready to be copied and continued with a name.
_NAMESPACE_SHA1 = hashlib.sha1(DECISION_NAMESPACE.bytes)
# uuid5's variant bits (10xx) on the digest's ninth byte, as its first hex digit: 0-f -> 8, 9, a or b.
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _uuid5(name: str) -> str:
    """str(uuid.uuid5(DECISION_NAMESPACE, name)): the version digit (5) and the variant digit set on the
    sha1 digest's hex form directly."""
    sha1 = _NAMESPACE_SHA1.copy()
    sha1.update(name.encode())
    h = sha1.hexdigest()
    return f"{h[:8]}-{h[8:12]}-5{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def derived_id(*parts: object) -> str:
    """uuid5(DECISION_NAMESPACE, "a/b/c"), computed directly (hot path: one per decision)."""
    return _uuid5("/".join(map(str, parts)))


class Trigger(NamedTuple):
    """What a decision reacts to: the event and its position in the log (a tuple: one is made per event)."""

    event: EventBase
    seq: int

    @property
    def now(self) -> float:
        return self.event.ts


GENESIS = "0" * 32


def chain_hash(previous: str, unchained: bytes) -> str:
    """The link of a decision: sha256 over the previous link and the decision's canonical bytes."""
    return _SHA256(previous.encode() + b"\n" + unchained).hexdigest()[:32]


@dataclass(slots=True)
class Chain:
    """A service's decision chain: its head and how many decisions it holds. Part of the decider's state,
    so replay re-derives the same links."""

    head: str = GENESIS
    length: int = 0


@dataclass(slots=True)
class Decisions:
    """Collects a trigger's decisions, stamping each with a derived id, the trigger's envelope and its link
    in the service's hash chain."""

    service: str
    trigger: Trigger
    apply: Any  # Callable[[EventBase], None]: the decider's fold
    chain: Chain
    out: list[EventBase] = field(default_factory=list)

    def emit(self, event_type: type[EventBase], correlation_id: str = "", **fields: Any) -> EventBase:
        trig, seq = self.trigger
        out = self.out
        event = event_type(
            id=_uuid5(f"{self.service}/{trig.id}/{len(out)}"),  # derived_id(service, trigger id, index)
            ts=trig.ts,
            source=self.service,
            trigger_seq=seq,
            causation_id=trig.id,
            correlation_id=correlation_id or trig.correlation_id,
            **fields,
        )
        chain = self.chain
        link = _SHA256(chain.head.encode() + b"\n" + _ENCODE(event)).hexdigest()[:32]  # chain_hash
        event = _REPLACE(event, chain=link)
        chain.head, chain.length = link, chain.length + 1
        self.apply(event)
        out.append(event)
        return event


class Decider(Protocol):
    """A service's pure core."""

    name: str
    chain: Chain

    def input_types(self) -> Iterable[type[EventBase]]:
        """The event types this decider consumes (its consumer's subject filter)."""
        ...

    def fold(self, event: EventBase) -> None:
        """Fold one event (an input, or one of its own decisions) into the state."""
        ...

    def react(self, trigger: Trigger) -> list[EventBase]:
        """Decide what to do about an input already folded in; apply and return the decisions."""
        ...

    def snapshot(self) -> bytes:
        """The whole state, encoded deterministically."""
        ...


def run_decider(decider: Decider, event: EventBase, seq: int, react: bool = True) -> list[EventBase]:
    """The one step every shell and the replayer run: fold the input, then react to it (`react=False`: an
    input the decider's react decides nothing about, only folded).

    A decider that keeps a book of its jobs' current runs (a `runs` attribute, libs/core/kernel/runs.py) never sees
    an executor's report about a run that is over: such a report is dropped here, before its fold, so that
    no decider need know about runs. The book follows the placements the decider reads and those it decides.
    """
    runs: CurrentRuns | None = getattr(decider, "runs", None)
    if runs is None:
        decider.fold(event)
        return decider.react(Trigger(event, seq)) if react else []
    if type(event) in _RUN_EVENTS:  # (the book neither drops nor folds any other event: most are not these)
        if runs.is_stale(event):
            return []
        runs.fold(event)
    decider.fold(event)
    if not react:
        return []
    decided = decider.react(Trigger(event, seq))
    if decided:
        runs.fold_all(decided)
    return decided
