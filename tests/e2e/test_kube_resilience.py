"""The bridge under failure, on a real kube-apiserver: SIGKILL in the middle of binding a gang; two bridges
racing; the API server restarted and a forced `410 Gone` with changes in between; the bridge's token denied
what it does not need."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.kube.client import KubeClient, KubeConfig
from libs.kube.devcluster import DevCluster
from services.kube_bridge.actions import BindConflict, KubeActions
from tests.e2e.kube_harness import KubeWorld, gang, gpu_pod, start_world
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp("kube-resilience")), "rs", nodes=3, gpus=8,
                    bridge=False)
    yield w
    w.stop()


def _status(w: KubeWorld, name: str) -> dict[str, Any]:
    """The bridge's counters; a standby (not ready: 503) has bound nothing."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{w.bridge_ports[name]}/v1/kube", timeout=5) as answer:
            return dict(json.loads(answer.read()))
    except urllib.error.HTTPError as err:
        if err.code != 503:
            raise
        return {"binds": 0, "standby": True}


def test_sigkill_while_binding_a_gang_completes_the_gang_after_restart(world: KubeWorld) -> None:
    w = world
    w.start_bridge(extra=["--crash-after-binds", "1"])
    wait_for(lambda: len(w.api.nodes()) == 3, "the nodes never registered", timeout=30)
    w.apply(*gang("cut", 3, 8, runtime_s=300))
    assert w.procs["bridge"].wait(timeout=30) == -signal.SIGKILL
    bound = [i for i in range(3) if w.node_of(f"cut-{i}")]
    assert len(bound) == 1  # killed with the gang a third bound
    w.start_bridge()
    for i in range(3):
        w.wait_phase(f"cut-{i}", "Running", timeout=40)
    job = w.wait_job_state("PodGroup", "cut", "running")
    assert {p["replica"]: p["node"] for p in job["placements"]} == {i: w.node_of(f"cut-{i}") for i in range(3)}
    assert job["evictions"] == 0  # carried out, not placed twice
    for i in range(3):
        w.kubectl("delete", "pod", f"cut-{i}", "-n", w.namespace, "--wait=false", "--ignore-not-found")
    w.wait_job_state("PodGroup", "cut", "cancelled", timeout=30)


async def _race(w: KubeWorld, pod: str, nodes: tuple[str, str]) -> list[BaseException | None]:
    config = KubeConfig.from_kubeconfig(w.cluster.kubeconfig(w.cluster.bridge_token, "bridge"))
    clients = [KubeClient(config), KubeClient(config)]
    try:
        actions = [KubeActions(c) for c in clients]
        results = await asyncio.gather(*(a.bind("race", pod, n) for a, n in zip(actions, nodes, strict=True)),
                                       return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]
    finally:
        for c in clients:
            await c.close()


def test_two_bridges_racing_on_one_pod_bind_it_once(world: KubeWorld) -> None:
    w = world
    w.kubectl("create", "namespace", "race")
    for name in ("same", "other"):
        w.kubectl("run", name, "-n", "race", "--image", "busybox", "--restart", "Never",
                  "--overrides", json.dumps({"spec": {"schedulerName": "nobody"}}))
    # Same node from both: one binds, the other finds it bound there and is done.
    assert asyncio.run(_race(w, "same", ("rs-n0", "rs-n0"))) == [None, None]
    # Different nodes: one binds, the other gets a conflict, never a second placement.
    results = asyncio.run(_race(w, "other", ("rs-n0", "rs-n1")))
    assert sorted(type(r).__name__ for r in results) == ["BindConflict", "NoneType"]
    assert any(isinstance(r, BindConflict) for r in results)
    bound = json.loads(w.kubectl("get", "pod", "other", "-n", "race", "-o", "json"))["spec"]["nodeName"]
    assert bound in ("rs-n0", "rs-n1")
    # Two bridges of one platform: one leads and binds, the other stands by; each pod is bound once.
    w.kill("bridge", signal.SIGTERM)
    w.start_bridge("bridge-a", standby=True)
    w.start_bridge("bridge-b", standby=True)
    w.apply(*(gpu_pod(f"pair-{i}", gpus=1, runtime_s=1) for i in range(4)))
    for i in range(4):
        w.wait_phase(f"pair-{i}", "Succeeded", timeout=40)
    binds = [_status(w, n)["binds"] for n in ("bridge-a", "bridge-b")]
    assert sorted(binds) == [0, 4], binds
    w.kill("bridge-a", signal.SIGTERM)
    w.kill("bridge-b", signal.SIGTERM)
    w.start_bridge()


