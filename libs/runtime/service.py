"""Run one service: connect, bind its reactor, serve HTTP, stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from libs.bus.jetstream import Bus
from libs.runtime.handler import Handler
from libs.runtime.http import base_app
from libs.runtime.reactor import Reactor
from libs.runtime.settings import Settings
from libs.telemetry.tracing import setup_tracing

log = logging.getLogger(__name__)

Task = Callable[[Bus, Reactor], Coroutine[Any, Any, None]]


async def run_service(
    settings: Settings,
    handler: Handler,
    configure_app: Callable[[web.Application, Bus, Reactor], None] | None = None,
    background: tuple[Task, ...] = (),
    on_ready: Callable[[Bus, Reactor], Awaitable[None]] | None = None,
) -> None:
    tracing = setup_tracing(settings.service, settings.trace_exporter)
    bus = await Bus.connect(settings.bus, name=f"gpusched-{settings.service}")
    reactor = Reactor(bus, handler, batch_size=settings.batch_size, audit_key=settings.audit_key,
                      audit_every=settings.audit_every, tracing=tracing)
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

    await reactor.start()
    if on_ready is not None:
        await on_ready(bus, reactor)
    tasks = [asyncio.create_task(reactor.run(), name="reactor")]
    tasks += [asyncio.create_task(t(bus, reactor), name=getattr(t, "__name__", "task")) for t in background]
    stopper = asyncio.create_task(stop.wait(), name="stop")
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    reactor.stop()
    failed = [t for t in done if t is not stopper and not t.cancelled() and t.exception() is not None]
    for t in failed:
        log.error("%s task %s failed", settings.service, t.get_name(), exc_info=t.exception())
    for t in [*tasks, stopper]:
        t.cancel()
    # Wait for the cancelled tasks before closing the connection they use.
    await asyncio.gather(*tasks, stopper, return_exceptions=True)
    await runner.cleanup()
    await bus.close()
    if tracing is not None:
        tracing.shutdown()  # exports the spans still buffered
    if failed:
        raise SystemExit(1)  # crash-only: the supervisor restarts us and we resume from the log
