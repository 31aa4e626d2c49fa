"""Node health's state as plain data, folded from the log (node_health/fold.py): each registered node's GPUs with
the health the log last gave them, and which nodes are cordoned (or draining)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class NodeHealthState:
    # node -> healthy flag per GPU index, as the log last said
    healthy: dict[str, dict[int, bool]] = field(default_factory=dict)
    cordoned: dict[str, bool] = field(default_factory=dict)  # node -> drain
