"""The HTTP surface every service shares: /healthz, /readyz, /metrics, and JSON helpers."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from contracts.views import ApiError

JSON = "application/json"
log = logging.getLogger(__name__)
# More of a service's state for /readyz to report next to `ready` (admission: is the inventory known yet?).
READY_DETAILS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("ready_details")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=JSON, headers=headers)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(ApiError(code=code, message=message), status=status, headers=headers)


class HttpError(Exception):
    """Raised anywhere below a handler (a middleware, a permission check) to answer with an ApiError: the
    caller learns the code and message, plus any headers the status calls for (WWW-Authenticate,
    Retry-After), without every handler threading a response back."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.headers = status, code, message, headers

    def response(self) -> web.Response:
        return error_response(self.status, self.code, self.message, self.headers)


T = TypeVar("T")


def decode_body(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """A request's JSON body as `decoder`'s type: 400 `malformed_json` (not JSON) or `invalid_request` (not
    the type), with msgspec's message naming the field."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as err:
        raise HttpError(400, "invalid_request", str(err)) from None
    except msgspec.DecodeError as err:
        raise HttpError(400, "malformed_json", str(err)) from None


def check_query(request: web.Request, allowed: frozenset[str]) -> None:
    """400 for a query parameter the operation does not take: a typo (`?stat=running`) would otherwise be
    ignored silently and answer as if no filter had been asked for."""
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise HttpError(400, "unknown_parameter", f"unknown query parameter(s) {', '.join(map(repr, unknown))}; "
                                                  f"this operation takes {', '.join(sorted(allowed)) or 'none'}")


_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
          415: "unsupported_media_type"}


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
    """Every error leaves as JSON with a code and a message, including aiohttp's own (404, 405, 413)."""
    try:
        return await handler(request)
    except HttpError as err:
        return err.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # Allow (on a 405) tells the caller which methods the path does take.
        kept = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(exc.status, _CODES.get(exc.status, f"http_{exc.status}"), exc.reason or exc.text or "",
                              kept or None)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "the server failed; the request was not applied")


def not_before_ready(is_ready: Callable[[], bool]) -> Any:
    """The API answers 503 with Retry-After until the service has caught up with the log: checked against a
    half-replayed policy or inventory, a valid request would be refused (a 422 the caller would trust)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if request.path.startswith("/v1/") and not is_ready():
            raise HttpError(503, "not_ready", "the service is catching up with the log; try again shortly",
                            {"Retry-After": "1"})
        return await handler(request)

    return middleware


def base_app(service: str, is_ready: Callable[[], bool]) -> web.Application:
    app = web.Application(client_max_size=1 << 20, middlewares=[json_errors, not_before_ready(is_ready)])

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"service": service, "status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        # The pid lets a supervisor tell its own child from another process on the same port.
        body = {"service": service, "ready": is_ready(), "pid": os.getpid()}
        details = request.app.get(READY_DETAILS)
        if details is not None:
            body.update(details())
        return json_response(body, status=200 if body["ready"] else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
