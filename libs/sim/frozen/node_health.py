"""Seeded sequences for the node-health decider, which the virtual pipeline leaves out (its scenarios state
cordons, losses and GPU health as facts): the same world with node health deciding beside the four others, and
steps that go through it, as on the platform: operators' cordon, drain, uncordon and remove commands and node
agents' GPU faults (fatal XIDs and ECC errors quarantine a GPU; others are only recorded), besides
submissions, runs ending, registrations and queue changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import CordonNode, EventBase, GpuFault, RemoveNode, UncordonNode
from libs.core.kernel.decider import derived_id
from libs.core.node_health.decider import NodeDecider
from libs.sim.frozen.digest import Log
from libs.sim.frozen.sequences import NODES, SETTINGS, WorldSequence
from libs.sim.pipeline import VirtualWorld
from libs.sim.scenario_model import GpuHealth, Step

SOURCE = "frozen-net"
# XIDs that quarantine a GPU and some that do not, ECC counts (0: none uncorrectable), throttling.
FAULTS = (("xid", 48), ("xid", 79), ("xid", 94), ("xid", 13), ("xid", 31), ("ecc", 1), ("ecc", 0), ("thermal", 0),
          ("power", 0))


class NodeHealthWorld(VirtualWorld):
    """The virtual pipeline with the node-health decider reading the same log."""

    def __init__(self, tick_s: float = 5.0, start: float | None = None) -> None:
        super().__init__(tick_s, start)
        decider = NodeDecider()
        self.deciders.append(decider)
        self.accepts.append(tuple(decider.input_types()))
        self.seconds[decider.name] = 0.0
        self.decisions[decider.name] = 0


class NodeHealthSequence(WorldSequence):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.commands = 0  # numbers the commands and observations: their ids

    def make_world(self) -> VirtualWorld:
        return NodeHealthWorld(SETTINGS.tick_s, start=SETTINGS.start)

    def rules(self) -> list[Callable[[], bool]]:
        rules = [self.submit, self.submit, self.register, self.change_queue, self.only_ticks, self.fault,
                 self.fault, self.recover, self.cordon, self.uncordon, self.remove]
        if self.jobs:
            rules.append(self.cancel)
        if self.world.executor.running:
            rules += [self.end_run, self.end_run]
        if set(self.nodes) - self.lost:
            rules.append(self.lose_node)
        return rules

    def command(self, event_type: type[EventBase], source: str, **fields: Any) -> bool:
        """One command or observation now (any node name, known or not), then a pause."""
        self.commands += 1
        self.apply([event_type(id=derived_id(SOURCE, event_type.__name__, self.commands), ts=self.now, source=source,
                               **fields)])
        self.wait(self.gap())
        return True

    def fault(self) -> bool:
        kind, code = self.rng.choice(FAULTS)
        return self.command(GpuFault, "node-agent", node=self.rng.choice(NODES), index=self.rng.randrange(8),
                            kind=kind, code=code)

    def recover(self) -> bool:
        gpu = GpuHealth(node=self.rng.choice(NODES), index=self.rng.randrange(8), healthy=True, reason="recovered")
        return self.act(Step(gpu=gpu), self.gap())

    def cordon(self) -> bool:
        return self.command(CordonNode, "api", node=self.rng.choice(NODES), drain=self.rng.choice((False, True)),
                            reason="maintenance", operator="ops")

    def uncordon(self) -> bool:
        return self.command(UncordonNode, "api", node=self.rng.choice(NODES), operator="ops")

    def remove(self) -> bool:
        name = self.rng.choice(NODES)
        self.lost.add(name)
        return self.command(RemoveNode, "api", node=name, reason="decommissioned", operator="ops")


def run_node_health_sequence(seed: int) -> Log:
    return NodeHealthSequence(seed).run()
