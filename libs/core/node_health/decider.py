"""Node health and operator actions, decided from the log: which GPU faults quarantine a GPU, and which
cordon / uncordon / remove commands take effect.

Node agents report what they observe (`GpuFault`); this core decides what it means. A fatal XID class or
an uncorrectable ECC error quarantines the GPU (`GpuHealthChanged(healthy=False)`): placement stops using
it and the executor running a job there stops and requeues that job. Throttling and other XIDs are only
recorded. Operators' `CordonNode` / `UncordonNode` become `NodeCordoned` / `NodeUncordoned` once checked, and
`RemoveNode` a `NodeLost(removed=True)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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

# Node-telemetry also logs unchained facts (inventory, clock ticks, lost nodes) under its own name; its
# decisions form a chain of their own under this one.
SERVICE = "node-health"
# XIDs after which the GPU cannot be trusted until it is reset or replaced: 48 double-bit ECC error,
# 63/64 row remapping pending / failed, 74 NVLink error, 79 fallen off the bus, 94/95 contained /
# uncontained ECC error. Other XIDs (13, 31, 43, ...) are usually one application's fault.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})


def fault_reason(fault: GpuFault) -> str | None:
    """Why the fault quarantines its GPU; None when it does not."""
    if fault.kind == "xid" and fault.code in FATAL_XIDS:
        return f"xid_{fault.code}"
    if fault.kind == "ecc" and fault.code > 0:
        return "ecc_uncorrectable"
    return None


@dataclass(slots=True)
class NodeDecider:
    name: str = SERVICE
    chain: Chain = field(default_factory=Chain)
    # node -> healthy flag per GPU index, as the log last said
    healthy: dict[str, dict[int, bool]] = field(default_factory=dict)
    cordoned: dict[str, bool] = field(default_factory=dict)  # node -> drain

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, GpuHealthChanged, GpuFault, CordonNode, UncordonNode, NodeCordoned,
                NodeUncordoned, RemoveNode, NodeLost)

    def evolve(self, event: EventBase) -> None:
        match event:
            case NodeRegistered():
                self.healthy[event.node.name] = {g.index: g.healthy for g in event.node.gpus}
            case GpuHealthChanged() if event.index in self.healthy.get(event.node, {}):
                # Only a GPU the node's last registration lists: one it dropped is no GPU to quarantine.
                self.healthy[event.node][event.index] = event.healthy
            case NodeCordoned():
                self.cordoned[event.node] = event.drain
            case NodeUncordoned():
                self.cordoned.pop(event.node, None)
            case NodeLost() if event.removed:
                self.healthy.pop(event.node, None)
                self.cordoned.pop(event.node, None)

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        event = trigger.event
        match event:
            case GpuFault():
                reason = fault_reason(event)
                if reason is not None and self.healthy.get(event.node, {}).get(event.index, False):
                    out.emit(GpuHealthChanged, correlation_id=event.node, node=event.node, index=event.index,
                             healthy=False, reason=reason, xid=event.code if event.kind == "xid" else 0)
            case CordonNode() if event.node in self.healthy:
                # Cordoning again may turn a cordon into a drain; repeating the same one changes nothing.
                if self.cordoned.get(event.node) != event.drain and not (self.cordoned.get(event.node)
                                                                         and not event.drain):
                    out.emit(NodeCordoned, correlation_id=event.node, node=event.node, drain=event.drain,
                             reason=event.reason, operator=event.operator)
            case UncordonNode() if event.node in self.cordoned:
                out.emit(NodeUncordoned, correlation_id=event.node, node=event.node, reason=event.reason,
                         operator=event.operator)
            case RemoveNode() if event.node in self.healthy:
                # The jobs still there are reported evicted by node-telemetry's roster: nobody may serve the node.
                why = f": {event.reason}" if event.reason else ""
                out.emit(NodeLost, correlation_id=event.node, node=event.node, removed=True,
                         reason=f"removed_by_operator: {event.operator or 'an operator'}{why}")
        return out.out

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"healthy": self.healthy, "cordoned": self.cordoned})
