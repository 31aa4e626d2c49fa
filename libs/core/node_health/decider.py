"""Node health and operator actions, decided from the log: which GPU faults quarantine a GPU
(node_health/gpu_faults.py), and which cordon / uncordon / remove commands take effect
(node_health/operator_actions.py).

The decider holds its state (node_health/state.py, `state`) with the decider protocol over it: `fold` applies the fold
(node_health/fold.py); `react` hands each fault report or command to its handler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from contracts import (
    CordonNode,
    EventBase,
    GpuFault,
    GpuHealthChanged,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    RemoveNode,
    UncordonNode,
)
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.node_health.fold import fold
from libs.core.node_health.gpu_faults import quarantine
from libs.core.node_health.operator_actions import cordon, remove, uncordon
from libs.core.node_health.state import NodeHealthState

# Node-telemetry also logs unchained facts (inventory, clock ticks, lost nodes) under its own name; its
# decisions form a chain of their own under this one.
SERVICE = "node-health"

# (the state, the report or command, the decisions so far)
Handler = Callable[[NodeHealthState, Any, Decisions], None]
HANDLERS: dict[type[EventBase], Handler] = {
    GpuFault: quarantine,
    CordonNode: cordon,
    UncordonNode: uncordon,
    RemoveNode: remove,
}


class NodeDecider:
    """Node health's decider: its state (`state`, node_health/state.py) with the decider protocol over it."""

    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.state = NodeHealthState()

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, GpuHealthChanged, GpuFault, CordonNode, UncordonNode, NodeCordoned,
                NodeUncordoned, RemoveNode, NodeLost)

    def fold(self, event: EventBase) -> None:
        fold(self.state, event)

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.fold, self.chain)
        handler = HANDLERS.get(type(trigger.event))
        if handler is not None:
            handler(self.state, trigger.event, out)
        return out.out

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"healthy": self.state.healthy, "cordoned": self.state.cordoned})
