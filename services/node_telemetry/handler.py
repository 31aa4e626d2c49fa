"""Node-telemetry's reactor handler: the pure node decisions (GPU quarantine, cordons, removals), the roster
of who serves each node with the agents' heartbeat watch, and with the simulated cluster its executor."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase
from libs.core.kernel.decider import Chain, run_decider
from libs.core.node_health.decider import SERVICE as NODE_HEALTH
from libs.core.node_health.decider import NodeDecider
from libs.sim.live_executor import SimExecutor
from services.node_telemetry.heartbeats import HeartbeatWatch


class NodeTelemetry:
    name = "node-telemetry"
    chain_source = NODE_HEALTH  # its decisions' source, which names their hash chain

    def __init__(self, executor: SimExecutor | None = None, watch: HeartbeatWatch | None = None) -> None:
        self.decider = NodeDecider()
        self.executor = executor
        self.watch = watch or HeartbeatWatch()
        self._decider_types = frozenset(self.decider.input_types())
        self._executor_types = frozenset(executor.input_types()) if executor is not None else frozenset()
        self._watch_types = frozenset(self.watch.roster.input_types())

    @property
    def chain(self) -> Chain:
        return self.decider.chain

    def snapshot_roots(self) -> dict[str, object]:
        """The state a snapshot holds: the node decisions' and what the executor and the heartbeat watch fold
        from the log (the executor's timers are not state: they are armed again after catch-up)."""
        roots: dict[str, object] = {"decider": self.decider}
        if self.executor is not None:
            roots["inventory"], roots["runs"] = self.executor.inventory, self.executor.book
            roots["reports_made"] = self.executor.made  # applied to the book, not yet back through the log
        # What the roster folds from the log; when each agent was last heard is the wall clock's, not state.
        roots["roster"] = self.watch.roster
        return roots

    def snapshot_settled(self) -> bool:
        """Is every report the executor made stored? (Its timers' reports are published in the background,
        after the run they end is already gone from its book.)"""
        return self.executor is None or self.executor.settled()

    def input_types(self) -> Iterable[type[EventBase]]:
        return sorted(self._decider_types | self._executor_types | self._watch_types, key=lambda t: t.__name__)

    def replay(self, seq: int, event: EventBase) -> None:
        kind = type(event)
        if kind in self._decider_types:
            run_decider(self.decider, event, seq)
        if self.executor is not None and kind in self._executor_types:
            self.executor.replay(seq, event)
        if kind in self._watch_types:
            self.watch.fold(event)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        kind = type(event)
        out: list[EventBase] = []
        if kind in self._decider_types:
            out += run_decider(self.decider, event, seq)
        if self.executor is not None and kind in self._executor_types:
            out += self.executor.on_event(seq, event)
        if kind in self._watch_types:
            self.watch.fold(event)
        return out

    async def after_batch(self) -> None:
        if self.executor is not None:
            await self.executor.after_batch()

    async def after_catch_up(self) -> None:
        if self.executor is not None:
            await self.executor.after_catch_up()
