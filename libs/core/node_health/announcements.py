"""Node telemetry: which discovered nodes must be (re)announced to the log.

A node is announced when it is new or its inventory changed; an unchanged node is not, so restarting
the telemetry service does not flood the log.
"""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, NodeLost, NodeRegistered, NodeSpec
from libs.core.kernel.decider import derived_id

SERVICE = "node-telemetry"


def registration_id(node: NodeSpec, version: int) -> str:
    return derived_id(SERVICE, "register", node.name, version)


class InventoryBook:
    """The nodes as the log last announced them."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeSpec] = {}
        self.versions: dict[str, int] = {}

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost)

    def fold(self, event: EventBase) -> None:
        if isinstance(event, NodeRegistered):
            self.nodes[event.node.name] = event.node
            self.versions[event.node.name] = self.versions.get(event.node.name, 0) + 1
        elif isinstance(event, NodeLost) and event.removed:
            # Out of the inventory: announced again (a new version) if the source lists it at the next start.
            self.nodes.pop(event.node, None)

    def changes(self, discovered: Iterable[NodeSpec], now: float) -> list[NodeRegistered]:
        out = []
        for node in sorted(discovered, key=lambda n: n.name):
            if self.nodes.get(node.name) != node:
                version = self.versions.get(node.name, 0) + 1
                out.append(NodeRegistered(id=registration_id(node, version), ts=now, source=SERVICE,
                                          correlation_id=node.name, node=node))
        return out
