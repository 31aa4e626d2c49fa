"""A pull consumer that keeps pull requests open and tops them up (what nats.go calls Consume), instead of
asking the server anew for every batch.

`Consumer.fetch` costs each batch two pull requests (one for the first message, one for the rest), the
server's "request timeout" status when the rest does not fill, and then the batch's acknowledgement. Here a
request for `CREDITS` messages stays open at the server; messages arrive in the subscription's queue as they
are stored, a batch is whatever is queued when the service asks (or comes within its rest wait), and a new
request goes out once fewer than half the credits are left. At 500 jobs a second that is one request per
several hundred messages instead of two per batch of a few.

The server answers on the same inbox: heartbeats while a request waits (`100`), "request timeout" when one
expires (`408`, with how many of its messages were still owed), conflicts (`409`: the consumer was deleted or
its leader changed, the request is gone) and "no responders" (`503`: nobody leads the consumer, e.g. during
an election on a cluster). Credits are counted from these; when the server says nothing for two heartbeats,
every open request is taken as lost and a new one goes out (a message a lost request still delivers is
handled all the same: order is the server's, and the reactor checks delivery sequences).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from libs.bus.consumer import Consumer

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext


log = logging.getLogger(__name__)

CREDITS = 1000  # messages one pull request asks for
EXPIRES_S = 30.0  # how long a pull request stays open at the server
HEARTBEAT_S = 2.0  # the server's heartbeat while a request waits; silence for two of them: requests lost
# A request the server keeps ending at once (a limit of its own) is asked again after a growing wait.
REFUSED_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
STATUS = "Status"
PENDING = "Nats-Pending-Messages"


def streams(sub: JetStreamContext.PullSubscription) -> bool:
    """Does this nats-py keep the pull subscription's internals this consumer builds on (2.9-2.16 do)?"""
    inbox = getattr(sub, "_sub", None)
    return (all(hasattr(sub, name) for name in ("_nms", "_deliver")) and inbox is not None
            and all(hasattr(inbox, name) for name in ("_pending_queue", "_pending_size", "next_msg")))


class StreamingConsumer(Consumer):
    def __init__(self, stream: str, nc: NatsClient, sub: JetStreamContext.PullSubscription, durable: str,
                 rest_wait_s: float) -> None:
        super().__init__(stream, nc, sub, durable, rest_wait_s)
        # nats-py keeps a pull subscription's inbox (where messages and status arrive) and the request subject
        # private; the public fetch sends one request per call, which is what this consumer avoids.
        self._inbox = sub._sub
        self._queue: asyncio.Queue[Msg] = sub._sub._pending_queue
        self._request_subject: str = sub._nms
        self._reply: str = sub._deliver
        self.credits = 0  # messages the open requests may still deliver
        self._heard = time.monotonic()  # when the server last said anything on the inbox
        self._refusals = 0  # requests the server ended since the last message

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages as soon as there is one (waiting up to `timeout` for it), plus whatever else
        comes within the rest wait."""
        await self._top_up()
        msgs: list[Msg] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not msgs:
            left = deadline - loop.time()
            if left <= 0:
                return []
            try:
                msg = await self._inbox.next_msg(timeout=min(left, HEARTBEAT_S))
            except (TimeoutError, nats.errors.TimeoutError):
                await self._top_up()
                continue
            if await self._take(msg, msgs):
                return msgs
        rest = loop.time() + self.rest_wait_s
        while len(msgs) < batch:
            try:
                msg = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = rest - loop.time()
                if left <= 0:
                    break
                try:
                    msg = await self._inbox.next_msg(timeout=left)
                except (TimeoutError, nats.errors.TimeoutError):
                    break
            else:
                self._inbox._pending_size -= len(msg.data)
            if await self._take(msg, msgs):
                break
        await self._top_up()
        return msgs

    async def _take(self, msg: Msg, msgs: list[Msg]) -> bool:
        """Count a message in (data goes to `msgs`); True when a status says to stop waiting for now."""
        self._heard = time.monotonic()
        status = msg.headers.get(STATUS) if msg.headers else None
        if not status:
            self.credits -= 1
            msgs.append(msg)
            self._failover.answered()
            self._refusals = 0
            return False
        if status == "503":  # nobody leads the consumer (an election): wait, then ask again
            self.credits = 0
            await self._failover.wait(self.durable, self.stream, 0.5)
            return True
        self._failover.answered()  # any other word comes from a server that leads the consumer
        if status == "100":  # heartbeat: an open request is still there
            return False
        if status == "408":  # a request expired: what it still owed will not come; ask again at once if low
            owed = msg.headers.get(PENDING) if msg.headers else None
            self.credits = max(self.credits - (int(owed) if owed and owed.isdigit() else self.credits), 0)
            await self._top_up()
            return False
        # 409 and anything else: the server dropped the requests (consumer deleted, leader changed, a limit of
        # the server's exceeded, ...). Ask again, waiting longer each time it keeps refusing without a message.
        description = msg.headers.get("Description", "") if msg.headers else ""
        log.log(logging.WARNING if self._refusals else logging.INFO,
                "%s: pull request ended by the server (%s %s); asking again", self.durable, status, description)
        self.credits = 0
        if self._refusals:
            await asyncio.sleep(min(REFUSED_BACKOFF_S * 2 ** (self._refusals - 1), MAX_BACKOFF_S))
        self._refusals += 1
        return True

    async def _top_up(self) -> None:
        # Silence with nothing queued (what a long batch left unread does not count): the requests are lost.
        if self.credits > 0 and self._queue.empty() and time.monotonic() - self._heard > 2 * HEARTBEAT_S + 1:
            log.info("%s: no word from the server for %.0fs; asking again", self.durable, 2 * HEARTBEAT_S + 1)
            self.credits = 0
        if self.credits >= CREDITS // 2:
            return
        request = {"batch": CREDITS, "expires": int(EXPIRES_S * 1e9), "idle_heartbeat": int(HEARTBEAT_S * 1e9)}
        await self.nc.publish(self._request_subject, json.dumps(request).encode(), self._reply)
        if self.credits == 0:
            self._heard = time.monotonic()
        self.credits += CREDITS

