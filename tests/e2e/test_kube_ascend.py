"""Ascend NPUs through a real kube-apiserver, by the Ascend device plugin's names: an Ascend server's Node
registers as NPUs in HCCS rings beside a GPU node; a pod asking `huawei.com/Ascend910` is bound to the Ascend
server with the NPUs chosen (inside one ring) annotated for the device plugin, and a pod asking GPUs never goes
there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import KubeWorld, gpu_pod, start_world

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-ascend")), "asc", nodes=1, gpus=8, ascend=1)
    yield w
    w.stop()


def npu_pod(name: str, npus: int, runtime_s: float) -> dict[str, Any]:
    pod = gpu_pod(name, runtime_s=runtime_s)
    pod["spec"]["containers"][0]["resources"]["limits"] = {"huawei.com/Ascend910": str(npus)}
    return pod


def test_the_ascend_server_registers_as_npus(world: KubeWorld) -> None:
    nodes = {n["name"]: n for n in world.api.nodes()}
    assert nodes["asc-nascend-0"]["models"] == ["Ascend910"] and nodes["asc-nascend-0"]["gpus"] == 8
    assert nodes["asc-n0"]["models"] == ["A100"]


def test_npu_pods_go_to_the_ascend_server_inside_one_ring_and_gpu_pods_do_not(world: KubeWorld) -> None:
    world.apply(npu_pod("npu-two", 2, runtime_s=30), npu_pod("npu-four", 4, runtime_s=30),
                gpu_pod("gpu-one", gpus=1, runtime_s=30))
    for pod in ("npu-two", "npu-four", "gpu-one"):
        world.wait_phase(pod, "Running")
    assert world.node_of("npu-two") == world.node_of("npu-four") == "asc-nascend-0"
    assert world.node_of("gpu-one") == "asc-n0"
    rings = []
    for pod, count in (("npu-two", 2), ("npu-four", 4)):
        found = world.get("pod", pod) or {}
        chosen = found["metadata"]["annotations"]["huawei.com/Ascend910"].split(",")
        indices = [int(name.removeprefix("Ascend910-")) for name in chosen]
        assert len(indices) == count and len({i // 4 for i in indices}) == 1  # one HCCS ring each
        rings.append(indices[0] // 4)
    assert rings[0] != rings[1]  # the 4-NPU pod took the whole ring the 2-NPU pod left
