"""Dynamic Resource Allocation on a real kube-apiserver (resource.k8s.io/v1) with the controller manager's claim
controller: a driver's ResourceSlices are the nodes' GPUs; a pod asking for GPUs through a claim template gets
its claim allocated to exactly the GPUs the platform placed it on, reserved for it, before it is bound; two pods
never get the same device."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import KubeWorld, claim_template, device_class, dra_pod, resource_slice, start_world
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-dra")), "dra", nodes=2, gpus=0)
    yield w
    w.stop()


def _node(w: KubeWorld, name: str) -> dict[str, Any] | None:
    return next((n for n in w.api.nodes() if n["name"] == name), None)


def _claim_of(w: KubeWorld, pod: str) -> dict[str, Any] | None:
    statuses = (w.get("pod", pod) or {}).get("status", {}).get("resourceClaimStatuses", [])
    name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == "gpus"), None)
    return w.get("resourceclaim", name) if name else None


def test_claims_are_allocated_to_the_gpus_the_platform_placed(world: KubeWorld) -> None:
    w = world
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(device_class()))
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(resource_slice("dra-n0", 8)))
    wait_for(lambda: (n := _node(w, "dra-n0")) is not None and n["gpus"] == 8 and n["models"] == ["H100"],
             lambda: f"the slice's devices never became the node's GPUs: {w.api.nodes()}", timeout=30)
    w.apply(claim_template("two-gpus", 2), claim_template("three-gpus", 3))
    w.apply(dra_pod("first", "two-gpus"), dra_pod("second", "three-gpus"))
    used: dict[str, str] = {}
    for name, count in (("first", 2), ("second", 3)):
        w.wait_phase(name, "Running", timeout=40)
        job = w.wait_job_state("Pod", name, "running")
        placement = job["placements"][0]
        assert job["spec"]["gpus"] == count and len(placement["gpu_indices"]) == count
        claim = _claim_of(w, name)
        assert claim is not None
        devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        assert devices == [f"gpu-{i}" for i in placement["gpu_indices"]]  # exactly the GPUs placed
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [name]
        for device in devices:
            assert device not in used, f"{device} given to {used.get(device)} and {name}"
            used[device] = name


def test_gpu_fractions_are_shares_of_the_device_placed_each_with_its_own_share(world: KubeWorld) -> None:
    """A fraction (gpusched.io/gpu-milli) asks for one device through a claim with a capacity request; on a driver
    that shares its devices (allowMultipleAllocations), each claim is one share (its own shareID and consumed
    memory) of exactly the device the platform placed the fraction on, and no device is shared past one GPU."""
    w = world
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(device_class()))
    w.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(
        resource_slice("dra-n1", 2, product="NVIDIA-A100-SXM4-80GB", shareable=True)))
    wait_for(lambda: (n := _node(w, "dra-n1")) is not None and n["gpus"] == 2, "dra-n1's devices never registered",
             timeout=30)
    w.apply(claim_template("half", 1, memory="40Gi"))
    names = [f"half-{i}" for i in range(3)]
    for name in names:
        pod = dra_pod(name, "half")
        pod["metadata"]["annotations"].update({"gpusched.io/gpu-milli": "500", "gpusched.io/gpu-models": "A100"})
        w.apply(pod)
    shares: dict[str, list[str]] = {}
    for name in names:
        w.wait_phase(name, "Running", timeout=40)
        job = w.wait_job_state("Pod", name, "running")
        (placement,) = job["placements"]
        assert placement["node"] == "dra-n1" and placement["gpu_milli"] == 500
        claim = _claim_of(w, name)
        assert claim is not None
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == f"gpu-{placement['gpu_indices'][0]}"  # the device placed, no other
        assert result["consumedCapacity"] == {"memory": "40Gi"} and result["shareID"]
        shares.setdefault(result["device"], []).append(result["shareID"])
    assert sorted(len(s) for s in shares.values()) == [1, 2]  # two halves share one device, the third the other
    assert all(len(set(s)) == len(s) for s in shares.values())
