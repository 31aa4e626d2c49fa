"""The HTTP surface every service shares: /healthz, /readyz, /metrics, and JSON helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.views import ApiError

JSON = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=JSON, headers=headers)


def error_response(status: int, code: str, message: str) -> web.Response:
    return json_response(ApiError(code=code, message=message), status=status)


def base_app(service: str, is_ready: Callable[[], bool]) -> web.Application:
    app = web.Application(client_max_size=1 << 20)

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"service": service, "status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if is_ready():
            return json_response({"service": service, "ready": True})
        return json_response({"service": service, "ready": False}, status=503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
