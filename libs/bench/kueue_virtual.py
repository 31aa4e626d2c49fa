"""Kueue's scenario through the deciders alone, in virtual time (libs/sim/pipeline.py): the same decision
code as the services with no bus, no processes and a zero-latency pipeline. It separates what the
scheduling rules achieve from what the transport costs, and runs in seconds of CPU instead of a minute
and a half of wall time."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts import EventBase, SubmitJob
from libs.bench.guarantee_figures import guarantee_figures
from libs.bench.kueue_metrics import compute_metrics
from libs.bench.kueue_scenario import cluster_csv, load_scenario, plan_jobs, policy_toml
from libs.core.kernel.policy import PolicyBook
from libs.core.node_health.announcements import InventoryBook
from libs.nodes.sim import load_cluster_csv
from libs.runtime.policy_file import load_policy, policy_changes
from libs.sim.pipeline import VirtualRun, run_virtual

START = 1_800_000_000.0  # any fixed instant: virtual time


def scenario_inputs(generator: Path, scale: float, gpus_per_node: int, replica_gpus: int,
                    declare: str = "oracle") -> list[EventBase]:
    """Inventory, policy and every submission at its scheduled instant: the world's inputs. Kueue's workloads
    run their declared runtime exactly (`oracle`); `declare` tells the deciders something else instead
    (libs/sim/declare.py) while each job still runs that long."""
    queues = load_scenario(generator, scale)
    with tempfile.TemporaryDirectory(prefix="gpusched-virtual-") as tmp:
        policy, cluster = Path(tmp) / "policy.toml", Path(tmp) / "cluster.csv"
        policy.write_text(policy_toml(queues))
        cluster.write_text(cluster_csv(queues, gpus_per_node))
        inputs: list[EventBase] = list(InventoryBook().changes(load_cluster_csv(cluster), now=START - 10))
        inputs += policy_changes(PolicyBook(), load_policy(policy), version=1, now=START - 5)
    inputs += [SubmitJob(id=f"bench-{j.job_id}", ts=START + j.at_ms / 1000, source="bench", job_id=j.job_id,
                         spec=j.spec) for j in plan_jobs(queues, gpus_per_node, replica_gpus, declare)]
    return inputs


def run_virtual_bench(generator: Path, scale: float = 1.0, gpus_per_node: int = 8, replica_gpus: int = 1,
                      tick_s: float = 1.0, progress: Callable[[int], None] | None = None,
                      declare: str = "oracle") -> dict[str, Any]:
    run = run_virtual(scenario_inputs(generator, scale, gpus_per_node, replica_gpus, declare), tick_s=tick_s,
                      progress=progress)
    # In virtual time an event happens at its own timestamp: that is the clock the figures use.
    result = compute_metrics([(seq, e.ts, e) for seq, e in run.log])
    result.update(mode="virtual", declare=declare, scale=scale, gpus_per_node=gpus_per_node, replica_gpus=replica_gpus,
                  **decision_cost(run), **guarantee_figures(run.log))
    return result


def decision_cost(run: VirtualRun) -> dict[str, Any]:
    """Seconds per decider (folding every input it reads and deciding), decisions made, and the cost of one
    decision: all deciders' seconds over all their decisions."""
    return cost_of_decisions(run.seconds, run.decisions)


def cost_of_decisions(seconds: dict[str, float], decisions: dict[str, int]) -> dict[str, Any]:
    made = sum(decisions.values())
    spent = sum(seconds.values())
    return {"decider_s": {name: round(t, 2) for name, t in seconds.items()}, "decisions": made,
            "decisions_per_s": round(made / spent) if spent else 0,
            "us_per_decision": round(spent / made * 1e6, 1) if made else 0.0}
