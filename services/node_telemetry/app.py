"""Node-telemetry wiring: the node decisions (GPU quarantine, cordons, removals), the clock, the roster of who
serves each node (agents' heartbeats, nodes of another cluster source removed at start, jobs of lost nodes
reported evicted), and by backend either the simulated cluster (announce its inventory, run the simulated
executor, export simulated GPU samples), real node agents (`agents`: the agents announce themselves and run
the jobs) or a Kubernetes cluster (`kubernetes`: the bridge announces the nodes and runs the jobs as pods)."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from contracts import ClockTick, NodeLost
from libs.bus.jetstream import Bus
from libs.core.kernel.decider import derived_id
from libs.nodes.backend import make_backend
from libs.runtime.main import service_main
from libs.runtime.reactor import Reactor
from libs.runtime.service import Task, run_service
from libs.runtime.settings import Settings
from libs.sim.live_executor import SimExecutor
from libs.telemetry.gpu import sample_forever
from services.node_telemetry.gpu_samples import simulated_samples
from services.node_telemetry.handler import NodeTelemetry
from services.node_telemetry.heartbeats import HeartbeatWatch, watch_nodes
from services.node_telemetry.roster import OWN_BACKEND

log = logging.getLogger(__name__)
SOURCE = "node-telemetry"
AGENTS = "agents"  # the backend where node agents announce the nodes and run the jobs
# The backend where the Kubernetes bridge (`gpusched kube`) announces the nodes, reports their loss and runs the
# jobs as pods: node-telemetry keeps the node decisions and the clock only.
KUBERNETES = "kubernetes"


async def serve(settings: Settings) -> None:
    period = settings.tick_seconds

    async def tick(bus: Bus, reactor: Reactor) -> None:
        """The clock of the log: time-driven decisions react to these, never to their own clock."""
        while True:
            now = time.time()
            n = int(now // period)
            await bus.publish([ClockTick(id=derived_id(SOURCE, "tick", period, n), ts=n * period, source=SOURCE)])
            await asyncio.sleep((n + 1) * period - time.time())

    watch = HeartbeatWatch(lost_after_s=float(os.environ.get("GPUSCHED_NODE_LOST_AFTER_S", "10")))

    async def watch_liveness(bus: Bus, reactor: Reactor) -> None:
        await watch_nodes(bus, watch)

    async def reconcile(bus: Bus, listed: set[str] | None) -> None:
        """Nodes of another cluster source than this one (or no longer in its file) leave, audited."""
        removals = watch.roster.reconcile(settings.node_backend, listed, time.time())
        if removals:
            log.warning("%d node(s) nobody serves now removed: %s", len(removals),
                        ", ".join(e.node for e in removals if isinstance(e, NodeLost)))
            await bus.publish(removals)

    async def reconcile_only(bus: Bus, reactor: Reactor) -> None:
        await reconcile(bus, None)

    if settings.node_backend in (KUBERNETES, AGENTS):
        await run_service(settings, NodeTelemetry(watch=watch), on_ready=reconcile_only,
                          background=(tick, watch_liveness))
        return

    backend = make_backend(settings.node_backend, str(settings.cluster_csv))
    watch.roster.served_here = OWN_BACKEND  # the simulated executor reports its own runs' evictions
    executor = SimExecutor(bus=None, time_scale=settings.time_scale,
                           serves=lambda node: watch.roster.owners.get(node, OWN_BACKEND) == OWN_BACKEND)

    def use_bus(bus: Bus) -> None:
        executor.bus = bus  # before the catch-up: resuming the runs reads the log's latest reports

    async def announce_inventory(bus: Bus, reactor: Reactor) -> None:
        discovered = backend.discover()
        await reconcile(bus, {n.name for n in discovered})
        changes = executor.inventory.changes(discovered, now=time.time())
        await bus.publish(changes)
        log.info("%s backend: %d node(s) announced", backend.name, len(changes))

    async def sample(bus: Bus, reactor: Reactor) -> None:
        await sample_forever(lambda: simulated_samples(executor.inventory, executor.book.runs.values()),
                             min(period, 5.0))

    background: tuple[Task, ...] = (tick, sample, watch_liveness)
    await run_service(settings, NodeTelemetry(executor=executor, watch=watch), on_ready=announce_inventory,
                      background=background, on_start=use_bus)


def main() -> None:
    service_main("node-telemetry", serve)
