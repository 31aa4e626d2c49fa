"""Run one service: connect, bind its reactor, serve HTTP, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from libs.bus.fencing import Deposed
from libs.bus.jetstream import Bus
from libs.runtime.handler import Handler
from libs.runtime.http import base_app
from libs.runtime.reactor import Reactor
from libs.runtime.settings import Settings
from libs.runtime.snapshots import SnapshotPolicy, Snapshottable, Snapshotter
from libs.runtime.standby import Replica, ReplicaSettings
from libs.telemetry.tracing import setup_tracing

log = logging.getLogger(__name__)

Task = Callable[[Bus, Reactor], Coroutine[Any, Any, None]]


async def run_service(
    settings: Settings,
    handler: Handler,
    configure_app: Callable[[web.Application, Bus, Reactor], None] | None = None,
    background: tuple[Task, ...] = (),
    on_ready: Callable[[Bus, Reactor], Awaitable[None]] | None = None,
    on_start: Callable[[Bus], None] | None = None,
) -> None:
    """Run the service until SIGTERM/SIGINT. With GPUSCHED_STANDBY=1 it is one replica of several: it stands by
    until it leads (libs/runtime/standby.py), and writes to the log only through its epoch's fence; its HTTP API
    (`configure_app`) serves from the start and publishes commands, which are inputs any replica may send."""
    tracing = setup_tracing(settings.service, settings.trace_exporter)
    bus = await Bus.connect(settings.bus, name=f"gpusched-{settings.service}")
    replicas = ReplicaSettings.from_env()
    replica = Replica(bus, settings.service, replicas) if replicas.standby else None
    writer = replica.writer if replica is not None else bus
    policy = SnapshotPolicy.from_env()
    snapshots = Snapshotter(bus, handler, policy) if policy.enabled and isinstance(handler, Snapshottable) else None
    reactor = Reactor(writer, handler, batch_size=settings.batch_size, batch_wait_s=settings.batch_wait_s,
                      audit_key=settings.audit_key, audit_every=settings.audit_every, tracing=tracing,
                      snapshots=snapshots)
    app = base_app(settings.service, reactor.ready.is_set)
    if configure_app is not None:
        configure_app(app, bus, reactor)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.http_host, settings.http_port)
    await site.start()
    log.info("%s listening on http://%s:%d", settings.service, settings.http_host, settings.http_port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait(), name="stop")
    tasks: list[asyncio.Task[None]] = []
    failed: list[asyncio.Task[Any]] = []
    try:
        if replica is not None:
            tasks = [asyncio.create_task(replica.lead(reactor), name="standby")]
            await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                return
            tasks[0].result()  # raises what made it fail
            # Renewed from now on: the catch-up below may take longer than the lease lives.
            tasks = [asyncio.create_task(replica.keep(writer, reactor), name="lease")]
        if on_start is not None:  # the handler may need the writer while it catches up (after_catch_up)
            on_start(writer)
        await reactor.start()
        if on_ready is not None:
            await on_ready(writer, reactor)
        tasks.append(asyncio.create_task(reactor.run(), name="reactor"))
        tasks += [asyncio.create_task(t(writer, reactor), name=getattr(t, "__name__", "task")) for t in background]
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        reactor.stop()
        failed = [task for task in done if task is not stopper and not task.cancelled()
                  and task.exception() is not None]
        for task in failed:
            err = task.exception()
            if isinstance(err, Deposed):
                log.error("%s: another replica leads now (%s); stopping", settings.service, err)
            else:
                log.error("%s task %s failed", settings.service, task.get_name(), exc_info=err)
    finally:
        for task in [*tasks, stopper]:
            task.cancel()
        # Wait for the cancelled tasks before closing the connection they use.
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
        if replica is not None:
            await replica.resign()
        if snapshots is not None:
            await snapshots.close()
        await runner.cleanup()
        await bus.close()
        if tracing is not None:
            tracing.shutdown()  # exports the spans still buffered
    if failed:
        raise SystemExit(1)  # crash-only: the supervisor restarts us and we resume from the log
