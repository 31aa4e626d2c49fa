"""Sequences of events around the bridge's restarts and leadership changes that once broke one of its guarantees
(named in each docstring), on a real kube-apiserver. Each test gets its own world (platform, fake kubelet,
bridge(s), namespace)."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.kube.devcluster import DevCluster
from tests.e2e.kube_harness import KubeWorld, gpu_pod, start_world, wait_seconds
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

CHECKPOINTS = {"gpusched.io/sim-checkpoint-on-signal": "true"}


def _world(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
           bridge: bool) -> Iterator[KubeWorld]:
    name = "adv3-" + request.node.name.removeprefix("test_").replace("_", "-")[:18].rstrip("-")
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp(name)), name, nodes=1, gpus=8, bridge=bridge)
    yield w
    w.stop()


@pytest.fixture
def small(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """One node of 8 GPUs and one bridge, in a namespace of the test's own."""
    yield from _world(kube_cluster, tmp_path_factory, request, bridge=True)


@pytest.fixture
def pair(kube_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory,
         request: pytest.FixtureRequest) -> Iterator[KubeWorld]:
    """One node of 8 GPUs and two bridges (GPUSCHED_STANDBY=1): one leads, the other stands by."""
    name = "adv3-" + request.node.name.removeprefix("test_").replace("_", "-")[:18].rstrip("-")
    w = start_world(kube_cluster, Path(tmp_path_factory.mktemp(name)), name, nodes=1, gpus=8, bridge=False)
    try:
        w.start_bridge("bridge-a", standby=True)
        wait_for(lambda: len(w.api.nodes()) == 1, "the pool's node never registered", timeout=30)
        w.start_bridge("bridge-b", standby=True)
        yield w
    finally:
        w.stop()


def _leads(w: KubeWorld, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{w.bridge_ports[name]}/v1/kube", timeout=5) as answer:
            json.loads(answer.read())
            return True
    except (urllib.error.URLError, ConnectionError):
        return False


def _leader(w: KubeWorld) -> str:
    return wait_for(lambda: next((n for n in ("bridge-a", "bridge-b") if _leads(w, n)), ""), "no bridge leads",
                    timeout=30)


def _logs(w: KubeWorld, *names: str) -> str:
    return "\n".join(f"--- {n}:\n{w.log_of(n)[-2500:]}" for n in names)


def test_a_preempted_pod_whose_eviction_ends_while_no_bridge_leads_runs_again(pair: KubeWorld) -> None:
    """Guarantee (2): no job is lost; a preempted pod is made again, never cancelled (only a user's deletion
    ends its job). Sequence: pod `low` (batch, 8 GPUs, checkpoints on SIGTERM) runs under the leading bridge;
    the kubelet is paused (SIGSTOP); pod `high` (urgent, 8 GPUs) preempts it: the leader evicts `low`, which
    stays terminating. The leader is SIGKILLed (between the eviction and the pod's end); the kubelet goes on,
    `low` writes its checkpoint and is gone. The standby takes over. The preemption is carried to its end:
    `low`'s run is evicted and `low` is made again, to run after `high`, from the body the leader kept before it
    evicted the pod (a checkpoint written while no bridge led is lost: the job resumes from the last one reported)."""
    w = pair
    w.apply(gpu_pod("low", gpus=8, runtime_s=300, priority="batch", notes=CHECKPOINTS))
    w.wait_phase("low", "Running", timeout=40)
    w.wait_job_state("Pod", "low", "running")
    leader = _leader(w)
    standby = "bridge-b" if leader == "bridge-a" else "bridge-a"
    w.procs["kubelet"].send_signal(signal.SIGSTOP)
    try:
        w.apply(gpu_pod("high", gpus=8, runtime_s=2, priority="urgent"))
        wait_for(lambda: ((w.get("pod", "low") or {}).get("metadata", {}) or {}).get("deletionTimestamp"),
                 lambda: f"low was never evicted: {_logs(w, leader)}", timeout=40)
        w.kill(leader, signal.SIGKILL)
    finally:
        w.procs["kubelet"].send_signal(signal.SIGCONT)
    wait_for(lambda: w.phase_of("low") == "gone", "low never went", timeout=20)
    w.wait_phase("high", "Running", "Succeeded", timeout=60)
    wait_seconds(5.0)
    low = w.platform_job("Pod", "low") or {}
    assert low.get("state") not in ("cancelled", "failed", "succeeded"), (
        f"the preempted job was ended ({low.get('state')}) instead of made again: platform job {low}; pod low "
        f"{w.phase_of('low')}; {_logs(w, standby)}")
    w.wait_phase("low", "Running", "Pending", timeout=40)


def test_a_pod_that_succeeds_while_the_bridge_is_down_is_reported_finished_not_run_again(small: KubeWorld) -> None:
    """Guarantees (2) and (3): a job is exactly one run of its pod, and a job whose pod ended reaches a final
    state. Sequence: pod `done` (1 GPU, runs 4 s) runs; the bridge is SIGKILLed; the pod succeeds while no
    bridge watches; the bridge starts again. It must report the run finished (JobFinished) and leave the
    Succeeded pod alone: never delete it and make it again to run a second time (or to wait for ever)."""
    w = small
    w.apply(gpu_pod("done", gpus=1, runtime_s=4))
    w.wait_phase("done", "Running", timeout=30)
    w.wait_job_state("Pod", "done", "running")
    uid = (w.get("pod", "done") or {})["metadata"]["uid"]
    w.kill("bridge", signal.SIGKILL)
    w.wait_phase("done", "Succeeded", timeout=30)
    w.start_bridge()
    wait_seconds(6.0)
    pod: dict[str, Any] = w.get("pod", "done") or {}
    job = w.platform_job("Pod", "done") or {}
    assert pod.get("metadata", {}).get("uid") == uid and pod.get("status", {}).get("phase") == "Succeeded", (
        f"the pod that succeeded while the bridge was down was deleted and made again: now uid "
        f"{pod.get('metadata', {}).get('uid')} (was {uid}), phase {pod.get('status', {}).get('phase')}, "
        f"annotations {pod.get('metadata', {}).get('annotations')}; platform job {job.get('state')}; "
        f"{_logs(w, 'bridge')}")
    w.wait_job_state("Pod", "done", "succeeded", timeout=20)
