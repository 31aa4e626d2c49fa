"""Node health's fold: one event into its state (node_health/state.py), by one small handler per event type. It
decides nothing: the nodes registered, their GPUs' health, cordons and removals, as the log says them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import EventBase, GpuHealthChanged, NodeCordoned, NodeLost, NodeRegistered, NodeUncordoned
from libs.core.node_health.state import NodeHealthState

Fold = Callable[[NodeHealthState, Any], None]


def fold(state: NodeHealthState, event: EventBase) -> None:
    handler = FOLDS.get(type(event))
    if handler is not None:
        handler(state, event)


def _node_registered(state: NodeHealthState, event: NodeRegistered) -> None:
    state.healthy[event.node.name] = {gpu.index: gpu.healthy for gpu in event.node.gpus}


def _gpu_health_changed(state: NodeHealthState, event: GpuHealthChanged) -> None:
    # Only a GPU the node's last registration lists: one it dropped is no GPU to quarantine.
    if event.index in state.healthy.get(event.node, {}):
        state.healthy[event.node][event.index] = event.healthy


def _node_cordoned(state: NodeHealthState, event: NodeCordoned) -> None:
    state.cordoned[event.node] = event.drain


def _node_uncordoned(state: NodeHealthState, event: NodeUncordoned) -> None:
    state.cordoned.pop(event.node, None)


def _node_lost(state: NodeHealthState, event: NodeLost) -> None:
    if event.removed:  # out of the inventory (a node merely lost may come back as it was)
        state.healthy.pop(event.node, None)
        state.cordoned.pop(event.node, None)


FOLDS: dict[type[EventBase], Fold] = {
    NodeRegistered: _node_registered,
    GpuHealthChanged: _gpu_health_changed,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    NodeLost: _node_lost,
}
