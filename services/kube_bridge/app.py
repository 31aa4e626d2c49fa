"""`gpusched kube`: the Kubernetes bridge, one process beside the platform's services.

It reads the log like a service (its own durable consumer, snapshots off: its state is the log's fold and the
API server's objects) and, once the log's history is folded, starts three informers (Nodes, Pods, Jobs).
With `GPUSCHED_STANDBY=1` several bridges may run: one holds the platform's lease and acts; its writes to
the log are fenced, so a deposed bridge can append nothing (`docs/reliability.md`); the standbys follow.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import aiohttp
from aiohttp import web

from libs.bus.jetstream import Bus
from libs.kube.client import ApiError, KubeClient, KubeConfig
from libs.kube.nodes import TopologyLabels
from libs.kube.reflector import Reflector
from libs.runtime.main import configure_logging
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from libs.views.store import ViewStore
from services.kube_bridge.actions import KubeActions
from services.kube_bridge.book import JOB, PLACED, WAITING, Tracked
from services.kube_bridge.bridge import KubeBridge
from services.kube_bridge.claims import ClaimAllocator
from services.kube_bridge.explainer import Explainer
from services.kube_bridge.metrics import RELISTS
from services.kube_bridge.node_sync import NodeSync
from services.kube_bridge.workload_sync import WorkloadSync

log = logging.getLogger(__name__)
SERVICE = "kube-bridge"


class BridgeProcess:
    """The bridge's parts and the informers that feed them."""

    def __init__(self, client: KubeClient, store: ViewStore | None, namespace: str, node_selector: str,
                 topology: TopologyLabels, pdb_wait_s: float, crash_after_binds: int | None = None) -> None:
        self.client = client
        self.bridge = KubeBridge(actions=KubeActions(client, pdb_wait_s=pdb_wait_s,
                                                     crash_after_binds=crash_after_binds),
                                 claims=ClaimAllocator(client))
        self.nodes = NodeSync(self.bridge, topology)
        self.workloads = WorkloadSync(self.bridge, client)
        self.explainer = Explainer(self.bridge, store)
        scope = f"/namespaces/{namespace}" if namespace else ""
        self.node_reflector = Reflector(client, "/api/v1/nodes", self.nodes.on_node, label_selector=node_selector)
        self.pod_reflector = Reflector(client, f"/api/v1{scope}/pods", self.workloads.on_pod)
        self.job_reflector = Reflector(client, f"/apis/batch/v1{scope}/jobs", self.workloads.on_job)
        self.slice_reflector = Reflector(client, "/apis/resource.k8s.io/v1/resourceslices", self.nodes.on_slice)
        for reflector in (self.node_reflector, self.pod_reflector, self.job_reflector, self.slice_reflector):
            reflector.on_relist = lambda path: RELISTS.labels(path.rsplit("/", 1)[-1]).inc()

    def use_bus(self, bus: Bus) -> None:
        self.bridge.outbox.bus = bus

    async def informers(self, bus: Bus, reactor: Reactor) -> None:
        """Nodes first (a pod's placement needs them), then Jobs and Pods; then carry out what the log says
        is placed but a restart may have left half done."""
        await self.bridge.caught_up.wait()
        tasks = []
        if await self.has_dra():  # the DRA driver's devices first: they are the nodes' GPUs where published
            tasks.append(asyncio.create_task(self.slice_reflector.run(), name="resourceslices"))
            await self.slice_reflector.synced.wait()
        tasks.append(asyncio.create_task(self.node_reflector.run(), name="nodes"))
        await self.node_reflector.synced.wait()
        tasks.append(asyncio.create_task(self.job_reflector.run(), name="jobs"))
        await self.job_reflector.synced.wait()
        tasks.append(asyncio.create_task(self.pod_reflector.run(), name="pods"))
        await self.pod_reflector.synced.wait()
        await self.resume()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()

    async def has_dra(self) -> bool:
        """Whether the cluster serves resource.k8s.io/v1 (Dynamic Resource Allocation) to the bridge."""
        try:
            await self.client.get("/apis/resource.k8s.io/v1")
        except (ApiError, aiohttp.ClientError) as err:
            log.info("no DRA (resource.k8s.io/v1: %s): GPUs from the device plugin's resources only", err)
            return False
        return True

    async def resume(self) -> None:
        """After a (re)start: every placed run is carried out again (binds are idempotent), every stopping run
        stopped, every waiting job explained."""
        b = self.bridge
        # Nodes the log holds that the cluster does not (a simulated cluster's, run before in the same folder; a
        # node deleted while no bridge watched): lost, so nothing is placed on them and their runs go elsewhere.
        for name in sorted(set(b.book.nodes) - set(self.node_reflector.store) - b.book.lost):
            await self.nodes.lose(name, "not_in_cluster")
        for job in b.book.active():
            gone = self.gone_while_away(job)
            if gone:
                await b.publish([b.cancel(job, gone)])
            elif job.state == "placed":
                b._run(job.job_id, b.place(job))
            elif job.state == "stopping":
                b._run(job.job_id, b.stop(job, job.stop_reason or "preempted"))
            else:
                b.explain_due.add(job.job_id)
        log.info("kube bridge resumed: %d active job(s), %d node(s), %d pod(s)", len(b.book.active()),
                 len(self.node_reflector.store), len(self.pod_reflector.store))

    async def flush(self, bus: Bus, reactor: Reactor) -> None:
        await self.bridge.outbox.flush_forever()

    async def gangs(self, bus: Bus, reactor: Reactor) -> None:
        await self.bridge.caught_up.wait()
        await self.workloads.say_incomplete_forever()

    def gone_while_away(self, job: Tracked) -> str:
        """The reason to cancel a job whose objects the user deleted while no bridge watched ("" if none did):
        the informers' first lists no longer hold them, so no deletion will ever be seen."""
        b = self.bridge
        if job.cancelled or job.state not in (PLACED, WAITING):
            return ""
        if job.kind == JOB:
            return "" if (job.namespace, job.name) in b.cache.batch_jobs else "job_deleted"
        return "" if all(b.cache.member_present(job, name) for name in job.pods) else "pod_deleted"

    async def explain(self, bus: Bus, reactor: Reactor) -> None:
        await self.bridge.caught_up.wait()
        await self.explainer.run()

    def routes(self, app: web.Application, bus: Bus, reactor: Reactor) -> None:
        async def status(_: web.Request) -> web.Response:
            b = self.bridge
            return web.json_response({
                "jobs": len(b.book.active()), "nodes": len(self.node_reflector.store),
                "pods": len(b.cache.pods), "binds": b.actions.binds, "bind_conflicts": b.actions.bind_conflicts,
                "relists": {"nodes": self.node_reflector.relists, "pods": self.pod_reflector.relists,
                            "jobs": self.job_reflector.relists}})

        app.router.add_get("/v1/kube", status)


