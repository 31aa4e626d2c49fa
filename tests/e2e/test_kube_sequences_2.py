"""More sequences of events that break one of the bridge's guarantees (named in each docstring), on a real
kube-apiserver. Each test gets its own world (platform, fake kubelet, bridge, namespace), so that a bridge left
broken by one scenario would not spoil the next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import KubeWorld, gpu_pod, indexed_job, start_world, wait_seconds
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


def _world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
           nodes: int, gpus: int) -> Iterator[KubeWorld]:
    name = "adv2-" + request.node.name.removeprefix("test_").replace("_", "-")[:18].rstrip("-")
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp(name)), name, nodes=nodes, gpus=gpus)
    yield w
    w.stop()


@pytest.fixture
def small(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """One node of 8 GPUs, in a namespace of the test's own."""
    yield from _world(kube_cluster, tmp_path_factory, request, nodes=1, gpus=8)


@pytest.fixture
def pair(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
         request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """Two nodes of 8 GPUs, in a namespace of the test's own."""
    yield from _world(kube_cluster, tmp_path_factory, request, nodes=2, gpus=8)


def _node(w: KubeWorld, name: str) -> dict[str, Any]:
    return next(n for n in w.api.nodes() if n["name"] == name)


def _gpus(pod: dict[str, Any]) -> int:
    return sum(int((c.get("resources", {}).get("limits", {}) or {}).get("nvidia.com/gpu", "0"))
               for c in pod["spec"].get("containers", []))


def _bound_gpus(w: KubeWorld) -> dict[str, int]:
    by_node: dict[str, int] = {}
    for pod in w.pods().values():
        node = pod["spec"].get("nodeName")
        if node and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            by_node[node] = by_node.get(node, 0) + _gpus(pod)
    return by_node


def test_a_second_kubectl_cordon_after_a_platform_uncordon_is_mirrored(small: KubeWorld) -> None:
    """Guarantees (3) and (4): nothing hangs for ever, and a pod that waits says why. Sequence, on one node:
    `kubectl cordon` (mirrored: the platform cordons the node); an operator lifts it through the platform
    (`gpusched node uncordon`, `node_action(node, "uncordon")`); `kubectl uncordon` (nothing to mirror: the
    platform's node is schedulable already); `kubectl cordon` again; then a pod is applied. Kubernetes says
    the node is unschedulable, so the platform must learn of the new cordon (the pod then waits, saying why).
    The bridge remembers the first cordon as still sent and never mirrors the second: the platform places the
    pod on the node, the bridge refuses to bind it ("the API server says node ... is cordoned") and rolls the
    run back, and the platform places it there again, for ever, the pod saying nothing."""
    w = small
    node = f"{w.pool}-n0"
    w.kubectl("cordon", node)
    wait_for(lambda: _node(w, node)["cordon"], f"{node} was never cordoned in the platform")
    w.api.node_action(node, "uncordon", reason="done", operator="ops")
    wait_for(lambda: not _node(w, node)["cordon"], f"{node} was never uncordoned in the platform")
    w.kubectl("uncordon", node)
    wait_seconds(2.0)
    w.kubectl("cordon", node)
    w.apply(gpu_pod("stuck", gpus=1, runtime_s=300))
    wait_seconds(6.0)
    rollbacks = w.log_of("bridge").count("rolling the run back")
    assert _node(w, node)["cordon"] and rollbacks == 0, (
        f"the second `kubectl cordon` of {node} was never mirrored (platform node {_node(w, node)}); the pod was "
        f"placed there and rolled back {rollbacks} time(s); PodScheduled {w.condition('stuck', 'PodScheduled')}; "
        f"bridge log tail:\n{w.log_of('bridge')[-1500:]}")
    wait_for(lambda: (c := w.condition("stuck", "PodScheduled")) is not None and c["status"] == "False",
             lambda: f"stuck never said why it waits: {w.condition('stuck', 'PodScheduled')}", timeout=15)


def test_a_non_indexed_job_s_pods_are_bound_one_per_placed_replica(pair: KubeWorld) -> None:
    """Guarantee (1): no pod is bound to a node other than the one the platform placed it on; the pods bound to
    a node never ask for more GPUs than it has. Sequence: a non-Indexed batch/v1 Job (parallelism 2,
    completions 2) of 8 GPUs per pod, on two 8-GPU nodes: the platform places one replica on each node. The
    Job controller makes both pods at once once the Job is unsuspended; the bridge binds each to "the first
    replica whose node has fewer of the Job's pods than placed there" (`_free_slot`), counting from the pods
    as last seen, where the pod it has just bound is still unbound: both pods go to the same node (16 GPUs of
    pods on an 8-GPU node), the other node stays empty though the platform holds it for the Job."""
    w = pair
    job = indexed_job("plain", 2, 8, runtime_s=300)
    del job["spec"]["completionMode"]
    w.apply(job)
    w.wait_job_state("Job", "plain", "running", "placed", timeout=40)
    wait_for(lambda: sum(1 for p in w.pods().values() if p["spec"].get("nodeName")) >= 2,
             lambda: f"the Job's pods were never both bound: {[(n, p['spec'].get('nodeName')) for n, p in w.pods().items()]}",
             timeout=30)
    wait_seconds(1.0)
    placed = w.platform_job("Job", "plain") or {}
    by_node = _bound_gpus(w)
    assert all(used <= 8 for used in by_node.values()), (
        f"GPUs of the pods bound per node {by_node} exceed the nodes' 8; the platform placed "
        f"{[(p['node'], p['gpu_indices']) for p in placed.get('placements', [])]}; "
        f"bridge log tail:\n{w.log_of('bridge')[-1500:]}")
