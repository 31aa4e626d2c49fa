"""`gpusched bench kube`: gpusched and kube-scheduler on the same real API server, one after the other in one
run, with the same fake GPU nodes (1,000 of 8 GPUs by default) and the same seeded workload: single GPU pods
of 1, 2, 4 and 8 GPUs and gangs of 8-GPU pods, asking for more GPUs than the cluster has.

For each scheduler: pods bound per second (from the first pod created to the last bound), time from a pod's
creation to its bind (p50 / p99, both read by this process's own clock: creation when the API server answered
the create, bind when the watch shows the pod's node), and the GPUs left unallocated once nothing more binds,
with those held by gangs bound only in part (kube-scheduler has no gangs: it binds members one by one).
No kubelet runs: a bound pod stays bound, so the cluster fills up, as it would with long jobs.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from libs.kube.client import ApiError, KubeClient, KubeConfig, Obj
from libs.kube.devcluster import DevCluster, start_dev_cluster
from libs.kube.fake_kubelet import create_nodes
from libs.kube.reflector import Reflector
from libs.kube.workloads import meta
from libs.runtime.embedded import free_port
from libs.runtime.platform import start_platform, stop_all

POLICY = """
[[queues]]
name = "bench"
team = "bench"

[[priority_classes]]
name = "training"
value = 300
"""
GANG_LABEL = "kueue.x-k8s.io/pod-group-name"
GANG_SIZE = "kueue.x-k8s.io/pod-group-total-count"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class KubeBenchOptions:
    nodes: int = 1000
    gpus_per_node: int = 8
    demand: float = 1.1  # GPUs asked for, as a multiple of the cluster's
    gang_share: float = 0.2  # of the GPUs asked for, the share asked by gangs
    gang_size: int = 4
    seed: int = 1
    quiet_s: float = 10.0  # nothing bound for this long after the last create: the run is over
    timeout_s: float = 600.0
    data: Path | None = None


@dataclass(frozen=True)
class PodAsk:
    name: str
    gpus: int
    gang: str = ""


def workload(opts: KubeBenchOptions) -> list[PodAsk]:
    """The seeded mix: gangs of `gang_size` 8-GPU pods for `gang_share` of the demand, single pods of 1, 2, 4 or
    8 GPUs (40/20/20/20 %) for the rest, in a shuffled order (a gang's members one after another)."""
    rng = random.Random(opts.seed)
    total = int(opts.nodes * opts.gpus_per_node * opts.demand)
    gang_gpus = opts.gang_size * opts.gpus_per_node
    groups: list[list[PodAsk]] = []
    for g in range(int(total * opts.gang_share) // gang_gpus):
        groups.append([PodAsk(f"g{g}-{i}", opts.gpus_per_node, f"g{g}") for i in range(opts.gang_size)])
    left, s = total - len(groups) * gang_gpus, 0
    while left > 0:
        gpus = min(rng.choices((1, 2, 4, 8), weights=(40, 20, 20, 20))[0], left)
        groups.append([PodAsk(f"s{s}", gpus)])
        left, s = left - gpus, s + 1
    rng.shuffle(groups)
    return [pod for group in groups for pod in group]


def pod_body(ask: PodAsk, namespace: str, scheduler: str, gang_size: int) -> Obj:
    labels = {"gpusched.io/queue": "bench"}
    notes = {}
    if ask.gang:
        labels[GANG_LABEL] = ask.gang
        notes[GANG_SIZE] = str(gang_size)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": ask.name, "namespace": namespace, "labels": labels, "annotations": notes},
            "spec": {"schedulerName": scheduler, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": str(ask.gpus)}}}]}}


@dataclass
class Watch:
    """When each pod of a namespace was seen bound, by this process's clock."""

    bound_at: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)

    async def on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        node = new.get("spec", {}).get("nodeName")
        name = meta(new)["name"]
        if node and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()
            self.node_of[name] = node


async def run_scheduler(client: KubeClient, opts: KubeBenchOptions, asks: list[PodAsk], namespace: str,
                        scheduler: str, progress: Progress | None) -> dict[str, Any]:
    """Create the workload's pods for one scheduler and measure what it binds."""
    await client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": namespace}})
    watch = Watch()
    reflector = Reflector(client, f"/api/v1/namespaces/{namespace}/pods", watch.on_pod)
    watching = asyncio.create_task(reflector.run())
    await reflector.synced.wait()
    created_at: dict[str, float] = {}
    gate = asyncio.Semaphore(32)

    async def create(ask: PodAsk) -> None:
        async with gate:
            body = pod_body(ask, namespace, scheduler, opts.gang_size)
            await client.post(f"/api/v1/namespaces/{namespace}/pods", body)
            created_at[ask.name] = time.monotonic()

    started = time.monotonic()
    creating = asyncio.gather(*(create(a) for a in asks))
    deadline = started + opts.timeout_s
    last_change, last_count = time.monotonic(), -1
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        count = len(watch.bound_at)
        if progress is not None:
            progress(f"{scheduler}: pods bound", count, len(asks))
        if count != last_count:
            last_change, last_count = time.monotonic(), count
        if creating.done() and (count == len(asks) or time.monotonic() - last_change > opts.quiet_s):
            break
    await creating
    watching.cancel()
    return figures(opts, asks, created_at, watch, started)


def figures(opts: KubeBenchOptions, asks: list[PodAsk], created_at: dict[str, float], watch: Watch,
            started: float) -> dict[str, Any]:
    waits = sorted(watch.bound_at[n] - created_at[n] for n in watch.bound_at if n in created_at)
    gpus = {a.name: a.gpus for a in asks}
    capacity = opts.nodes * opts.gpus_per_node
    allocated = sum(gpus[n] for n in watch.bound_at)
    members: dict[str, list[str]] = {}
    for a in asks:
        if a.gang:
            members.setdefault(a.gang, []).append(a.name)
    bound_members = {g: sum(1 for m in ms if m in watch.bound_at) for g, ms in members.items()}
    partial = {g: k for g, k in bound_members.items() if 0 < k < len(members[g])}
    span = (max(watch.bound_at.values()) - started) if watch.bound_at else 0.0

    def pct(q: float) -> float | None:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))] * 1000, 1) if waits else None

    return {
        "pods": len(asks), "pods_bound": len(watch.bound_at),
        "pods_per_s": round(len(watch.bound_at) / span, 1) if span else 0.0,
        "bind_latency_p50_ms": pct(0.50), "bind_latency_p99_ms": pct(0.99),
        "bind_latency_mean_ms": round(statistics.fmean(waits) * 1000, 1) if waits else None,
        "gpus": capacity, "gpus_asked": sum(gpus.values()), "gpus_allocated": allocated,
        "gpus_unallocated": capacity - allocated,
        "unallocated_pct": round(100 * (capacity - allocated) / capacity, 2),
        "gangs": len(members), "gangs_whole": sum(1 for g, k in bound_members.items() if k == len(members[g])),
        "gangs_partial": len(partial),
        "gpus_in_partial_gangs": sum(k * opts.gpus_per_node for k in partial.values()),
    }


