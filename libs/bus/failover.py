"""Waiting out a consumer's missing leader: on a cluster, the server that led it was lost and the others are
electing another (seconds); past a limit it is not an election (the consumer is gone) and the error is raised."""

from __future__ import annotations

import asyncio
import logging

from nats.js.errors import ServiceUnavailableError

log = logging.getLogger(__name__)
# How long a consumer or a publish waits for a stream or consumer without a leader before it gives up.
FAILOVER_WAIT_S = 30.0


class FailoverWait:
    """How long a consumer has gone without a leader: an election on a cluster takes seconds; beyond
    `limit_s` it is not an election (the consumer is gone) and the caller is told so."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._since: float | None = None

    def answered(self) -> None:
        self._since = None

    async def wait(self, durable: str | None, stream: str, timeout: float) -> None:
        now = asyncio.get_running_loop().time()
        if self._since is None:
            self._since = now
            log.warning("consumer %s of %s has no leader; waiting up to %.0fs for one", durable or "(reader)",
                        stream, self.limit_s)
        elif now - self._since > self.limit_s:
            raise ServiceUnavailableError(description=f"consumer {durable} has had no leader for "
                                                      f"{self.limit_s:.0f}s")
        await asyncio.sleep(min(timeout, 0.5))
