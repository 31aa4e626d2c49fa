"""The bridge against a real kube-apiserver: pods, gangs and Indexed Jobs bound where the platform placed them,
run by fake kubelets, and ended; a gang that does not fit bound not at all, every member saying why; refusals
and waits visible where `kubectl describe` looks (a pod over its queue's quota waits saying so, and is bound once
the quota is raised); exit codes; users deleting pods and Jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import POLICY, KubeWorld, gang, gpu_pod, indexed_job, start_world
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-workloads")), "wl", nodes=3, gpus=8)
    yield w
    w.stop()


def test_a_gpu_pod_is_bound_runs_and_succeeds(world: KubeWorld) -> None:
    world.apply(gpu_pod("single", gpus=2, runtime_s=2))
    world.wait_phase("single", "Running")
    running = world.wait_job_state("Pod", "single", "running")
    node = world.node_of("single")
    assert node.startswith("wl-n")
    assert [p["node"] for p in running["placements"]] == [node]  # bound where the platform placed it
    world.wait_phase("single", "Succeeded")
    world.wait_job_state("Pod", "single", "succeeded")
    reasons = [e["reason"] for e in world.events_of("single")]
    assert "Scheduled" in reasons


def test_a_gang_that_fits_is_bound_whole_and_one_that_does_not_is_bound_not_at_all(world: KubeWorld) -> None:
    world.apply(*gang("big", 3, 8, runtime_s=8))
    for i in range(3):
        world.wait_phase(f"big-{i}", "Running")
    assert len({world.node_of(f"big-{i}") for i in range(3)}) == 3
    # The cluster is full: a second gang of two waits, none of its members bound, each saying why.
    world.apply(*gang("late", 2, 8, runtime_s=1))
    for i in range(2):
        wait_for(lambda i=i: (c := world.condition(f"late-{i}", "PodScheduled")) is not None
                 and c["status"] == "False" and c["reason"] not in ("gang_incomplete", ""),
                 lambda i=i: f"late-{i} never said why it waits: {world.condition(f'late-{i}', 'PodScheduled')}")
        assert world.node_of(f"late-{i}") == ""
    described = world.kubectl("describe", "pod", "late-0", "-n", world.namespace)
    assert "FailedScheduling" in described and "gpusched" in described
    # Once the first gang ends, the second is bound whole.
    for i in range(2):
        world.wait_phase(f"late-{i}", "Succeeded", timeout=40)
    world.wait_job_state("PodGroup", "late", "succeeded")


def test_a_pod_that_can_never_run_is_refused_visibly(world: KubeWorld) -> None:
    world.apply(gpu_pod("no-queue", queue=""), gpu_pod("too-big", gpus=9), gpu_pod("unknown-queue", queue="nope"))
    for name, code in (("no-queue", "no_queue"), ("too-big", "exceeds_node_capacity"),
                       ("unknown-queue", "unknown_queue")):
        wait_for(lambda name=name: (c := world.condition(name, "PodScheduled")) is not None and c["status"] == "False"
                 and c["reason"] != "", lambda name=name: f"{name} never refused: {world.get('pod', name)}")
        condition = world.condition(name, "PodScheduled")
        assert condition is not None
        assert condition["reason"].startswith(code.split("_")[0]), (name, condition)
        assert any(code.split("_")[0] in e["message"] for e in world.events_of(name)), world.events_of(name)
        assert world.node_of(name) == ""


def test_a_pod_over_its_queues_quota_waits_saying_why_and_is_bound_once_the_quota_is_raised(
        kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert "nominal_gpus = 64" in POLICY
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-ceiling")), "ceiling", nodes=1, gpus=8,
                    policy=POLICY.replace("nominal_gpus = 64", "nominal_gpus = 2"))
    try:
        w.apply(gpu_pod("over", gpus=4))
        wait_for(lambda: (c := w.condition("over", "PodScheduled")) is not None and c["status"] == "False"
                 and c["reason"] == "queue_ceiling",
                 lambda: f"over never said why: {w.condition('over', 'PodScheduled')}", timeout=30)
        condition = w.condition("over", "PodScheduled")
        assert condition is not None and "raise queue q's quota" in condition["message"], condition
        assert w.node_of("over") == ""
        w.api.put_queue("q", {"name": "q", "team": "t", "nominal_gpus": 8})
        w.wait_phase("over", "Running", timeout=30)
    finally:
        w.stop()


def test_exit_codes_fail_the_job_and_137_is_retried(world: KubeWorld) -> None:
    world.apply(gpu_pod("exit-1", runtime_s=0.5, exit_code=1, priority="batch"))
    failed = world.wait_job_state("Pod", "exit-1", "failed")
    assert failed["exit_code"] == 1 and failed["retries"] == 0
    # 137 (killed): the platform retries it, the bridge makes the pod again, and it runs once more.
    world.apply(gpu_pod("exit-137", runtime_s=0.5, exit_code=137, priority="batch"))
    final = world.wait_job_state("Pod", "exit-137", "failed", timeout=60)
    assert final["retries"] == 2 and final["exit_code"] == 137


def test_a_user_deleting_a_pod_or_a_job_cancels_it(world: KubeWorld) -> None:
    world.apply(gpu_pod("doomed", runtime_s=300), indexed_job("doomed-job", 2, 1, runtime_s=300))
    world.wait_phase("doomed", "Running")
    wait_for(lambda: world.platform_job("Job", "doomed-job") is not None
             and world.platform_job("Job", "doomed-job")["state"] == "running",  # type: ignore[index]
             "the Job never ran")
    world.kubectl("delete", "pod", "doomed", "-n", world.namespace, "--wait=false")
    world.kubectl("delete", "job", "doomed-job", "-n", world.namespace, "--wait=false")
    world.wait_job_state("Pod", "doomed", "cancelled")
    world.wait_job_state("Job", "doomed-job", "cancelled")


def test_a_suspended_indexed_job_is_unsuspended_and_each_index_bound_where_placed(world: KubeWorld) -> None:
    world.apply(indexed_job("idx", 2, 4, runtime_s=2))
    job = world.wait_job_state("Job", "idx", "running", "succeeded", timeout=40)
    by_index = {p["replica"]: p["node"] for p in job["placements"]}
    pods = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["spec"].get("nodeName")
            for p in world.pods().values() if p["metadata"]["name"].startswith("idx-")}
    assert {int(i): n for i, n in pods.items()} == by_index
    world.wait_job_state("Job", "idx", "succeeded", timeout=40)
    assert (world.get("job", "idx") or {})["spec"]["suspend"] is False
