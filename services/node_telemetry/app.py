"""Node-telemetry wiring: announce the node inventory, tick the clock, run the simulated executor."""

from __future__ import annotations

import asyncio
import logging
import time

from contracts import ClockTick
from libs.bus.jetstream import Bus
from libs.core.decider import derived_id
from libs.nodes.backend import make_backend
from libs.nodes.nvml import GpuReading
from libs.runtime.main import service_main
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from services.node_telemetry.gpu_samples import sample_forever, simulated_samples
from services.node_telemetry.sim_executor import SimExecutor

log = logging.getLogger(__name__)
SOURCE = "node-telemetry"


async def serve(settings: Settings) -> None:
    backend = make_backend(settings.node_backend, str(settings.cluster_csv))
    handler = SimExecutor(bus=None, time_scale=settings.time_scale)

    async def announce_inventory(bus: Bus, reactor: Reactor) -> None:
        handler.bus = bus
        changes = handler.inventory.changes(backend.discover(), now=time.time())
        await bus.publish(changes)
        log.info("%s backend: %d node(s) announced", backend.name, len(changes))

    async def tick(bus: Bus, reactor: Reactor) -> None:
        """The clock of the log: time-driven decisions react to these, never to their own clock."""
        period = settings.tick_seconds
        while True:
            now = time.time()
            n = int(now // period)
            await bus.publish([ClockTick(id=derived_id(SOURCE, "tick", period, n), ts=n * period, source=SOURCE)])
            await asyncio.sleep((n + 1) * period - time.time())

    def samples() -> list[GpuReading]:
        read = getattr(backend, "sample", None)  # the NVML backend reads the driver
        return read() if read is not None else simulated_samples(handler.inventory, handler.book.runs.values())

    async def sample(bus: Bus, reactor: Reactor) -> None:
        await sample_forever(samples, min(settings.tick_seconds, 5.0))

    await run_service(settings, handler, on_ready=announce_inventory, background=(tick, sample))


def main() -> None:
    service_main("node-telemetry", serve)
