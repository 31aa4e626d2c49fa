"""More sequences of events that once broke one of the bridge's guarantees (named in each docstring), on a real
kube-apiserver. Each test gets its own world (platform, fake kubelet, bridge, namespace), so that a bridge left
broken by one scenario would not spoil the next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import (
    KubeWorld,
    claim_template,
    device_class,
    dra_pod,
    gpu_pod,
    resource_slice,
    start_world,
    wait_seconds,
)
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
def dra(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """One node whose 8 GPUs a DRA driver publishes (no device-plugin GPUs), in a namespace of the test's own."""
    for world in _world(kube_cluster, tmp_path_factory, request, nodes=1, gpus=0):
        _publish_gpus(world)
        yield world


def _publish_gpus(w: KubeWorld) -> None:
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(device_class()))
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(resource_slice(f"{w.pool}-n0", 8)))
    wait_for(lambda: _node(w, f"{w.pool}-n0")["gpus"] == 8,
             lambda: f"the slice's devices never became the node's GPUs: {w.api.nodes()}", timeout=30)


def _node(w: KubeWorld, name: str) -> dict[str, Any]:
    return next(n for n in w.api.nodes() if n["name"] == name)


def test_a_second_kubectl_cordon_after_a_platform_uncordon_is_mirrored(small: KubeWorld) -> None:
    """Guarantees (3) and (4): nothing hangs for ever, and a pod that waits says why. Sequence, on one node:
    `kubectl cordon` (mirrored: the platform cordons the node); an operator lifts it through the platform
    (`gpusched node uncordon`, `node_action(node, "uncordon")`); `kubectl uncordon` (nothing to mirror: the
    platform's node is schedulable already); `kubectl cordon` again; then a pod is applied. Kubernetes says
    the node is unschedulable, so the platform learns of the new cordon (the bridge mirrors Kubernetes' cordon
    by its transitions) and the pod waits, saying why, never placed on the node in a loop of rollbacks."""
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


def _claim_devices(w: KubeWorld, pod: str) -> list[str]:
    statuses = (w.get("pod", pod) or {}).get("status", {}).get("resourceClaimStatuses", []) or []
    out: list[str] = []
    for status in statuses:
        name = status.get("resourceClaimName") or ""
        claim = w.get("resourceclaim", name) if name else None
        allocation = ((claim or {}).get("status", {}) or {}).get("allocation") or {}
        out += [r["device"] for r in (allocation.get("devices", {}) or {}).get("results", [])]
    return out


def test_a_gang_member_whose_claim_template_is_missing_never_holds_gpus_silently(dra: KubeWorld) -> None:
    """Guarantees (3) and (4): nothing hangs for ever holding capacity, and a pod that can never run says why.
    Sequence: a gang of two DRA pods (gpusched.io/gang, size 2) where `typo-0` asks for its GPU through the
    claim template `one` and `typo-1` through `onee`, which does not exist (a typo). The claim controller can
    never make typo-1's claim. A gang's members must be alike, their DRA claims included: the gang is refused
    with a reason on each member and holds no GPUs."""
    w = dra
    w.apply(claim_template("one", 1))
    members = []
    for i, template in enumerate(("one", "onee")):
        pod = dra_pod(f"typo-{i}", template)
        pod["metadata"]["labels"]["gpusched.io/gang"] = "typo"
        pod["metadata"]["annotations"]["gpusched.io/gang-size"] = "2"
        members.append(pod)
    w.apply(*members)
    wait_seconds(8.0)
    job = w.platform_job("PodGroup", "typo") or {}
    node = _node(w, f"{w.pool}-n0")
    conditions = {f"typo-{i}": w.condition(f"typo-{i}", "PodScheduled") for i in range(2)}
    bound = {f"typo-{i}": w.node_of(f"typo-{i}") for i in range(2)}
    placed = [(p["node"], p["gpu_indices"]) for p in job.get("placements", [])]
    assert not (placed and not all(bound.values())), (
        f"the gang is {job.get('state')}/{job.get('phase')} on {placed} "
        f"holding {node['allocated_gpus']} GPU(s), its members unbound ({bound}) for ever; typo-0's claim holds "
        f"{_claim_devices(w, 'typo-0')}; PodScheduled: {conditions}")
    assert any(c is not None and c["status"] == "False" and "onee" in c.get("message", "")
               for c in conditions.values()), f"no member says why: {conditions}"
