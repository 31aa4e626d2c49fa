"""The Kubernetes end-to-end tests' world: one real control plane per test session (etcd, kube-apiserver,
kube-controller-manager, built from their Go modules by scripts/build_kube.sh), and per test module the
platform's six services, a pool of fake GPU nodes with their kubelet, and the bridge serving one namespace and
that pool, so that modules share nothing but the API server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.cli.client import Client
from libs.kube.devcluster import DevCluster, kubectl, start_dev_cluster
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.supervisor import Supervisor
from tests.e2e.waiting import wait_for

POLICY = """
[settings]
preempt_min_remaining_s = 0.0

[[queues]]
name = "q"
team = "t"
nominal_gpus = 64

[[priority_classes]]
name = "urgent"
value = 800

[[priority_classes]]
name = "training"
value = 300
checkpoint_grace_s = 5.0

[[priority_classes]]
name = "batch"
value = 100
checkpoint_grace_s = 5.0
max_retries = 2
retry_backoff_s = 0.5
"""
PRIORITY_CLASSES = {"urgent": 800, "training": 300, "batch": 100}


@dataclass
class KubeWorld:
    cluster: DevCluster
    api: Client
    sup: Supervisor
    servers: list[EmbeddedServer]
    env: dict[str, str]
    tmp: Path
    namespace: str
    pool: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    bridge_ports: dict[str, int] = field(default_factory=dict)

    # --- processes ----------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
        proc = subprocess.Popen(argv, env={**os.environ, **self.env, "PYTHONPATH": str(Path.cwd())},
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def start_kubelet(self, nodes: int, gpus: int, racks: int = 1, ascend: int = 0) -> None:
        self._spawn("kubelet", [sys.executable, "-m", "libs.kube.fake_kubelet", "--kubeconfig",
                                str(self.cluster.kubeconfig()), "--nodes", str(nodes), "--gpus", str(gpus),
                                "--racks", str(racks), "--prefix", f"{self.pool}-n", "--pool", self.pool,
                                "--ascend-nodes", str(ascend)])

    def start_bridge(self, name: str = "bridge", standby: bool = False, extra: list[str] | None = None) -> None:
        port = free_port()
        self.bridge_ports[name] = port
        env_extra = {"GPUSCHED_STANDBY": "1", "GPUSCHED_REPLICA_ID": name} if standby else {}
        self.env.update(env_extra)
        self._spawn(name, [sys.executable, "-m", "services.kube_bridge", "--kubeconfig",
                           str(self.cluster.kubeconfig(self.cluster.bridge_token, "bridge")), "--namespace",
                           self.namespace, "--node-selector", f"gpusched.io/pool={self.pool}", "--port", str(port),
                           "--pdb-wait-s", "3", *(extra or [])])
        for key in env_extra:
            self.env.pop(key)

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        proc.wait(timeout=15)

    def log_of(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.sup.stop()
        for s in self.servers:
            s.stop()

    # --- Kubernetes -----------------------------------------------------------------------------------

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        return kubectl(self.cluster, *args, input_text=input_text, check=check).stdout

    def apply(self, *docs: dict[str, Any]) -> None:
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        self.kubectl("apply", "-f", "-", input_text="\n---\n".join(yaml.safe_dump(d) for d in docs))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        out = kubectl(self.cluster, "get", kind, name, "-n", self.namespace, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pods(self) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.kubectl("get", "pods", "-n", self.namespace, "-o", "json"))
        return {p["metadata"]["name"]: p for p in doc["items"]}

    def node_of(self, pod: str) -> str:
        found = self.get("pod", pod)
        return str((found or {}).get("spec", {}).get("nodeName", ""))

    def phase_of(self, pod: str) -> str:
        found = self.get("pod", pod)
        return str((found or {}).get("status", {}).get("phase", "")) if found else "gone"

    def condition(self, pod: str, kind: str) -> dict[str, Any] | None:
        found = self.get("pod", pod) or {}
        return next((c for c in found.get("status", {}).get("conditions", []) or [] if c["type"] == kind), None)

    def events_of(self, name: str) -> list[dict[str, Any]]:
        doc = json.loads(self.kubectl("get", "events", "-n", self.namespace, "-o", "json",
                                      "--field-selector", f"involvedObject.name={name}"))
        return list(doc["items"])

    def wait_phase(self, pod: str, *phases: str, timeout: float = 30.0) -> None:
        wait_for(lambda: self.phase_of(pod) in phases, lambda: f"{pod} never reached {phases}: "
                 f"{self.phase_of(pod)}; bridge log:\n{self.log_of('bridge')[-3000:]}", timeout=timeout)

    def job_of(self, predicate: Any) -> dict[str, Any]:
        return next(j for j in self.api.jobs() if predicate(j))

    def platform_job(self, kind: str, name: str) -> dict[str, Any] | None:
        for job in self.api.jobs():
            labels = (job.get("spec") or {}).get("labels", {})
            if labels.get("kubernetes.io/kind") == kind and labels.get("kubernetes.io/name") == name \
                    and labels.get("kubernetes.io/namespace") == self.namespace:
                return job
        return None

    def wait_job_state(self, kind: str, name: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(lambda: (j := self.platform_job(kind, name)) is not None and j["state"] in states and j,
                        lambda: f"{kind} {name} never reached {states}: {self.platform_job(kind, name)}",
                        timeout=timeout)


def gpu_pod(name: str, gpus: int = 1, runtime_s: float | None = None, priority: str = "", exit_code: int = 0,
            labels: dict[str, str] | None = None, notes: dict[str, str] | None = None,
            queue: str = "q") -> dict[str, Any]:
    annotations = {**(notes or {})}
    if runtime_s is not None:
        annotations["gpusched.io/sim-runtime-s"] = str(runtime_s)
    if exit_code:
        annotations["gpusched.io/sim-exit-code"] = str(exit_code)
    spec: dict[str, Any] = {"schedulerName": "gpusched", "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                            "containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {**({"gpusched.io/queue": queue} if queue else {}),
                                                  **(labels or {})},
                         "annotations": annotations},
            "spec": spec}


def gang(name: str, size: int, gpus: int, runtime_s: float | None = None, **kw: Any) -> list[dict[str, Any]]:
    """A gang under Kueue's pod-group convention."""
    return [gpu_pod(f"{name}-{i}", gpus, runtime_s, labels={"kueue.x-k8s.io/pod-group-name": name},
                    notes={"kueue.x-k8s.io/pod-group-total-count": str(size)}, **kw) for i in range(size)]


