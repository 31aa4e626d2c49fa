"""Sequences of events that once broke one of the bridge's guarantees (named in each docstring), on a real
kube-apiserver. Each test gets its own world (platform, fake kubelet, bridge, namespace), so that a bridge left
broken by one scenario would not spoil the next."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts import GpuSpec, NodeRegistered, NodeSpec
from libs.bus.jetstream import Bus, BusConfig
from libs.core.node_health.announcements import registration_id
from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import KubeWorld, gpu_pod, start_world, wait_seconds
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def small(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """One node of 8 GPUs, in a namespace of the test's own."""
    name = "adv-" + request.node.name.removeprefix("test_").replace("_", "-")[:20].rstrip("-")
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp(name)), name, nodes=1, gpus=8)
    yield w
    w.stop()


def _jobs_named(w: KubeWorld, kind: str, name: str) -> list[dict[str, Any]]:
    out = []
    for job in w.api.jobs():
        labels = (job.get("spec") or {}).get("labels", {})
        if labels.get("kubernetes.io/kind") == kind and labels.get("kubernetes.io/name") == name \
                and labels.get("kubernetes.io/namespace") == w.namespace:
            out.append(job)
    return out


def _gpus(pod: dict[str, Any]) -> int:
    return sum(int((c.get("resources", {}).get("limits", {}) or {}).get("nvidia.com/gpu", "0"))
               for c in pod["spec"].get("containers", []))


def test_a_pod_made_again_under_the_same_name_after_its_job_ended_is_a_new_job(small: KubeWorld) -> None:
    """Guarantees (2) and (4): every gpusched pod becomes exactly one platform job, and a pod that waits says
    why. Sequence: pod `again` runs and succeeds (its job ends); the user deletes it and applies the same
    manifest again (an everyday `kubectl delete` + `kubectl apply`). The new pod (a new uid, no
    gpusched.io/job-id annotation) is a new platform job and runs: a pod is its job's by identity (uid, or the
    job id a pod the bridge made again carries), never by name alone."""
    w = small
    w.apply(gpu_pod("again", gpus=1, runtime_s=1))
    w.wait_phase("again", "Succeeded")
    w.wait_job_state("Pod", "again", "succeeded")
    w.kubectl("delete", "pod", "again", "-n", w.namespace)  # waits until it is gone
    w.apply(gpu_pod("again", gpus=1, runtime_s=1))
    wait_for(lambda: len(_jobs_named(w, "Pod", "again")) == 2,
             lambda: f"the re-created pod was never submitted: platform jobs {_jobs_named(w, 'Pod', 'again')}; "
             f"pod phase {w.phase_of('again')}, PodScheduled {w.condition('again', 'PodScheduled')}; "
             f"bridge log tail:\n{w.log_of('bridge')[-2000:]}", timeout=20)
    w.wait_phase("again", "Succeeded", timeout=30)


def test_a_pod_deleted_while_the_bridge_is_down_ends_its_job(small: KubeWorld) -> None:
    """Guarantees (2) and (3): a pod the user deletes ends its job (cancelled), and a job whose pods are gone
    does not hang holding its capacity. Sequence: pod `held` (8 GPUs) runs; the bridge is killed (SIGKILL, as
    an OOM kill or a node reboot would; SIGTERM is the same); the user deletes the pod; the bridge starts
    again. Its informers' first lists no longer hold the pod, so no deletion will ever be seen: the restarted
    bridge cancels the job whose objects are missing, and its 8 GPUs serve the next pod."""
    w = small
    w.apply(gpu_pod("held", gpus=8, runtime_s=300))
    w.wait_phase("held", "Running")
    w.wait_job_state("Pod", "held", "running")
    w.kill("bridge", signal.SIGKILL)
    w.kubectl("delete", "pod", "held", "-n", w.namespace)  # the fake kubelet stops it; waits until it is gone
    assert w.phase_of("held") == "gone"
    w.start_bridge()
    w.apply(gpu_pod("next", gpus=8, runtime_s=1))
    w.wait_job_state("Pod", "held", "cancelled", "failed", "succeeded", timeout=30)
    w.wait_phase("next", "Running", "Succeeded", timeout=30)


