"""Accounting wiring: the ledger projector on the reactor shell."""

from __future__ import annotations

from libs.reports.rates import load_rates
from libs.runtime.main import service_main
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from libs.views.projector import Projector
from libs.views.store import ViewStore


async def serve(settings: Settings) -> None:
    store = ViewStore.from_url(settings.redis_url, prefix=settings.stream.lower())
    try:
        await run_service(settings, Projector(store, load_rates()))
    finally:
        await store.close()


def main() -> None:
    service_main("accounting", serve)
