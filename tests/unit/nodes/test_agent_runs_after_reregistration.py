"""The node agent judges its runs on a node registered again as the simulated executor does: a run reserved
under one model's quota flavor stops once the node no longer has that model, even where its job allows the
new one (libs/core/cluster/runs_after_reregistration.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import GpuSpec, JobPlaced, JobSpec, JobSubmitted, NodeSpec, QuotaReserved, ReplicaPlacement
from libs.core.cluster.runs_after_reregistration import runs_to_stop
from services.agent.executor import ProcessExecutor


@pytest.mark.parametrize(("flavor", "stops"), [("A100", ["j"]), ("", [])])
def test_a_run_bound_to_its_quota_flavors_model_stops_when_the_node_has_it_no_more(
        tmp_path: Path, flavor: str, stops: list[str]) -> None:
    agent = ProcessExecutor(node="n0", workdir=tmp_path)
    spec = JobSpec(team="a", queue="a", gpus=1, command=("true",))
    agent.replay(1, JobSubmitted(id="s", ts=0.0, source="admission", job_id="j", spec=spec))
    agent.replay(2, QuotaReserved(id="r", ts=0.0, source="quota", job_id="j", queue="a", gpu_milli=1000,
                                  flavor=flavor))
    agent.replay(3, JobPlaced(id="p", ts=0.0, source="placement", job_id="j",
                              placements=(ReplicaPlacement(replica=0, node="n0", gpu_indices=(0,), gpu_milli=1000,
                                                           model="A100"),)))
    h100 = NodeSpec(name="n0", gpus=(GpuSpec(index=0, model="H100"),))
    assert runs_to_stop(h100, agent._runs_here()) == stops