def _etcd(w: KubeWorld, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(w.cluster.etcd_url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def _compact_etcd(w: KubeWorld) -> None:
    """Forget every revision but the last: a watch from an older resourceVersion now gets 410 Gone."""
    key = base64.b64encode(b"/registry").decode()
    revision = int(_etcd(w, "/v3/kv/range", {"key": key, "limit": 1})["header"]["revision"])
    _etcd(w, "/v3/kv/compaction", {"revision": revision, "physical": True})


def test_an_api_server_restart_and_410_gone_lose_no_change(world: KubeWorld) -> None:
    w = world
    wait_for(lambda: len(w.api.nodes()) == 3, "the nodes never registered", timeout=30)
    w.apply(gpu_pod("before", gpus=1, runtime_s=300))
    w.wait_phase("before", "Running")
    # The bridge sleeps while the world changes: a pod deleted, pods created, a node cordoned.
    w.procs["bridge"].send_signal(signal.SIGSTOP)
    try:
        w.kubectl("delete", "pod", "before", "-n", w.namespace, "--wait=false")
        w.apply(gpu_pod("while-away-0", gpus=1, runtime_s=1), gpu_pod("while-away-1", gpus=2, runtime_s=1))
        w.kubectl("cordon", "rs-n2")
        _compact_etcd(w)
        w.cluster.restart_apiserver()
    finally:
        w.procs["bridge"].send_signal(signal.SIGCONT)
    for name in ("while-away-0", "while-away-1"):
        w.wait_phase(name, "Succeeded", timeout=60)
        assert w.node_of(name) in ("rs-n0", "rs-n1")
    w.wait_job_state("Pod", "before", "cancelled", timeout=30)
    wait_for(lambda: next(n for n in w.api.nodes() if n["name"] == "rs-n2")["cordon"], "the cordon was missed")
    assert sum(_status(w, "bridge")["relists"].values()) >= 1
    names = [(j.get("spec") or {}).get("labels", {}).get("kubernetes.io/name") for j in w.api.jobs()]
    for name in ("before", "while-away-0", "while-away-1"):
        assert names.count(name) == 1, names  # every change seen once
    w.kubectl("uncordon", "rs-n2")


def test_the_bridge_token_is_denied_what_it_does_not_need(world: KubeWorld) -> None:
    w = world
    token = w.cluster.bridge_token

    def can(*args: str) -> bool:
        out = w.cluster.bin_dir / "kubectl"
        config = w.cluster.kubeconfig(token, "bridge-check")
        return subprocess.run([str(out), "--kubeconfig", str(config), "auth", "can-i", *args],
                              capture_output=True, check=False).returncode == 0

    for needed in (("create", "pods", "--subresource=binding"), ("create", "pods", "--subresource=eviction"),
                   ("patch", "pods", "--subresource=status"), ("watch", "nodes"), ("patch", "jobs.batch"),
                   ("create", "events"), ("delete", "pods")):
        assert can(*needed), needed
    for denied in (("delete", "nodes"), ("patch", "nodes"), ("patch", "nodes", "--subresource=status"),
                   ("get", "secrets"), ("update", "pods"), ("patch", "pods"), ("create", "deployments.apps"),
                   ("delete", "jobs.batch"), ("create", "nodes"), ("update", "pods", "--subresource=status")):
        assert not can(*denied), denied
