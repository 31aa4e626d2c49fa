"""Fake GPU nodes and the kubelet that "runs" their pods, against a real API server (as kwok does): for the
tests, the benchmark and the dev cluster, where no real kubelet or GPU exists.

Nodes are created Ready with `nvidia.com/gpu` allocatable, GPU Feature Discovery labels and rack labels. A pod
bound to one of them becomes Running at once, then ends after `gpusched.io/sim-runtime-s` seconds (never,
without it) with the exit code `gpusched.io/sim-exit-code` (0). A pod being deleted is stopped as a kubelet
stops it: one that says `gpusched.io/sim-checkpoint-on-signal: "true"` first writes its checkpoint annotations
(what a job's SIGTERM handler would), then the kubelet confirms the deletion. A node marked NotReady by a test
is left alone (its pods are frozen, as on a node that stopped answering).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from libs.kube.bodies import timestamp
from libs.kube.client import ApiError, KubeClient, KubeConfig, Obj
from libs.kube.nodes import is_ready
from libs.kube.reflector import DELETED, Reflector
from libs.kube.workloads import CHECKPOINT_ANNOTATION, PROGRESS_ANNOTATION, meta, notes_of

log = logging.getLogger(__name__)
FAKE_LABEL = "gpusched.io/fake-node"
RUNTIME = "gpusched.io/sim-runtime-s"
EXIT_CODE = "gpusched.io/sim-exit-code"
CHECKPOINTS = "gpusched.io/sim-checkpoint-on-signal"


def node_body(name: str, gpus: int, product: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920,
              rack: str = "", pool: str = "", cpu: str = "64", memory: str = "512Gi") -> Obj:
    labels = {FAKE_LABEL: "true", "kubernetes.io/hostname": name, "nvidia.com/gpu.product": product,
              "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.count": str(gpus)}
    if rack:
        labels["topology.gpusched.io/rack"] = rack
    if pool:
        labels["gpusched.io/pool"] = pool
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": node_status(gpus, cpu, memory, True)}


def ascend_node_body(name: str, npus: int = 8, chip: str = "910A", rack: str = "", cpu: str = "192",
                     memory: str = "768Gi") -> Obj:
    """An Ascend training server as the Ascend device plugin and MindCluster show it: `huawei.com/Ascend910`
    allocatable and the chip's label."""
    body = node_body(name, 0, rack=rack, cpu=cpu, memory=memory)
    labels = body["metadata"]["labels"]
    for key in [k for k in labels if k.startswith("nvidia.com/")]:
        del labels[key]
    labels.update({"accelerator": "huawei-Ascend910", "node.kubernetes.io/npu.chip.name": chip})
    body["status"] = node_status(0, cpu, memory, True, {"huawei.com/Ascend910": str(npus)})
    return body


