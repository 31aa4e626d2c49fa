"""What the reactor shell drives: a Handler turns events into decisions (and, for shells with effects,
does its I/O after each batch). `DeciderHandler` adapts any pure core to it. A handler that names the objects
holding its state (`snapshot_roots`, libs/runtime/snapshots.py) gets snapshots."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from contracts.events import EventBase
from libs.core.kernel.decider import Chain, Decider, run_decider


class Handler(Protocol):
    name: str

    def input_types(self) -> Iterable[type[EventBase]]: ...

    def replay(self, seq: int, event: EventBase) -> None:
        """Catch-up after a restart: rebuild state from an event already handled before."""
        ...

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        """A new event: return the decisions to publish."""
        ...

    async def after_batch(self) -> None:
        """Side effects once per batch (projections, timers); decisions are already published."""
        ...

    async def after_catch_up(self) -> None: ...


class DeciderHandler:
    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.name = decider.name

    @property
    def chain(self) -> Chain:
        return self.decider.chain

    def snapshot_roots(self) -> dict[str, object]:
        """The state a snapshot holds (libs/runtime/snapshots.py): the decider's, all of it."""
        return {"decider": self.decider}

    def input_types(self) -> Iterable[type[EventBase]]:
        return self.decider.input_types()

    def replay(self, seq: int, event: EventBase) -> None:
        # The decisions were published the first time round; re-deriving them rebuilds the same state.
        run_decider(self.decider, event, seq)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        return run_decider(self.decider, event, seq)

    async def after_batch(self) -> None:
        return None

    async def after_catch_up(self) -> None:
        return None
