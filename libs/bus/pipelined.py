"""Pipelined JetStream publishing that reports the server's refusals.

Every message of a call is sent before any acknowledgement is awaited (one round trip for the lot, as
`publish_async`), in order, each with its own reply subject; the call returns the acknowledgements in order
or raises the first refusal. nats-py's `publish_async` cannot be used where the server may refuse a
message on purpose (a wrong expected sequence, for one): its reply callback raises the refusal instead of
failing the future, which then never completes, and its caller would wait for ever.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

_ERRORS: Mapping[int, type[APIError]] = {400: BadRequestError, 404: NotFoundError, 500: ServerError,
                                         503: ServiceUnavailableError}
# A server that is away answers nothing: how long to wait for the acknowledgements of one call.
ACK_TIMEOUT_S = 10.0

Outgoing = tuple[str, bytes, Mapping[str, str] | None]  # subject, payload, headers


def api_error(err: Mapping[str, Any]) -> APIError:
    """The exception for a JetStream error answer (made, not raised)."""
    cls = _ERRORS.get(int(err.get("code") or 0), APIError)
    return cls(code=err.get("code"), description=err.get("description"), err_code=err.get("err_code"))


class PipelinedPublisher:
    def __init__(self, nc: NatsClient, timeout: float = ACK_TIMEOUT_S) -> None:
        self.nc = nc
        self.timeout = timeout
        self._prefix = ""
        self._sub: Subscription | None = None
        self._tokens = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[PubAck]] = {}

    async def _listen(self) -> None:
        if self._sub is None:
            self._prefix = self.nc.new_inbox()
            self._sub = await self.nc.subscribe(f"{self._prefix}.*", cb=self._on_reply)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self._prefix) + 1:], None)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
        except ValueError as err:
            future.set_exception(APIError(description=f"unreadable acknowledgement: {err}"))
            return
        if "error" in answer:
            future.set_exception(api_error(answer["error"]))
        else:
            future.set_result(PubAck.from_response(answer))

    async def publish(self, messages: Sequence[Outgoing]) -> list[PubAck]:
        if not messages:
            return []
        await self._listen()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[PubAck]] = []
        tokens: list[str] = []
        try:
            for subject, payload, headers in messages:
                token = str(next(self._tokens))
                future: asyncio.Future[PubAck] = loop.create_future()
                self._waiting[token] = future
                tokens.append(token)
                futures.append(future)
                await self.nc.publish(subject, payload, reply=f"{self._prefix}.{token}",
                                      headers=dict(headers) if headers else None)
            _, pending = await asyncio.wait(futures, timeout=self.timeout)
            if pending:
                raise TimeoutError(f"{len(pending)} of {len(futures)} message(s) not acknowledged in "
                                   f"{self.timeout:g}s")
            errors = [f.exception() for f in futures]  # retrieves every error, so none is reported unread
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
            return [f.result() for f in futures]
        finally:
            for token, future in zip(tokens, futures, strict=False):
                self._waiting.pop(token, None)
                if not future.done():
                    future.cancel()

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be closed already
                return
