"""Which operator commands take effect: `CordonNode` / `UncordonNode` become `NodeCordoned` / `NodeUncordoned`
once checked against the nodes known, and `RemoveNode` a `NodeLost(removed=True)`. A command that changes nothing
(about an unknown node, or repeating what holds) decides nothing."""

from __future__ import annotations

from contracts import CordonNode, NodeCordoned, NodeLost, NodeUncordoned, RemoveNode, UncordonNode
from libs.core.kernel.decider import Decisions
from libs.core.node_health.state import NodeHealthState


def cordon(state: NodeHealthState, cmd: CordonNode, out: Decisions) -> None:
    if cmd.node not in state.healthy:
        return
    # Cordoning again may turn a cordon into a drain; repeating the same one, or a cordon of a draining node,
    # changes nothing.
    drain = state.cordoned.get(cmd.node)
    if drain != cmd.drain and not (drain and not cmd.drain):
        out.emit(NodeCordoned, correlation_id=cmd.node, node=cmd.node, drain=cmd.drain, reason=cmd.reason,
                 operator=cmd.operator)


def uncordon(state: NodeHealthState, cmd: UncordonNode, out: Decisions) -> None:
    if cmd.node in state.cordoned:
        out.emit(NodeUncordoned, correlation_id=cmd.node, node=cmd.node, reason=cmd.reason, operator=cmd.operator)


def remove(state: NodeHealthState, cmd: RemoveNode, out: Decisions) -> None:
    if cmd.node not in state.healthy:
        return
    # The jobs still there are reported evicted by node-telemetry's roster: nobody may serve the node.
    why = f": {cmd.reason}" if cmd.reason else ""
    out.emit(NodeLost, correlation_id=cmd.node, node=cmd.node, removed=True,
             reason=f"removed_by_operator: {cmd.operator or 'an operator'}{why}")
