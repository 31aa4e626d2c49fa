"""Admission wiring: the pure admission core on the reactor shell, plus the public HTTP API."""

from __future__ import annotations

from aiohttp import web

from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.http import READY_DETAILS
from libs.runtime.main import service_main
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from libs.views.store import ViewStore
from services.admission import auth
from services.admission.api import JobsApi
from services.admission.nodes_api import NodesApi
from services.admission.queues_api import QueuesApi
from services.admission.services_api import ServicesApi


async def serve(settings: Settings) -> None:
    decider = AdmissionDecider()
    store = ViewStore.from_url(settings.redis_url, prefix=settings.stream.lower())

    def configure(app: web.Application, bus: Bus, reactor: Reactor) -> None:
        # Counts only (no team's data): what `gpusched up` waits for, readable without a token.
        # (read at each call: a restored snapshot gives the decider another state object)
        app[READY_DETAILS] = lambda: {"inventory": decider.state.inventory.known,
                                      "nodes": len(decider.state.inventory.nodes),
                                      "queues": len(decider.state.policy.queues)}
        auth.install(app)
        JobsApi(bus, decider, store).routes(app)
        QueuesApi(bus, decider, store).routes(app)
        NodesApi(bus, decider).routes(app)
        ServicesApi(bus, decider).routes(app)

    try:
        await run_service(settings, DeciderHandler(decider), configure_app=configure)
    finally:
        await store.close()


def main() -> None:
    service_main("admission", serve)
