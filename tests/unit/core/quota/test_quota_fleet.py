"""Quota and the cluster's GPU models: a flavor no usable node could serve is passed over while another could
(tests/scenarios/flavor-without-nodes-*.yaml run the same through the whole pipeline), and a preemptor's
placement timeout waits for its victims to leave."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import (
    GpuHealthChanged,
    GpuSpec,
    JobEvicted,
    JobPlaced,
    JobSpec,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    QuotaReleased,
)
from libs.core.kernel.quota_math import ANY
from libs.core.quota.decider import PLACEMENT_TIMEOUT
from libs.core.quota.fleet import Fleet
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def _node(name: str, model: str, gpus: int) -> NodeRegistered:
    spec = NodeSpec(name=name, gpus=tuple(GpuSpec(index=i, model=model) for i in range(gpus)))
    return NodeRegistered(id=f"reg-{name}", ts=0.0, source="test", node=spec)


def _fleet(*events: object) -> Fleet:
    fleet = Fleet()
    for event in events:
        fleet.fold(event)  # type: ignore[arg-type]
    return fleet


ANY_MODEL = JobSpec(team="a", queue="a", gpus=2)


def test_a_flavor_no_node_has_is_passed_over() -> None:
    fleet = _fleet(_node("n0", "A100", 2))
    assert fleet.servable(("H100", "A100"), ANY_MODEL, 2000) == ("A100",)


def test_a_flavor_with_too_few_gpus_for_the_job_is_passed_over() -> None:
    fleet = _fleet(_node("n0", "A100", 4), _node("n1", "H100", 1))
    assert fleet.servable(("H100", "A100"), ANY_MODEL, 2000) == ("A100",)
    assert fleet.servable(("H100", "A100"), ANY_MODEL, 1000) == ("H100", "A100")


def test_every_flavor_is_kept_when_none_could_serve_the_job() -> None:
    assert _fleet().servable(("H100", "A100"), ANY_MODEL, 1000) == ("H100", "A100")
    assert _fleet(_node("n0", "T4", 1)).servable(("H100", "A100"), ANY_MODEL, 1000) == ("H100", "A100")


def test_any_flavor_counts_only_the_models_the_job_allows() -> None:
    fleet = _fleet(_node("n0", "A100", 2))
    assert fleet.could_hold(ANY, ANY_MODEL, 2000)
    assert not fleet.could_hold(ANY, JobSpec(team="a", queue="a", gpus=1, gpu_models=("H100",)), 1000)


def test_lost_cordoned_and_unhealthy_gpus_do_not_count() -> None:
    reg = _node("n0", "H100", 2)
    assert _fleet(reg, NodeLost(id="l", ts=1.0, source="t", node="n0", reason="gone")).by_model == {}
    assert _fleet(reg, NodeCordoned(id="c", ts=1.0, source="t", node="n0")).by_model == {}
    back = _fleet(reg, NodeCordoned(id="c", ts=1.0, source="t", node="n0"),
                  NodeUncordoned(id="u", ts=2.0, source="t", node="n0"))
    assert back.by_model == {"H100": 2}
    sick = _fleet(reg, GpuHealthChanged(id="g", ts=1.0, source="t", node="n0", index=1, healthy=False, reason="x"))
    assert sick.by_model == {"H100": 1}
    assert not sick.could_hold("H100", ANY_MODEL, 2000)


def test_version_bumps_only_when_the_counts_change() -> None:
    fleet = _fleet(_node("n0", "A100", 2))
    version = fleet.version
    fleet.fold(_node("n0", "A100", 2))  # registered again, the same
    assert fleet.version == version
    fleet.fold(_node("n1", "H100", 1))
    assert fleet.version == version + 1


def test_preemptor_keeps_its_quota_while_a_slow_victim_checkpoints() -> None:
    run = run_scenario(load_scenario(SCENARIOS / "placement-timeout-waits-for-leaving-victims.yaml"), SCENARIOS)
    events = [e for _, e in run.log]
    timed_out = [e.job_id for e in events if isinstance(e, QuotaReleased) and e.reason == PLACEMENT_TIMEOUT]
    assert "high" not in timed_out  # its victim took 400 s to leave, past the 120 s timeout
    assert not [e for e in events if isinstance(e, JobEvicted) and e.job_id == "mid"]  # never placed to be evicted
    placed = [e for e in events if isinstance(e, JobPlaced)]
    assert [e.job_id for e in placed] == ["low", "high"]
    assert run.violations == [] and run.unmet == []


SERVED_FLAVOR_TAKEN = """
name: served-flavor-taken
settings: {{quiet_s: 900, starvation_after_s: 100000}}
queues:
  - {{name: a, team: a, flavors: [{{model: A100, nominal_gpus: 1}}, {{model: H100, nominal_gpus: 2}}]}}
cluster:
  nodes:
    - {{name: n0, gpus: 2, model: A100}}
events:
{before}
  - {{at: 0, submit: {{job: j1, team: a, queue: a, gpus: 1}}}}
  - {{at: 10, submit: {{job: j2, team: a, queue: a, gpus: 1}}}}
  - {{at: 100, {change}}}
expect:
  jobs:
    j2: {{state: running}}
  violations: []
"""


@pytest.mark.parametrize(("before", "change"), [
    pytest.param("", "register: {name: n1, gpus: 2, model: H100}", id="registered"),
    pytest.param("  - {at: 0, register: {name: n1, gpus: 2, model: H100}}\n  - {at: 0, cordon: n1}",
                 "uncordon: n1", id="uncordoned"),
])
def test_a_job_told_its_quota_reason_in_the_served_flavors_is_judged_again_when_another_model_is_served(
        before: str, change: str) -> None:
    """j2 (any model) is told its queue's A100 quota is taken while no node serves H100; once one does, its
    queue's idle H100 quota serves it: every quota answer is judged on the flavors the nodes present serve."""
    scenario = parse_scenario(SERVED_FLAVOR_TAKEN.format(before=before, change=change))
    run = run_scenario(scenario, SCENARIOS)
    assert run.violations == [] and run.unmet == []