async def serve(settings: Settings, args: argparse.Namespace) -> None:
    client = KubeClient(KubeConfig.load(args.kubeconfig))
    store = ViewStore.from_url(settings.redis_url, prefix=settings.stream.lower()) if args.explain else None
    process = BridgeProcess(client, store, args.namespace, args.node_selector, TopologyLabels.parse(args.topology),
                            args.pdb_wait_s, args.crash_after_binds)
    try:
        await run_service(settings, process.bridge, configure_app=process.routes, on_start=process.use_bus,
                          background=(process.flush, process.informers, process.explain, process.gangs))
    finally:
        await client.close()
        if store is not None:
            await store.close()


def cmd_kube(args: argparse.Namespace) -> None:
    configure_logging(SERVICE)
    base = Settings.from_env("node-telemetry")
    settings = Settings(service=SERVICE, nats_url=base.nats_url, redis_url=base.redis_url, stream=base.stream,
                        subject_prefix=base.subject_prefix, http_host=base.http_host, http_port=args.port,
                        batch_size=base.batch_size)
    asyncio.run(serve(settings, args))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="the cluster to serve (default $KUBECONFIG, or the pod's service account)")
    p.add_argument("--namespace", default="", help="serve the pods and Jobs of this namespace only (default all)")
    p.add_argument("--node-selector", default="", help="serve the nodes matching this label selector only")
    p.add_argument("--topology", default="", help="node labels naming rack, block and zone: "
                   "rack=LABEL,block=LABEL,zone=LABEL (defaults topology.gpusched.io/rack, "
                   "topology.gpusched.io/block, topology.kubernetes.io/zone)")
    p.add_argument("--pdb-wait-s", type=float, default=30.0,
                   help="how long a preemption retries an eviction a PodDisruptionBudget refuses before deleting")
    p.add_argument("--no-explain", dest="explain", action="store_false",
                   help="do not write explanations on waiting pods (no Redis)")
    p.add_argument("--port", type=int, default=8086, help="HTTP port for /metrics, /healthz and /v1/kube")
    p.add_argument("--crash-after-binds", type=int, help=argparse.SUPPRESS)  # crash tests only


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.kube_bridge")
    add_arguments(parser)
    cmd_kube(parser.parse_args())
