"""Simulated GPU telemetry: a running job drives its GPUs by its share and its own steady intensity."""

from __future__ import annotations

from contracts import NodeRegistered
from libs.core.node_health.announcements import InventoryBook
from libs.sim.executor import Run
from services.node_telemetry.gpu_samples import intensity, simulated_samples
from tests.unit.builders import node


def test_only_gpus_of_started_runs_are_busy_and_shares_add_up() -> None:
    inventory = InventoryBook()
    inventory.fold(NodeRegistered(id="n", ts=0.0, source="t", node=node("a", 4, gpu_memory_mib=1000)))
    runs = [Run("whole", "p1", 10.0, started_at=1.0, gpus=frozenset({("a", 0), ("a", 1)})),
            Run("half", "p2", 10.0, started_at=1.0, gpus=frozenset({("a", 2)}), gpu_milli=500, gpu_memory_mib=250),
            Run("quarter", "p3", 10.0, started_at=1.0, gpus=frozenset({("a", 2)}), gpu_milli=250),
            Run("placed-only", "p4", 10.0, gpus=frozenset({("a", 3)}))]
    samples = {s.index: s for s in simulated_samples(inventory, runs)}
    assert samples[0].utilization == samples[1].utilization == intensity("whole")
    assert samples[0].memory_used == 1.0
    assert samples[2].utilization == 0.5 * intensity("half") + 0.25 * intensity("quarter")
    assert samples[2].memory_used == 0.25  # asked-for memory wins over the share
    assert (samples[3].utilization, samples[3].memory_used) == (0.0, 0.0)
    assert all(0.6 <= intensity(j) <= 1.0 for j in ("a", "b", "c", "whole"))
