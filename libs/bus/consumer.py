"""A JetStream pull consumer: the messages of a durable (or a reader's ephemeral) subscription as soon as there
is one, with whatever else is already there. The bus makes them (libs/bus/jetstream.py); the streaming consumer
(libs/bus/streaming.py) keeps its requests open instead of asking per fetch."""

from __future__ import annotations

import logging

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import ServiceUnavailableError

from libs.bus.failover import FAILOVER_WAIT_S, FailoverWait

log = logging.getLogger(__name__)

# How long a fetch waits for more once it has a first message, unless its consumer is given another wait:
# the only latency batching may add. Services off the path to a placement wait longer (libs/runtime/settings.py).
REST_WAIT_S = 0.005


class Consumer:
    """A pull consumer of one stream; `nc` is the connection its requests go out on."""

    def __init__(self, stream: str, nc: NatsClient, sub: JetStreamContext.PullSubscription, durable: str | None,
                 rest_wait_s: float = REST_WAIT_S) -> None:
        if rest_wait_s < 0:
            raise ValueError(f"a fetch's rest wait must be 0 or more, not {rest_wait_s}")
        self.stream = stream
        self.nc = nc
        self.sub = sub
        self.durable = durable
        self.rest_wait_s = rest_wait_s
        self._failover = FailoverWait(FAILOVER_WAIT_S)

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages as soon as there is one: wait (up to `timeout`) for the first, then take
        whatever else is already there or, when nothing is, whatever comes within the consumer's rest wait. A
        single pull of `batch` would hold the first message until the batch fills or the pull expires, adding
        up to `timeout` of latency to every hop when traffic is light."""
        try:
            first = await self.sub.fetch(1, timeout=timeout)
        except (TimeoutError, nats.errors.TimeoutError):
            self._failover.answered()
            return []
        except ServiceUnavailableError:
            await self._failover.wait(self.durable, self.stream, timeout)
            return []
        self._failover.answered()
        if batch <= 1 or self.rest_wait_s == 0:
            return first
        try:
            return first + await self.sub.fetch(batch - 1, timeout=self.rest_wait_s)
        except (TimeoutError, nats.errors.TimeoutError, ServiceUnavailableError):
            return first

    async def close(self) -> None:
        try:
            await self.sub.unsubscribe()
        except Exception:  # closing a reader whose server went away is not an error worth raising
            log.debug("unsubscribe failed", exc_info=True)


def stream_seq(msg: Msg) -> int:
    return int(msg.metadata.sequence.stream)
