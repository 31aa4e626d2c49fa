"""`gpusched bench chaos` at a small size: 150 jobs from three teams while a random service is SIGKILLed
every 2 s, NATS is stopped and started again once and Redis is flushed once. Nothing is lost or duplicated,
no GPU is over-allocated, replay reproduces every decision, and the API serves what a rebuild from the log
would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts import NodeRegistered
from libs.bench import chaos_scenario as scenario
from libs.bench.chaos_run import FAIL_KEYS, ChaosOptions, run_chaos
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.validation import validate
from libs.core.kernel.policy import PolicyBook
from libs.nodes.sim import CsvClusterBackend
from libs.runtime.policy_file import load_policy, policy_changes


def test_every_planned_job_is_valid_and_the_plan_is_the_seeds(tmp_path: Path) -> None:
    """The benchmark counts every refusal as a fault's doing: its own jobs must all be acceptable."""
    (tmp_path / "policy.toml").write_text(scenario.POLICY_TOML)
    (tmp_path / "cluster.csv").write_text(scenario.CLUSTER_CSV)
    admission = AdmissionDecider()
    for event in policy_changes(PolicyBook(), load_policy(tmp_path / "policy.toml"), 1, 0.0):
        admission.fold(event)
    for i, node in enumerate(CsvClusterBackend(str(tmp_path / "cluster.csv")).discover()):
        admission.fold(NodeRegistered(id=f"n{i}", ts=0.0, source="test", node=node))
    plan = scenario.plan(500, seed=3, window_s=10.0)
    assert [validate(s.job_spec(), admission.state.policy, admission.state.inventory) for s in plan] == [None] * 500
    assert plan == scenario.plan(500, seed=3, window_s=10.0) != scenario.plan(500, seed=4, window_s=10.0)
    assert len({s.job_id for s in plan}) == 500 and {s.via for s in plan} == {"http", "bus"}
    assert sum(s.again_at_s is not None for s in plan) == 10 and sum(s.cancel_at_s is not None for s in plan) == 5
    assert len({s.spec["priority"] for s in plan}) == 3
    # The preemption probe: the first job holds every T4 for most of the window, an urgent T4 job comes midway.
    holder, probe = plan[0], next(s for s in plan if s.spec["name"].endswith("t4-urgent"))
    assert holder.spec["gpus"] * holder.spec["replicas"] == 6 and holder.spec["duration_s"] == 8.0
    assert holder.spec["gpu_models"] == probe.spec["gpu_models"] == ["T4"] and probe.spec["priority"] == "urgent"
    assert 4.0 <= probe.at_s < 5.0 and plan[1:] == scenario.plan(500, seed=3, window_s=10.0, time_scale=2.0)[1:]


@pytest.mark.e2e
def test_nothing_is_lost_or_duplicated_while_services_nats_and_redis_fail(tmp_path: Path) -> None:
    result = run_chaos(ChaosOptions(jobs=150, seed=7, kill_every_s=2.0, window_s=10.0, timeout_s=90.0,
                                    data=tmp_path))
    summary = json.dumps({k: result[k] for k in (*FAIL_KEYS, "details", "producer")}, indent=1)
    failures = {k: result[k] for k in FAIL_KEYS if result[k]}
    assert failures == {}, summary
    assert result["jobs"] == 150 and not result["timed_out"]
    assert (result["nats_restarts"], result["redis_flushes"]) == (1, 1)
    assert result["kills"] >= 4
    assert sum(result["states"].values()) == 150 and result["states"].get("succeeded", 0) >= 140
    assert result["preemptions"] >= 1  # the priorities and quotas make some
    producer = result["producer"]
    assert producer["again"] >= 2 and producer["http"] > 0 and producer["bus"] > 0
    assert producer["gave_up"] == 0