def node_status(gpus: int, cpu: str, memory: str, ready: bool, devices: dict[str, str] | None = None) -> Obj:
    resources = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus), **(devices or {})}
    now = timestamp(time.time())
    return {"capacity": resources, "allocatable": resources,
            "conditions": [ready_condition(ready, now)], "phase": "Running",
            "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64", "operatingSystem": "linux",
                         "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                         "containerRuntimeVersion": "fake", "kubeProxyVersion": ""}}


def ready_condition(ready: bool, now: str) -> Obj:
    return {"type": "Ready", "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "fake kubelet" if ready else "fake kubelet stopped", "lastHeartbeatTime": now,
            "lastTransitionTime": now}


async def create_nodes(client: KubeClient, names: list[str], gpus: int, racks: int = 1, pool: str = "",
                       product: str = "NVIDIA-A100-SXM4-80GB", concurrency: int = 32, ascend_chip: str = "") -> None:
    """Create the nodes (and their status, a subresource of its own), many at once; with `ascend_chip`, Ascend
    servers of `gpus` NPUs of that chip ("910A") instead of GPU nodes."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, name: str) -> None:
        body = node_body(name, gpus, product=product, rack=f"rack-{i % max(racks, 1)}", pool=pool)
        if ascend_chip:
            body = ascend_node_body(name, gpus, chip=ascend_chip, rack=f"rack-{i % max(racks, 1)}")
            if pool:
                body["metadata"]["labels"]["gpusched.io/pool"] = pool
        async with gate:
            with contextlib.suppress(ApiError):
                await client.post("/api/v1/nodes", body)
            await client.merge_patch(f"/api/v1/nodes/{name}/status", {"status": body["status"]})
            # The API server taints a new node not-ready until a node lifecycle controller sees it Ready; a fake
            # node is Ready from the start (as kwok's are), so the taint goes at once.
            await client.merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))


async def set_ready(client: KubeClient, name: str, ready: bool) -> None:
    now = timestamp(time.time())
    await client.strategic_patch(f"/api/v1/nodes/{name}/status",
                                 {"status": {"conditions": [ready_condition(ready, now)]}})


@dataclass
class FakeKubelet:
    """Runs the pods bound to the fake nodes it serves (all fake nodes, or those of one pool)."""

    client: KubeClient
    pool: str = ""
    nodes: dict[str, Obj] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # pod uid -> when it started running
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self) -> None:
        selector = f"{FAKE_LABEL}=true" + (f",gpusched.io/pool={self.pool}" if self.pool else "")
        nodes = Reflector(self.client, "/api/v1/nodes", self._on_node, label_selector=selector)
        pods = Reflector(self.client, "/api/v1/pods", self._on_pod, field_selector="spec.nodeName!=")
        await asyncio.gather(nodes.run(), pods.run())

    async def _on_node(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == DELETED and old is not None:
            self.nodes.pop(meta(old)["name"], None)
        elif new is not None:
            self.nodes[meta(new)["name"]] = new

    def _serves(self, pod: Obj) -> bool:
        node = self.nodes.get(pod.get("spec", {}).get("nodeName", ""))
        return node is not None and is_ready(node)

    async def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == DELETED or new is None or not self._serves(new):
            return
        uid = meta(new)["uid"]
        phase = new.get("status", {}).get("phase")
        if meta(new).get("deletionTimestamp"):
            self._spawn(self._stop(new))
        elif phase == "Pending" and uid not in self.started:
            self.started[uid] = time.monotonic()
            self._spawn(self._start(new))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _path(self, pod: Obj, sub: str = "") -> str:
        m = meta(pod)
        return f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}" + (f"/{sub}" if sub else "")

    async def _start(self, pod: Obj) -> None:
        now = timestamp(time.time())
        containers = [{"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                       "imageID": "", "started": True, "state": {"running": {"startedAt": now}}}
                      for c in pod.get("spec", {}).get("containers", [])]
        status = {"phase": "Running", "startTime": now, "podIP": "10.1.0.1", "hostIP": "10.0.0.1",
                  "containerStatuses": containers,
                  "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                                 {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                                 {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}
        with contextlib.suppress(ApiError):
            await self.client.strategic_patch(self._path(pod, "status"), {"status": status})
        runtime = notes_of(pod).get(RUNTIME)
        if runtime:
            code = int(notes_of(pod).get(EXIT_CODE, "0"))
            loop = asyncio.get_running_loop()
            self.timers[meta(pod)["uid"]] = loop.call_later(float(runtime), lambda: self._spawn(self._end(pod, code)))

    async def _end(self, pod: Obj, code: int, phase: str = "") -> None:
        now = timestamp(time.time())
        containers = [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                       "imageID": "", "started": False,
                       "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                "startedAt": now, "finishedAt": now}}}
                      for c in pod.get("spec", {}).get("containers", [])]
        status = {"phase": phase or ("Succeeded" if code == 0 else "Failed"), "containerStatuses": containers,
                  "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}
        with contextlib.suppress(ApiError):
            await self.client.strategic_patch(self._path(pod, "status"), {"status": status})

    async def _stop(self, pod: Obj) -> None:
        """A graceful deletion: the job checkpoints (when it says it can), its containers end, the kubelet
        confirms."""
        uid = meta(pod)["uid"]
        timer = self.timers.pop(uid, None)
        if timer is not None:
            timer.cancel()
        if notes_of(pod).get(CHECKPOINTS) == "true" and uid in self.started:
            progress = time.monotonic() - self.started[uid]
            with contextlib.suppress(ApiError):
                await self.client.merge_patch(self._path(pod), {"metadata": {"annotations": {
                    CHECKPOINT_ANNOTATION: f"ckpt-{progress:.1f}", PROGRESS_ANNOTATION: f"{progress:.3f}"}}})
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            await self._end(pod, 143, phase="Failed")
        with contextlib.suppress(ApiError):
            await self.client.delete(self._path(pod), {"apiVersion": "v1", "kind": "DeleteOptions",
                                                       "gracePeriodSeconds": 0,
                                                       "preconditions": {"uid": uid}})
        self.started.pop(uid, None)


async def serve(args: argparse.Namespace) -> None:
    client = KubeClient(KubeConfig.load(args.kubeconfig), user_agent="gpusched-fake-kubelet")
    try:
        names = [f"{args.prefix}{i}" for i in range(args.nodes)]
        if names:
            await create_nodes(client, names, args.gpus, racks=args.racks, pool=args.pool, product=args.product)
            log.info("%d fake node(s) with %d GPU(s) each", len(names), args.gpus)
        ascend = [f"{args.prefix}ascend-{i}" for i in range(args.ascend_nodes)]
        if ascend:
            await create_nodes(client, ascend, 8, racks=args.racks, pool=args.pool, ascend_chip=args.ascend_chip)
            log.info("%d fake Ascend server(s) of 8 %s NPUs", len(ascend), args.ascend_chip)
        await FakeKubelet(client, pool=args.pool).run()
    finally:
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m libs.kube.fake_kubelet", description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=0, help="fake nodes to create first")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--racks", type=int, default=1)
    p.add_argument("--prefix", default="gpu-node-")
    p.add_argument("--pool", default="", help="label the nodes gpusched.io/pool=POOL, and serve only those")
    p.add_argument("--product", default="NVIDIA-A100-SXM4-80GB")
    p.add_argument("--ascend-nodes", type=int, default=0, help="fake Ascend servers (8 NPUs each) to create too")
    p.add_argument("--ascend-chip", default="910A", help="their chip, as MindCluster labels it")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fake-kubelet %(levelname)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
