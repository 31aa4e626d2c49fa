"""Accounting wiring: the projector on the reactor shell, with a usage endpoint."""

from __future__ import annotations

from aiohttp import web

from libs.bus.jetstream import Bus
from libs.runtime.http import json_response
from libs.runtime.main import service_main
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from libs.views.store import ViewStore
from services.accounting.projector import Projector


async def serve(settings: Settings) -> None:
    store = ViewStore.from_url(settings.redis_url, prefix=settings.stream.lower())
    projector = Projector(store)

    def configure(app: web.Application, bus: Bus, reactor: Reactor) -> None:
        async def usage(_: web.Request) -> web.Response:
            return json_response(await store.usage())

        app.router.add_get("/v1/usage", usage)

    try:
        await run_service(settings, projector, configure_app=configure)
    finally:
        await store.close()


def main() -> None:
    service_main("accounting", serve)
