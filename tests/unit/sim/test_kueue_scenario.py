"""Kueue's performance scenario as gpusched inputs: counts, schedule, gang shapes, policy and cluster files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from libs.bench.kueue_metrics import published_figures
from libs.bench.kueue_scenario import (
    CLASS_LABEL,
    ScenarioError,
    cluster_csv,
    gang_shape,
    parse_scenario,
    plan_jobs,
    policy_toml,
)
from libs.cli.bench import DEFAULT_GENERATOR
from libs.nodes.sim import load_cluster_csv
from libs.runtime.policy_file import load_policy

TINY = """
cohorts:
  - className: team
    count: 2
    queuesSets:
    - className: q
      count: 2
      nominalQuota: 8
      borrowingLimit: 4
      workloadsSets:
      - count: 3
        creationIntervalMs: 100
        workloads:
        - {className: small, runtimeMs: 200, priority: 50, request: 1}
        - {className: huge, runtimeMs: 1000, priority: 200, request: 12}
      - count: 2
        creationIntervalMs: 250
        workloads:
        - {className: medium, runtimeMs: 500, priority: 100, request: 5}
"""


def test_queues_cohorts_and_limits() -> None:
    queues = parse_scenario(TINY)
    assert [(q.name, q.cohort) for q in queues] == [("q-0-0", "team-0"), ("q-0-1", "team-0"),
                                                    ("q-1-0", "team-1"), ("q-1-1", "team-1")]
    assert {(q.nominal, q.borrowing_limit) for q in queues} == {(8, 4)}


def test_each_workload_k_is_created_at_k_intervals_in_every_queue() -> None:
    jobs = plan_jobs(parse_scenario(TINY))
    assert len(jobs) == 4 * (3 * 2 + 2)
    assert [j.at_ms for j in jobs] == sorted(j.at_ms for j in jobs)
    small = [j.at_ms for j in jobs if j.workload_class == "small" and j.spec.queue == "q-1-0"]
    medium = [j.at_ms for j in jobs if j.workload_class == "medium" and j.spec.queue == "q-1-0"]
    assert (small, medium) == ([0, 100, 200], [0, 250])
    assert len({j.job_id for j in jobs}) == len(jobs)
    first = next(j for j in jobs if j.workload_class == "medium")
    assert (first.spec.team, first.spec.priority, first.spec.duration_s, first.spec.labels) == (
        "q-0-0", "p100", 0.5, {CLASS_LABEL: "medium"})


def test_scale_multiplies_every_count_but_keeps_at_least_one() -> None:
    jobs = plan_jobs(parse_scenario(TINY, scale=0.5))
    per_queue = Counter(j.workload_class for j in jobs if j.spec.queue == "q-0-0")
    assert per_queue == {"small": 2, "huge": 2, "medium": 1}


@pytest.mark.parametrize(("request_gpus", "shape"), [(1, (1, 1)), (5, (5, 1)), (8, (8, 1)), (20, (20, 1)),
                                                     (16, (16, 1)), (12, (12, 1)), (11, (11, 1))])
def test_gang_shape_keeps_the_gpu_count_and_fits_a_node(request_gpus: int, shape: tuple[int, int]) -> None:
    assert gang_shape(request_gpus, 8) == shape


def test_a_request_larger_than_a_node_becomes_a_gang() -> None:
    huge = next(j for j in plan_jobs(parse_scenario(TINY)) if j.workload_class == "huge")
    assert (huge.spec.replicas, huge.spec.gpus) == (12, 1)


def test_policy_and_cluster_files_load(tmp_path: Path) -> None:
    queues = parse_scenario(TINY)
    (tmp_path / "policy.toml").write_text(policy_toml(queues))
    (tmp_path / "cluster.csv").write_text(cluster_csv(queues))
    policy = load_policy(tmp_path / "policy.toml")
    assert [(q.name, q.team, q.cohort, q.nominal_gpus, q.borrowing_limit_gpus) for q in policy.queues][:2] == [
        ("q-0-0", "q-0-0", "team-0", 8, 4), ("q-0-1", "q-0-1", "team-0", 8, 4)]
    assert [(c.name, c.value, c.preemptible) for c in policy.priority_classes] == [
        ("p200", 200, True), ("p100", 100, True), ("p50", 50, True)]
    nodes = load_cluster_csv(tmp_path / "cluster.csv")
    assert len(nodes) == 4 and all(len(n.gpus) == 8 for n in nodes)  # 32 GPUs of nominal quota


def test_a_malformed_generator_names_what_is_missing() -> None:
    with pytest.raises(ScenarioError, match="nominalQuota"):
        parse_scenario("cohorts:\n- {className: c, count: 1, queuesSets: [{className: q, count: 1, "
                       "workloadsSets: []}]}\n")


@pytest.mark.skipif(not DEFAULT_GENERATOR.exists(), reason="the shared Kueue data set is not next to the repo")
def test_the_kueue_baseline_is_15000_jobs_on_75_nodes() -> None:
    queues = parse_scenario(DEFAULT_GENERATOR.read_text())
    jobs = plan_jobs(queues)
    assert len(queues) == 30 and {(q.nominal, q.borrowing_limit) for q in queues} == {(20, 100)}
    assert Counter(j.workload_class for j in jobs) == {"small": 10_500, "medium": 3_000, "large": 1_500}
    assert max(j.at_ms for j in jobs) == 58_800  # the 50th large workload, 49 x 1.2 s
    assert cluster_csv(queues).count("\n") == 1 + 75
    figures = published_figures((DEFAULT_GENERATOR.parent / "README.md").read_text())
    assert figures == {"wall_time_s": 351.1, "min_queue_usage_pct": 58.7,
                       "time_to_admission_s": {"large": 6.7, "medium": 76.8, "small": 215.5}}


@pytest.mark.parametrize(("request_gpus", "replica_gpus", "shape"), [
    (20, 4, (5, 4)), (20, 5, (4, 5)), (12, 5, (3, 4)), (5, 4, (1, 5)), (5, 0, (1, 5)), (20, 0, (5, 4))])
def test_replicas_of_a_chosen_size_or_else_tiling_nodes(request_gpus: int, replica_gpus: int,
                                                        shape: tuple[int, int]) -> None:
    assert gang_shape(request_gpus, 8, replica_gpus) == shape


def test_the_virtual_bench_runs_the_scenario_through_the_deciders(tmp_path: Path) -> None:
    from libs.bench.kueue_virtual import run_virtual_bench

    generator = tmp_path / "generator.yaml"
    generator.write_text(TINY)
    result = run_virtual_bench(generator)
    assert result["jobs_completed"] == result["jobs_submitted"] > 0
    assert result["quota_violations"] == 0 and result["mode"] == "virtual"
    assert set(result["time_to_admission_s"]) == {"small", "medium", "huge"}
