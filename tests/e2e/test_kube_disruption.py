"""Disruptions through the bridge on a real kube-apiserver: a checkpointing pod preempted through the Eviction
API keeps its work (with a PodDisruptionBudget that refuses, by the stated rule); an Indexed Job preempted back
to suspended and run again; cordon, uncordon, a node NotReady and a node deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.kube.client import KubeClient, KubeConfig
from libs.kube.devcluster import DevCluster
from libs.kube.fake_kubelet import set_ready
from tests.e2e.kube_harness import KubeWorld, gpu_pod, indexed_job, start_world
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e
CHECKPOINTS = {"gpusched.io/sim-checkpoint-on-signal": "true"}


@pytest.fixture(scope="module")
def one_node(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-preempt")), "pre", nodes=1, gpus=8)
    yield w
    w.stop()


def _preempt_low_for_high(w: KubeWorld, low: str, high: str) -> None:
    w.apply(gpu_pod(low, gpus=8, runtime_s=300, priority="batch", notes=CHECKPOINTS,
                    labels={"app": low}))
    w.wait_phase(low, "Running")
    w.apply(gpu_pod(high, gpus=8, runtime_s=2, priority="urgent"))


def test_preemption_evicts_a_checkpointing_pod_which_resumes_from_its_checkpoint(one_node: KubeWorld) -> None:
    w = one_node
    _preempt_low_for_high(w, "low", "high")
    w.wait_phase("high", "Running", "Succeeded", timeout=40)
    evicted = wait_for(lambda: (j := w.platform_job("Pod", "low")) is not None and j["evictions"] >= 1 and j,
                       "the low-priority job was never evicted", timeout=30)
    assert evicted["progress_s"] > 0  # the checkpoint its pod wrote on SIGTERM is the job's
    # The high one ends; the low one's pod is made again, bound, and resumes from its checkpoint.
    w.wait_job_state("Pod", "high", "succeeded", timeout=30)
    w.wait_phase("low", "Running", timeout=40)
    again = w.get("pod", "low") or {}
    notes = again["metadata"]["annotations"]
    assert notes["gpusched.io/resume-checkpoint"].startswith("ckpt-")
    assert float(notes["gpusched.io/resume-progress-s"]) > 0
    w.kubectl("delete", "pod", "low", "-n", w.namespace, "--wait=false")
    w.wait_job_state("Pod", "low", "cancelled")


def test_a_disruption_budget_that_refuses_is_overridden_after_the_stated_wait(one_node: KubeWorld) -> None:
    w = one_node
    w.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-guarded"},
             "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    _preempt_low_for_high(w, "guarded", "boss")
    wait_for(lambda: any(e["reason"] == "DisruptionBudgetOverridden" for e in w.events_of("guarded")),
             lambda: f"no override event: {[e['reason'] for e in w.events_of('guarded')]}", timeout=40)
    w.wait_job_state("Pod", "boss", "running", "succeeded", timeout=30)
    disruption = w.condition("guarded", "DisruptionTarget")
    assert disruption is None or disruption["status"] == "True"
    w.wait_job_state("Pod", "boss", "succeeded", timeout=30)
    w.wait_phase("guarded", "Running", timeout=40)  # made again, and back
    w.kubectl("delete", "pod", "guarded", "-n", w.namespace, "--wait=false")
    w.wait_job_state("Pod", "guarded", "cancelled", timeout=30)


def test_an_indexed_job_is_preempted_back_to_suspended_and_runs_again(one_node: KubeWorld) -> None:
    w = one_node
    w.apply(indexed_job("slow", 2, 4, runtime_s=300, priority="batch", checkpoints=True))
    w.wait_job_state("Job", "slow", "running", timeout=40)
    w.apply(gpu_pod("vip", gpus=8, runtime_s=2, priority="urgent"))
    wait_for(lambda: (j := w.platform_job("Job", "slow")) is not None and j["evictions"] >= 1,
             "the Job was never evicted", timeout=40)
    assert (w.get("job", "slow") or {})["spec"]["suspend"] is True
    w.wait_job_state("Pod", "vip", "succeeded", timeout=30)
    w.wait_job_state("Job", "slow", "running", timeout=40)
    assert (w.get("job", "slow") or {})["spec"]["suspend"] is False
    w.kubectl("delete", "job", "slow", "-n", w.namespace, "--wait=false")
    w.wait_job_state("Job", "slow", "cancelled", timeout=30)


@pytest.fixture(scope="module")
def two_nodes(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-nodes")), "nd", nodes=2, gpus=4)
    yield w
    w.stop()


def _node(w: KubeWorld, name: str) -> dict[str, object]:
    return next(n for n in w.api.nodes() if n["name"] == name)


async def _set_ready(w: KubeWorld, node: str, ready: bool) -> None:
    client = KubeClient(KubeConfig.from_kubeconfig(w.cluster.kubeconfig()))
    try:
        await set_ready(client, node, ready)
    finally:
        await client.close()


def test_cordon_and_uncordon_follow_the_node(two_nodes: KubeWorld) -> None:
    w = two_nodes
    w.kubectl("cordon", "nd-n0")
    wait_for(lambda: _node(w, "nd-n0")["cordon"], "nd-n0 was never cordoned in the platform")
    w.apply(gpu_pod("avoid-cordon", gpus=1, runtime_s=1))
    w.wait_phase("avoid-cordon", "Running", "Succeeded")
    assert w.node_of("avoid-cordon") == "nd-n1"
    w.kubectl("uncordon", "nd-n0")
    wait_for(lambda: not _node(w, "nd-n0")["cordon"], "nd-n0 was never uncordoned in the platform")


def test_a_platform_drain_evicts_the_node_s_pods_and_a_schedulable_node_does_not_undo_it(two_nodes: KubeWorld) -> None:
    w = two_nodes
    w.apply(gpu_pod("drained", gpus=4, runtime_s=300, notes={"gpusched.io/sim-checkpoint-on-signal": "true"}))
    w.wait_phase("drained", "Running")
    first = w.node_of("drained")
    other = "nd-n1" if first == "nd-n0" else "nd-n0"
    w.api.node_action(first, "drain", reason="maintenance", operator="ops")
    wait_for(lambda: w.node_of("drained") == other and w.phase_of("drained") == "Running",
             lambda: f"drained never ran again on {other}: on {w.node_of('drained')!r}", timeout=40)
    job = w.platform_job("Pod", "drained")
    assert job is not None and job["evictions"] == 1 and job["progress_s"] > 0
    assert _node(w, first)["cordon"]  # the Node is schedulable in Kubernetes; the operator's drain stands
    w.api.node_action(first, "uncordon", operator="ops")
    wait_for(lambda: not _node(w, first)["cordon"], f"{first} was never uncordoned")
    w.kubectl("delete", "pod", "drained", "-n", w.namespace, "--wait=false")
    w.wait_job_state("Pod", "drained", "cancelled", timeout=30)


def test_a_node_not_ready_then_deleted_moves_its_pods_elsewhere(two_nodes: KubeWorld) -> None:
    w = two_nodes
    w.apply(gpu_pod("mover", gpus=4, runtime_s=300))
    w.wait_phase("mover", "Running")
    first = w.node_of("mover")
    other = "nd-n1" if first == "nd-n0" else "nd-n0"
    asyncio.run(_set_ready(w, first, False))
    wait_for(lambda: not _node(w, first)["online"], f"{first} never lost in the platform")
    wait_for(lambda: w.node_of("mover") == other and w.phase_of("mover") == "Running",
             lambda: f"mover never ran again on {other}: on {w.node_of('mover')!r}, {w.phase_of('mover')}",
             timeout=40)
    job = w.platform_job("Pod", "mover")
    assert job is not None and job["evictions"] == 1, job
    # The node comes back, and the other one is deleted: the pod moves back.
    asyncio.run(_set_ready(w, first, True))
    wait_for(lambda: _node(w, first)["online"], f"{first} never came back")
    w.kubectl("delete", "node", other)
    wait_for(lambda: w.node_of("mover") == first and w.phase_of("mover") == "Running",
             lambda: f"mover never ran again on {first}: on {w.node_of('mover')!r}", timeout=40)
    w.kubectl("delete", "pod", "mover", "-n", w.namespace, "--wait=false")
    w.wait_job_state("Pod", "mover", "cancelled", timeout=30)
