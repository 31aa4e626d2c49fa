"""Process entry for a service: logging, event loop, settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from libs.core.kernel.decider import Decider
from libs.runtime.handler import DeciderHandler
from libs.runtime.service import run_service
from libs.runtime.settings import Settings


def configure_logging(service: str) -> None:
    level = os.environ.get("GPUSCHED_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )


def service_main(service: str, serve: Callable[[Settings], Coroutine[Any, Any, None]]) -> None:
    configure_logging(service)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # uvloop is optional (not on every platform)
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(Settings.from_env(service)))


def decider_main(service: str, make_decider: Callable[[], Decider]) -> None:
    """Entry for a service that is nothing but its pure core on the reactor shell."""

    async def serve(settings: Settings) -> None:
        await run_service(settings, DeciderHandler(make_decider()))

    service_main(service, serve)