def indexed_job(name: str, parallelism: int, gpus: int, runtime_s: float, priority: str = "",
                checkpoints: bool = False) -> dict[str, Any]:
    notes = {"gpusched.io/sim-runtime-s": str(runtime_s)}
    if checkpoints:
        notes["gpusched.io/sim-checkpoint-on-signal"] = "true"
    pod_spec: dict[str, Any] = {"schedulerName": "gpusched", "restartPolicy": "Never",
                                "terminationGracePeriodSeconds": 5,
                                "containers": [{"name": "main", "image": "busybox",
                                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if priority:
        pod_spec["priorityClassName"] = priority
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "q"}},
            "spec": {"suspend": True, "parallelism": parallelism, "completions": parallelism,
                     "completionMode": "Indexed", "backoffLimit": 0,
                     "template": {"metadata": {"annotations": notes}, "spec": pod_spec}}}


DRIVER = "gpu.nvidia.com"


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}


def resource_slice(node: str, gpus: int, product: str = "NVIDIA-H100-80GB-HBM3",
                   shareable: bool = False) -> dict[str, Any]:
    devices: list[dict[str, Any]] = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i},
                                                                         "productName": {"string": product},
                                                                         "uuid": {"string": f"GPU-{node}-{i}"}},
                                      "capacity": {"memory": {"value": "80Gi"}}} for i in range(gpus)]
    if shareable:
        for device in devices:
            device["allowMultipleAllocations"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}, "devices": devices}}


def claim_template(name: str, count: int, memory: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}
    if memory:  # a share of the device's memory: consumable capacity
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}


def dra_pod(name: str, template: str) -> dict[str, Any]:
    pod = gpu_pod(name, runtime_s=300)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    return pod


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = start_dev_cluster(tmp_path_factory.mktemp("kube"))
    kubectl(cluster, "apply", "-f", "-", input_text="\n---\n".join(
        yaml.safe_dump({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n},
                        "value": v}) for n, v in PRIORITY_CLASSES.items()))
    yield cluster
    cluster.stop()


def start_world(cluster: DevCluster, tmp: Path, name: str, nodes: int, gpus: int, racks: int = 1,
                policy: str = POLICY, bridge: bool = True, ascend: int = 0) -> KubeWorld:
    (tmp / "policy.toml").write_text(policy)
    (tmp / "cluster.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    sup, servers, env = start_platform(tmp, tmp / "cluster.csv", tmp / "policy.toml", free_port(), own_servers=True,
                                       extra_env={"GPUSCHED_NODE_BACKEND": "kubernetes",
                                                  "GPUSCHED_TICK_SECONDS": "1"})
    world = KubeWorld(cluster, Client(f"http://127.0.0.1:{sup.ports['admission']}"), sup, servers, env, tmp,
                      namespace=name, pool=name)
    try:
        world.kubectl("create", "namespace", name)
        world.start_kubelet(nodes, gpus, racks, ascend)
        if bridge:
            world.start_bridge()
            wait_for(lambda: len(world.api.nodes()) == nodes + ascend, "the pool's nodes never registered",
                     timeout=30)
    except BaseException:
        world.stop()
        raise
    return world


def wait_seconds(seconds: float) -> None:
    time.sleep(seconds)