def scheduler_config(folder: Path, cluster: DevCluster) -> Path:
    """kube-scheduler at its best: client rate limits raised so its API calls are not throttled."""
    path = folder / "kube-scheduler.yaml"
    path.write_text(f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {cluster.kubeconfig()}
  qps: 5000
  burst: 5000
leaderElection:
  leaderElect: false
""")
    return path


async def _with_client(cluster: DevCluster, token: str, body: Callable[[KubeClient], Any]) -> Any:
    client = KubeClient(KubeConfig.from_kubeconfig(cluster.kubeconfig(token)), user_agent="gpusched-bench")
    try:
        return await body(client)
    finally:
        await client.close()


def run_kube_bench(opts: KubeBenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpusched-kube-bench-") as tmp:
        folder = opts.data or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        return _run(opts, folder, progress)


def _run(opts: KubeBenchOptions, folder: Path, progress: Progress | None) -> dict[str, Any]:
    say = progress or (lambda what, done, total: None)
    say("starting etcd and kube-apiserver", 0, 0)
    cluster = start_dev_cluster(folder / "kube", controllers=False)
    asks = workload(opts)
    names = [f"bench-n{i}" for i in range(opts.nodes)]
    result: dict[str, Any] = {"nodes": opts.nodes, "gpus_per_node": opts.gpus_per_node, "seed": opts.seed,
                              "demand": opts.demand, "pods": len(asks)}
    try:
        say(f"creating {opts.nodes} fake GPU nodes", 0, opts.nodes)
        t = time.monotonic()
        asyncio.run(_with_client(cluster, cluster.admin_token,
                                 lambda c: create_nodes(c, names, opts.gpus_per_node, racks=max(1, opts.nodes // 32))))
        result["nodes_created_s"] = round(time.monotonic() - t, 1)
        # 1. kube-scheduler, built from the same release.
        scheduler = cluster._spawn("kube-scheduler", [str(cluster.bin_dir / "kube-scheduler"), "--config",
                                                      str(scheduler_config(folder, cluster)), "--secure-port", "0"])
        time.sleep(2.0)
        if scheduler.proc.poll() is not None:
            raise RuntimeError(f"kube-scheduler exited; see {scheduler.log}")
        result["kube-scheduler"] = asyncio.run(_with_client(cluster, cluster.admin_token, lambda c: run_scheduler(
            c, opts, asks, "bench-ks", "default-scheduler", progress)))
        scheduler.stop()
        say("deleting kube-scheduler's pods", 0, 0)
        asyncio.run(_with_client(cluster, cluster.admin_token, lambda c: _delete_all(c, "bench-ks")))
        # 2. gpusched: the six services and the bridge.
        result["gpusched"] = _run_gpusched(opts, asks, folder, cluster, progress)
    finally:
        cluster.stop()
    ours, theirs = result["gpusched"], result["kube-scheduler"]
    result["pods_per_s_ratio"] = round(ours["pods_per_s"] / theirs["pods_per_s"], 2) if theirs["pods_per_s"] else None
    result["met"] = bool(ours["pods_per_s"] > theirs["pods_per_s"]
                         and ours["gpus_unallocated"] + ours["gpus_in_partial_gangs"]
                         < theirs["gpus_unallocated"] + theirs["gpus_in_partial_gangs"])
    return result


async def _delete_all(client: KubeClient, namespace: str) -> None:
    """Every pod of the namespace deleted at once (no kubelet: nothing to wait for), and the namespace."""
    await client.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                         {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    for _ in range(600):
        pods = await client.get(f"/api/v1/namespaces/{namespace}/pods", {"limit": "1"})
        if not pods.get("items"):
            return
        await asyncio.sleep(0.5)


def _run_gpusched(opts: KubeBenchOptions, asks: list[PodAsk], folder: Path, cluster: DevCluster,
                  progress: Progress | None) -> dict[str, Any]:
    data = folder / "platform"
    data.mkdir(parents=True, exist_ok=True)
    (data / "policy.toml").write_text(POLICY)
    (data / "cluster.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    if progress is not None:
        progress("starting NATS, Redis, the six services and the bridge", 0, 0)
    sup, servers, env = start_platform(data, data / "cluster.csv", data / "policy.toml", free_port(), own_servers=True,
                                       extra_env={"GPUSCHED_NODE_BACKEND": "kubernetes"})
    bridge: subprocess.Popen[bytes] | None = None
    try:
        log = open(data / "bridge.log", "ab")  # noqa: SIM115 - the bridge owns it until it exits
        bridge = subprocess.Popen([sys.executable, "-m", "services.kube_bridge", "--kubeconfig",
                                   str(cluster.kubeconfig(cluster.bridge_token, "bridge")), "--port",
                                   str(free_port()), "--no-explain"],
                                  env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        asyncio.run(_wait_registered(sup.ports["admission"], opts.nodes, progress))
        return dict(asyncio.run(_with_client(cluster, cluster.admin_token, lambda c: run_scheduler(
            c, opts, asks, "bench-gs", "gpusched", progress))))
    finally:
        if bridge is not None:
            bridge.terminate()
            bridge.wait(timeout=30)
        stop_all(sup, servers)


async def _wait_registered(api_port: int, nodes: int, progress: Progress | None) -> None:
    """Until the platform's node view holds every node the bridge registered."""
    async with aiohttp.ClientSession() as session:
        for _ in range(1200):
            try:
                async with session.get(f"http://127.0.0.1:{api_port}/v1/nodes") as answer:
                    count = len(await answer.json()) if answer.status == 200 else 0
            except (aiohttp.ClientError, ApiError):
                count = 0
            if progress is not None:
                progress("gpusched: nodes registered", count, nodes)
            if count >= nodes:
                return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the bridge registered fewer than {nodes} nodes in 600 s")
