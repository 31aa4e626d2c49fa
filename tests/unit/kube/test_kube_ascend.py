"""Ascend NPUs through Kubernetes, by the Ascend device plugin's names: an Ascend server's Node becomes NPUs in
HCCS rings, a pod asking `huawei.com/Ascend910` a job of whole NPUs, and the binding names the NPUs chosen."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from libs.kube import bodies
from libs.kube.ascend import chosen_devices
from libs.kube.fake_kubelet import ascend_node_body, node_body
from libs.kube.nodes import node_spec
from libs.kube.workloads import Refusal, job_spec
from tests.e2e.kube_harness import gpu_pod

VERSION = "1.37.0"


def npu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["containers"][0]["resources"]["limits"] = limits
    return pod


def spec_of(pod: dict[str, Any]) -> Any:
    return job_spec(pod, pod["spec"], 1, {"q": "team-a"}, "Pod")


@pytest.mark.parametrize(("chip", "model", "groups"), [
    ("910A", "Ascend910", [0, 0, 0, 0, 1, 1, 1, 1]),
    ("910B3", "Ascend910B", [0] * 8),
])
def test_an_ascend_server_s_node_is_npus_in_hccs_rings(chip: str, model: str, groups: list[int]) -> None:
    node = ascend_node_body("npu-1", 8, chip=chip)
    kubernetes_validate.validate(node, VERSION, strict=True)
    spec = node_spec(node)
    assert [(g.model, g.kind, g.vendor) for g in spec.gpus] == [(model, "npu", "huawei")] * 8
    assert [g.hccs_group for g in spec.gpus] == groups


def test_without_the_chip_label_the_server_type_or_the_resource_names_the_model() -> None:
    node = ascend_node_body("npu-1", 8)
    del node["metadata"]["labels"]["node.kubernetes.io/npu.chip.name"]
    assert node_spec(node).gpus[0].model == "Ascend910"
    node["metadata"]["labels"]["accelerator-type"] = "module-910b-8"
    assert node_spec(node).gpus[0].model == "Ascend910B"


def test_a_gpu_node_has_no_npus() -> None:
    assert {g.kind for g in node_spec(node_body("g", 8)).gpus} == {"gpu"}


def test_a_pod_of_whole_npus_may_run_on_any_910_generation() -> None:
    spec = spec_of(npu_pod("p", {"huawei.com/Ascend910": "4"}))
    assert (spec.gpus, spec.gpu_models, spec.mig_profile) == (4, ("Ascend910*",), "")
    named = npu_pod("p", {"huawei.com/Ascend910": "2"})
    named["metadata"]["annotations"]["gpusched.io/gpu-models"] = "Ascend910B"
    assert spec_of(named).gpu_models == ("Ascend910B",)


def test_a_vnpu_resource_is_one_template() -> None:
    spec = spec_of(npu_pod("v", {"huawei.com/Ascend910-4c": "1"}))
    assert (spec.gpus, spec.mig_profile, spec.gpu_models[0]) == (1, "vir04", "Ascend910*")


@pytest.mark.parametrize(("limits", "code"), [
    ({"huawei.com/Ascend910": "1", "nvidia.com/gpu": "1"}, "mixed_vendors"),
    ({"huawei.com/Ascend910": "1", "huawei.com/Ascend910-4c": "1"}, "invalid_npu_request"),
])
def test_a_replica_asking_two_kinds_of_device_is_refused(limits: dict[str, str], code: str) -> None:
    refusal = spec_of(npu_pod("bad", limits))
    assert isinstance(refusal, Refusal) and refusal.code == code


def test_the_binding_names_the_npus_chosen_for_the_device_plugin() -> None:
    pod = npu_pod("p", {"huawei.com/Ascend910": "2"})
    notes = chosen_devices(pod["spec"], 0, (4, 5))
    assert notes == {"huawei.com/Ascend910": "Ascend910-4,Ascend910-5"}
    body = bodies.binding("ns", "p", "npu-1", "run-1", notes)
    assert body["metadata"]["annotations"]["huawei.com/Ascend910"] == "Ascend910-4,Ascend910-5"
    assert chosen_devices(gpu_pod("g")["spec"], 0, (0,)) == {}


def test_a_910_family_pattern_matches_every_910_generation_and_nothing_else() -> None:
    from libs.core.kernel.accelerators import kinds_named, model_matches

    assert [model_matches(("Ascend910*",), m) for m in ("Ascend910", "Ascend910B", "Ascend910C", "Ascend310P",
                                                         "A100")] == [True, True, True, False, False]
    assert kinds_named(("Ascend910*",)) == frozenset({"npu"})
