"""Replicas of one service: a leader that writes, hot standbys that follow the log, and the takeover.

With `GPUSCHED_STANDBY=1`, a service may run as several processes (`python -m services.placement` twice).
Each is a replica (`GPUSCHED_REPLICA_ID`, by default host and pid). One holds the service's lease
(libs/bus/lease.py) and runs as usual: consumes, decides, publishes, snapshots. The others are standbys:
each keeps its own state hot by reading the log through a reader of its own (the durable consumer belongs
to the leader), folding events as a restart's catch-up does, without publishing anything, never past the
leader's acknowledgement floor. Its state is therefore always the state the leader had at some batch
boundary, which is what a restart starts from, and taking over is a restart with the catch-up done:

1. the lease is free (expired `GPUSCHED_LEASE_TTL_S` after the leader's last renewal, or released on a
   clean stop), and this replica acquires it;
2. it starts a new epoch (libs/bus/fencing.py): from now on the old leader can append nothing;
3. it reads the durable consumer's final ack floor, folds the few events up to it, and re-creates the
   consumer after it (the reactor's ordinary start). Events the old leader handled past its floor are
   decided again: the decisions have the ids they had, and the stream drops those already stored
   (Nats-Msg-Id), so none is lost and none is duplicated;
4. it runs what only the leader runs (start-up hooks, background tasks) and renews the lease every third
   of its TTL. A renewal refused (another replica holds the lease) or impossible for a whole TTL ends the
   process: crash-only, its supervisor starts it again, as a standby.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

from nats.aio.msg import Msg

from libs.bus.consumer import Consumer
from libs.bus.fencing import Deposed, Fence, FencedBus, ensure_fence_subjects
from libs.bus.jetstream import Bus
from libs.bus.lease import Lease, LeaseLost, lease_store
from libs.runtime.reactor import Reactor
from libs.telemetry import metrics

log = logging.getLogger(__name__)

# How long a standby's fetch waits for news: also how often it looks at the lease and the leader's floor
# when the log is quiet.
FOLLOW_WAIT_S = 0.2
LEASE_TTL_S = 5.0


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    standby: bool = False  # GPUSCHED_STANDBY: elect a leader among the service's replicas
    replica_id: str = ""  # GPUSCHED_REPLICA_ID
    lease_ttl_s: float = LEASE_TTL_S  # GPUSCHED_LEASE_TTL_S: a leader silent this long is replaced

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicaSettings:
        env = os.environ if env is None else env
        ttl = float(env.get("GPUSCHED_LEASE_TTL_S", LEASE_TTL_S))
        if ttl < 1.0:
            raise ValueError(f"GPUSCHED_LEASE_TTL_S must be at least 1 second, not {ttl}")
        return cls(standby=_flag(env.get("GPUSCHED_STANDBY", "")),
                   replica_id=env.get("GPUSCHED_REPLICA_ID") or f"{socket.gethostname()}-{os.getpid()}",
                   lease_ttl_s=ttl)


class Replica:
    """One replica of a service: `lead()` returns once it is the leader; `keep()` then holds the lease."""

    def __init__(self, bus: Bus, service: str, settings: ReplicaSettings) -> None:
        self.bus = bus
        self.service = service
        self.settings = settings
        self.fence = Fence(bus, service)
        # What the reactor, the start-up hooks and the background tasks write with.
        self.writer = FencedBus(bus, self.fence)
        self.lease: Lease | None = None
        self.leading = False
        metrics.LEADER.labels(service, settings.replica_id).set(0)

    @property
    def renew_every_s(self) -> float:
        return self.settings.lease_ttl_s / 3

    async def lead(self, reactor: Reactor) -> None:
        """Stand by, following the log, until this replica holds the lease and a new epoch; the reactor's
        state is then at most a few events behind the leader's last acknowledgement."""
        await ensure_fence_subjects(self.bus)
        kv = await lease_store(self.bus, self.settings.lease_ttl_s)
        self.lease = Lease(kv, self.service, self.settings.replica_id)
        floor = await self.bus.ack_floor(reactor.durable)
        await reactor.restore(floor)
        if not await self.lease.try_acquire(time.time()):
            log.info("%s: standby (replica %s); the leader is %s", self.service, self.settings.replica_id,
                     await self.lease.holder_now())
            await self._follow(reactor, self.lease)
        epoch = await self.fence.advance(self.settings.replica_id, self.lease.revision or 0, time.time())
        self.leading = True
        metrics.LEADER.labels(self.service, self.settings.replica_id).set(1)
        log.info("%s: replica %s leads (epoch %d) from sequence %d", self.service, self.settings.replica_id,
                 epoch, reactor.last_seq)

    async def _follow(self, reactor: Reactor, lease: Lease) -> None:
        reader: Consumer | None = None
        held: list[Msg] = []  # fetched, beyond the leader's floor: folded once it has acknowledged them
        try:
            while True:
                if await lease.try_acquire(time.time()):
                    metrics.TAKEOVERS.labels(self.service, self.settings.replica_id).inc()
                    return
                floor = await self.bus.ack_floor(reactor.durable)
                held = reactor.replay(held, floor)
                if held:
                    await asyncio.sleep(FOLLOW_WAIT_S)  # the leader has not acknowledged these yet
                    continue
                try:
                    if reader is None:
                        reader = await self.bus.reader(reactor.subject_types, start_seq=reactor.last_seq + 1)
                    held = reactor.replay(await reader.fetch(1000, timeout=FOLLOW_WAIT_S), floor)
                except Exception as err:  # the server restarted (the reader is gone): read on from here
                    log.warning("%s: standby reader failed (%s); reading again from %d", self.service, err,
                                reactor.last_seq + 1)
                    if reader is not None:
                        await reader.close()
                    reader = None
                    await asyncio.sleep(FOLLOW_WAIT_S)
                metrics.LAST_SEQ.labels(self.service).set(reactor.last_seq)
        finally:
            if reader is not None:
                await reader.close()

    async def keep(self, bus: Bus, reactor: Reactor) -> None:
        """Renew the lease for as long as this replica leads; raises Deposed when it no longer does."""
        assert self.lease is not None, "lead() first"
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await self.lease.renew()
                renewed = time.monotonic()
            except LeaseLost as err:
                raise Deposed(str(err)) from err
            except Exception as err:  # the server away: the lease may still be ours until its TTL runs out
                if time.monotonic() - renewed >= self.settings.lease_ttl_s:
                    raise Deposed(f"{self.service}: lease not renewed for {self.settings.lease_ttl_s:g}s "
                                  f"({err})") from err
                log.warning("%s: lease renewal failed (%s); trying again", self.service, err)

    async def resign(self) -> None:
        """A clean stop: give the lease up so that a standby takes over at once."""
        if self.lease is not None and self.leading:
            await self.lease.release()
        self.leading = False
        metrics.LEADER.labels(self.service, self.settings.replica_id).set(0)
        await self.writer.close_fence()