def test_a_gang_whose_members_ask_for_different_gpus_never_overcommits_a_node(small: KubeWorld) -> None:
    """Guarantee (1): no GPU is allocated twice; the pods bound to a node never ask for more GPUs than it has.
    Sequence: a gang of two (gpusched.io/gang, size 2) whose member `mix-0` asks for 1 GPU and `mix-1` for
    8, on a cluster of one 8-GPU node. A job's replicas are alike: a gang whose members differ is refused
    (`gang_members_differ`), never submitted with the first member's size for all."""
    w = small
    members = [gpu_pod(f"mix-{i}", gpus=g, runtime_s=300, labels={"gpusched.io/gang": "mix"},
                       notes={"gpusched.io/gang-size": "2"}) for i, g in enumerate((1, 8))]
    w.apply(*members)
    # Either it is refused / waits saying why, or (were the sizes honoured) it can never be bound whole.
    wait_for(lambda: any(w.condition(f"mix-{i}", "PodScheduled") is not None for i in range(2))
             or any(w.node_of(f"mix-{i}") for i in range(2)), "the gang neither waited nor was bound", timeout=30)
    wait_seconds(3.0)  # let a placement, if any, be carried out
    by_node: dict[str, int] = {}
    for pod in w.pods().values():
        node = pod["spec"].get("nodeName")
        if node and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            by_node[node] = by_node.get(node, 0) + _gpus(pod)
    job = w.platform_job("PodGroup", "mix")
    assert all(used <= 8 for used in by_node.values()), (
        f"GPUs requested by the pods bound per node {by_node} exceed the nodes' 8; the platform job asks for "
        f"{(job or {}).get('spec', {}).get('replicas', 1)} x {(job or {}).get('spec', {}).get('gpus', 1)} GPU(s)")
    for i in range(2):
        condition = w.condition(f"mix-{i}", "PodScheduled")
        assert condition is not None and condition["status"] == "False" and condition["reason"], condition


def test_a_gang_size_of_zero_is_refused_and_does_not_stop_the_bridge(small: KubeWorld) -> None:
    """Guarantees (4) and (3): a pod that can never run says why, and nothing is left hanging. Sequence: a
    user applies one pod labelled `gpusched.io/gang: zero` with `gpusched.io/gang-size: "0"` (a typo; the
    same with Kueue's `pod-group-total-count: "0"`), then an ordinary pod `after`. `zero` is refused
    (`invalid_gang_size`), `after` runs; and one object an informer's handler cannot take is logged and passed
    over, never stopping the informer (and with it every other pod)."""
    w = small
    w.apply(gpu_pod("zero", gpus=1, runtime_s=1, labels={"gpusched.io/gang": "zero"},
                    notes={"gpusched.io/gang-size": "0"}))
    w.apply(gpu_pod("after", gpus=1, runtime_s=1))
    w.wait_phase("after", "Running", "Succeeded", timeout=30)
    assert w.procs["bridge"].poll() is None, f"the bridge died:\n{w.log_of('bridge')[-3000:]}"
    wait_for(lambda: (c := w.condition("zero", "PodScheduled")) is not None and c["status"] == "False"
             and c["reason"], lambda: f"zero never said why: {w.condition('zero', 'PodScheduled')}", timeout=20)


async def _register_ghost(w: KubeWorld, name: str) -> None:
    spec = NodeSpec(name=name, gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))
    bus = await Bus.connect(BusConfig(url=w.env["NATS_URL"], stream="GPUSCHED", subject_prefix="gs"))
    try:
        await bus.publish([NodeRegistered(id=registration_id(spec, 1), ts=0.0, source="node-telemetry", node=spec)])
    finally:
        await bus.close()


def test_a_node_the_log_holds_but_the_cluster_does_not_is_lost_once_the_bridge_starts(
        kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Guarantee (3): nothing waits for ever on a node nobody serves. Sequence: the log already holds a node of
    another cluster (the simulated demo run before in the same folder), with 8 GPUs; the bridge starts against a
    Kubernetes cluster that has no such node. The bridge declares it lost, and a pod runs on a real node."""
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("adv-ghost")), "adv-ghost", nodes=1, gpus=8,
                    bridge=False)
    try:
        asyncio.run(_register_ghost(w, "ghost-0"))
        wait_for(lambda: any(n["name"] == "ghost-0" for n in w.api.nodes()), "the ghost never registered")
        w.start_bridge()
        wait_for(lambda: not next(n for n in w.api.nodes() if n["name"] == "ghost-0")["online"],
                 lambda: f"the ghost node was never lost: {w.api.nodes()}", timeout=30)
        w.apply(gpu_pod("real", gpus=8, runtime_s=1))
        w.wait_phase("real", "Succeeded", timeout=40)
        assert w.node_of("real") == "adv-ghost-n0"
    finally:
        w.stop()
