"""Kubernetes objects to the platform's terms and back, checked against the official schemas of the release
the tests run (kubernetes-validate): Nodes to inventory, Pods and Jobs to job specs or refusals, and every body
the bridge sends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from libs.kube import bodies
from libs.kube.fake_kubelet import node_body
from libs.kube.nodes import TopologyLabels, is_ready, is_unschedulable, model_of, node_spec, parse_quantity
from libs.kube.workloads import (
    GangKey,
    Refusal,
    checkpoint_of,
    completion_index,
    exit_code,
    gang_of,
    job_spec,
    pod_job_id,
)
from tests.e2e.kube_harness import claim_template, dra_pod, gang, gpu_pod, indexed_job, resource_slice

VERSION = "1.37.0"


def valid(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_node_s_gpus_model_memory_topology_and_health_come_from_the_device_plugin_and_gfd() -> None:
    node = node_body("n1", 8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, rack="r7", cpu="96",
                     memory="1Ti")
    valid(node)
    spec = node_spec(node)
    assert [g.index for g in spec.gpus] == list(range(8))
    assert {g.model for g in spec.gpus} == {"H100"} and {g.memory_mib for g in spec.gpus} == {81559}
    assert {g.nvlink_group for g in spec.gpus} == {-1}  # not SXM: PCIe only
    assert spec.cpu_milli == 96_000 and spec.memory_mib == 1 << 20
    assert spec.labels == {"rack": "r7"}
    assert is_ready(node) and not is_unschedulable(node)
    sxm = node_spec(node_body("n2", 4, product="NVIDIA-A100-SXM4-80GB"))
    assert {g.nvlink_group for g in sxm.gpus} == {0} and {g.model for g in sxm.gpus} == {"A100"}


def test_mig_mixed_gpus_leave_the_whole_count_and_topology_labels_are_configurable() -> None:
    node = node_body("mig", 8)
    node["status"]["allocatable"].update({"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14"})
    node["metadata"]["labels"]["site/rack"] = "east-3"
    spec = node_spec(node, TopologyLabels.parse("rack=site/rack"))
    assert [g.mig_enabled for g in spec.gpus] == [False] * 6 + [True] * 2
    assert spec.labels == {"rack": "east-3"}
    with pytest.raises(ValueError, match="topology label"):
        TopologyLabels.parse("room=x")


def test_models_and_quantities() -> None:
    assert model_of({"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}) == "V100"
    assert model_of({"nvidia.com/gpu.product": "NVIDIA-A10", "gpusched.io/gpu-model": "A10G"}) == "A10G"
    assert parse_quantity("500m") == 0.5 and parse_quantity("2Gi") == 2 << 30 and parse_quantity("1e3") == 1000
    with pytest.raises(ValueError):
        parse_quantity("lots")


def _spec(pod: dict[str, Any], replicas: int = 1, kind: str = "Pod") -> Any:
    pod["metadata"].setdefault("namespace", "ns")
    return job_spec(pod, pod["spec"], replicas, {"q": "team-a"}, kind)


def test_a_pod_becomes_a_job_spec_with_queue_team_priority_resources_and_annotations() -> None:
    pod = gpu_pod("p", gpus=4, priority="urgent", notes={"gpusched.io/topology": "rack",
                                                        "gpusched.io/duration-s": "3600",
                                                        "gpusched.io/gpu-models": "A100, H100",
                                                        "gpusched.io/checkpoint-interval-s": "600"})
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "8", "memory": "64Gi"}
    pod["spec"]["activeDeadlineSeconds"] = 7200
    pod["metadata"]["namespace"] = "ns"
    valid(pod)
    spec = _spec(pod)
    assert (spec.team, spec.queue, spec.project, spec.priority) == ("team-a", "q", "ns", "urgent")
    assert (spec.gpus, spec.cpu_milli, spec.memory_mib) == (4, 8000, 65536)
    assert spec.gpu_models == ("A100", "H100") and spec.topology == "rack"
    assert spec.duration_s == 3600 and spec.max_runtime_s == 7200 and spec.checkpoint_interval_s == 600
    kueue = gpu_pod("k", queue="", labels={"kueue.x-k8s.io/queue-name": "q"})
    assert _spec(kueue).queue == "q"  # a Kueue user changes one line: the scheduler name


@pytest.mark.parametrize(("change", "code"), [
    (lambda p: p["metadata"]["labels"].clear(), "no_queue"),
    (lambda p: p["metadata"]["annotations"].update({"gpusched.io/gpu-milli": "250"}), "gpu_fraction_unsupported"),
    (lambda p: p["metadata"]["annotations"].update({"gpusched.io/topology": "planet"}), "invalid_annotation"),
    (lambda p: p["metadata"]["annotations"].update({"gpusched.io/duration-s": "soon"}), "invalid_annotation"),
    (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/mig-1g.10gb": "1"}),
     "mixed_gpu_resources"),
    (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": "two"}),
     "invalid_resources"),
])
def test_a_pod_that_can_never_run_is_refused_with_its_own_code(change: Any, code: str) -> None:
    pod = gpu_pod("bad")
    change(pod)
    refusal = _spec(pod)
    assert isinstance(refusal, Refusal) and refusal.code == code


def test_a_mig_request_is_one_instance_of_one_profile() -> None:
    pod = gpu_pod("mig")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-3g.40gb": "1"}
    spec = _spec(pod)
    assert spec.mig_profile == "3g.40gb" and spec.gpus == 1


def test_gangs_under_each_convention_and_job_ids() -> None:
    members = gang("g", 3, 8)
    for m in members:
        m["metadata"]["namespace"] = "ns"
    assert gang_of(members[0]) == GangKey("ns", "g", 3)
    plugins = gpu_pod("x", labels={"scheduling.x-k8s.io/pod-group": "pg"})
    plugins["metadata"]["namespace"] = "ns"
    assert gang_of(plugins) == GangKey("ns", "pg", None)  # size: the PodGroup's minMember
    assert gang_of(gpu_pod("alone")) is None
    first = gpu_pod("a")
    first["metadata"]["uid"] = "u-1"
    remade = gpu_pod("a", notes={"gpusched.io/job-id": pod_job_id(first)})
    assert pod_job_id(remade) == pod_job_id(first)  # a remade pod is the same job's next run


def test_a_job_s_template_and_parallelism_make_its_gang() -> None:
    job = indexed_job("train", 4, 8, runtime_s=10, priority="training")
    job["metadata"]["namespace"] = "ns"
    valid(job)
    spec = job_spec(job, job["spec"]["template"]["spec"], 4, {"q": "team-a"}, "Job")
    assert spec.replicas == 4 and spec.gpus == 8 and spec.priority == "training"


def test_the_bodies_the_bridge_sends_are_valid_objects() -> None:
    valid(bodies.binding("ns", "p", "n1"))
    valid(bodies.eviction("ns", "p", 30))
    pod = gpu_pod("p")
    pod["metadata"].update(namespace="ns", uid="abc", resourceVersion="7")
    event = bodies.event(pod, "Warning", "FailedScheduling", "gpusched: quota", 1_700_000_000.0)
    valid(event)
    conditions = (bodies.waiting_condition("queue_quota", "waits", 1.0),
                  bodies.disruption_condition("PreemptionByScheduler", "preempted", 1.0))
    status = {**pod, "status": bodies.status_patch(*conditions)["status"]}
    valid(status)
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}}
    remade = bodies.remade_pod(bound, "job-1", (12.5, "ckpt-12"))
    valid(remade)
    assert "nodeName" not in remade["spec"]
    assert remade["metadata"]["annotations"]["gpusched.io/resume-checkpoint"] == "ckpt-12"


def test_exit_codes_checkpoints_and_completion_indexes_are_read_off_the_pod() -> None:
    pod = gpu_pod("p", notes={"gpusched.io/checkpoint": "c-3", "gpusched.io/progress-s": "42.5",
                              "batch.kubernetes.io/job-completion-index": "3"})
    pod["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 137}}}]}
    assert exit_code(pod) == 137 and checkpoint_of(pod) == (42.5, "c-3") and completion_index(pod) == 3
    pod["status"] = {"phase": "Failed"}
    assert exit_code(pod) == 1  # a kubelet that says nothing: a failure all the same
    pod["status"] = {"phase": "Succeeded"}
    assert exit_code(pod) == 0


def test_the_deployment_manifests_are_valid_objects() -> None:
    folder = Path(__file__).resolve().parents[3] / "infra" / "kubernetes"
    kinds = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            valid(doc)
            kinds.append(doc["kind"])
    assert {"ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Deployment", "StatefulSet"} <= set(kinds)


def test_a_dra_driver_s_devices_are_the_node_s_gpus_and_claims_point_at_the_chosen_ones() -> None:
    from libs.kube.dra import allocation_status, node_devices, requested_gpus


    slices = [resource_slice("n1", 4), resource_slice("n2", 2)]
    for s in slices:
        valid(s)
    devices = node_devices(slices)
    assert [d.index for d in devices["n1"]] == [0, 1, 2, 3]
    assert {d.model for d in devices["n1"]} == {"H100"} and devices["n1"][0].memory_mib == 80 * 1024
    template = claim_template("two", 2)
    valid(template)
    classes = frozenset({"gpu.nvidia.com"})
    assert requested_gpus(template["spec"]["spec"], classes) == 2
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": "true"}}]
    refusal = requested_gpus(template["spec"]["spec"], classes)
    assert isinstance(refusal, Refusal) and refusal.code == "dra_request_unsupported"
    pod = dra_pod("p", "two")
    pod["metadata"].update(namespace="ns", uid="u-1")
    valid(pod)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "p-gpus", "namespace": "ns"}, "spec": claim_template("two", 2)["spec"]["spec"]}
    status = allocation_status(claim, [devices["n1"][3], devices["n1"][1]], "n1", pod, classes)
    valid({**claim, **status})
    assert [r["device"] for r in status["status"]["allocation"]["devices"]["results"]] == ["gpu-3", "gpu-1"]


def _pod_in(phase: str, node: str = "n1", code: int | None = None, going: bool = False) -> dict[str, Any]:
    pod = gpu_pod("m")
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    if code is not None:
        pod["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": {"exitCode": code}}}]
    if going:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


def test_a_run_s_pods_say_started_finished_or_failed_and_a_deletion_is_no_failure() -> None:
    from contracts import JobFailed, JobFinished, JobStarted
    from libs.kube.run_reports import Run, batch_job_reports, pods_reports

    run = Run("job", "run-1", "kube-bridge", replicas=2)
    assert pods_reports(run, [_pod_in("Running")], 1.0) == ([], [])  # one of two bound: nothing yet
    events, _ = pods_reports(run, [_pod_in("Running"), _pod_in("Pending")], 1.0)
    assert events == []
    events, _ = pods_reports(run, [_pod_in("Running"), _pod_in("Running")], 1.0)
    assert [type(e) for e in events] == [JobStarted]
    started = Run("job", "run-1", "kube-bridge", replicas=2, started_reported=True)
    events, failed = pods_reports(started, [_pod_in("Failed", code=137), _pod_in("Running")], 2.0)
    assert [(type(e), getattr(e, "exit_code", None)) for e in events] == [(JobFailed, 137)] and len(failed) == 1
    events, failed = pods_reports(started, [_pod_in("Failed", code=143, going=True), _pod_in("Running")], 2.0)
    assert events == [] and failed == []  # being deleted: a stop, reported as one elsewhere
    events, _ = pods_reports(started, [_pod_in("Succeeded"), _pod_in("Succeeded")], 3.0)
    assert [type(e) for e in events] == [JobFinished]
    job = {"status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    (failure,) = batch_job_reports(started, job, [], [_pod_in("Failed", code=137)], 4.0)
    assert isinstance(failure, JobFailed) and failure.exit_code == 1 and "137" in failure.reason
