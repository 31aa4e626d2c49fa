"""Leases: which replica of a service may write, held in a JetStream key-value bucket.

One bucket per platform, `<STREAM>_LEASES`, whose entries expire `ttl_s` after they were last written;
one key per service (its name), whose value names the holder. Acquiring is `create` (stored only if the key
holds nothing: never written, expired, or released); renewing is `update(last=revision)` (stored only if
nobody wrote the key since this holder did). A holder that stops renewing, crashed or frozen, loses the
lease `ttl_s` after its last renewal and a standby acquires it; the old holder learns it when its next
renewal is refused. The lease decides who should write; fencing (libs/bus/fencing.py) makes sure nobody
else can, whatever the clocks and pauses.
"""

from __future__ import annotations

import logging

import msgspec
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from libs.bus.jetstream import Bus

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another replica holds the lease now."""


class LeaseValue(msgspec.Struct, frozen=True, kw_only=True):
    holder: str
    since: float  # when this holder acquired it (wall clock, for operators)


def lease_bucket_name(stream: str) -> str:
    return f"{stream}_LEASES"


def lease_bucket(bus: Bus) -> str:
    return lease_bucket_name(bus.config.stream)


async def lease_store(bus: Bus, ttl_s: float, create: bool = True) -> KeyValue:
    """The lease bucket; created with `ttl_s` when missing (an existing bucket keeps the TTL it was made with)."""
    name = lease_bucket(bus)
    try:
        kv = await bus.js.key_value(name)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            raise
        kv = await bus.js.create_key_value(KeyValueConfig(bucket=name, ttl=ttl_s, history=1, direct=True,
                                                          storage=StorageType.FILE, replicas=bus.config.replicas))
    return kv


class Lease:
    def __init__(self, kv: KeyValue, service: str, holder: str) -> None:
        self.kv = kv
        self.service = service
        self.holder = holder
        self.revision: int | None = None  # of this holder's last write; None: not held
        self._since = 0.0

    def _value(self) -> bytes:
        return msgspec.json.encode(LeaseValue(holder=self.holder, since=self._since))

    async def holder_now(self) -> str | None:
        """Who holds the lease (None: nobody)."""
        try:
            entry = await self.kv.get(self.service)
        except KeyNotFoundError:
            return None
        return msgspec.json.decode(entry.value or b"{}", type=LeaseValue).holder

    async def try_acquire(self, now: float) -> bool:
        """Take the lease if nobody holds it (or this holder already did, before a restart)."""
        self._since = now
        try:
            self.revision = await self.kv.create(self.service, self._value())
            return True
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await self.kv.get(self.service)
        except KeyNotFoundError:
            return False  # expired between the two calls: the next try creates it
        if msgspec.json.decode(entry.value or b"{}", type=LeaseValue).holder != self.holder:
            return False
        try:
            self.revision = await self.kv.update(self.service, self._value(), last=entry.revision)
        except KeyWrongLastSequenceError:
            return False
        return True

    async def renew(self) -> None:
        """Write the lease again, resetting its expiry; raises LeaseLost when someone else wrote it since."""
        if self.revision is None:
            raise LeaseLost(f"{self.service}: not held")
        try:
            self.revision = await self.kv.update(self.service, self._value(), last=self.revision)
        except KeyWrongLastSequenceError as err:
            self.revision = None
            raise LeaseLost(f"{self.service}: the lease was taken over (held now by "
                            f"{await self.holder_now() or 'nobody'})") from err

    async def release(self) -> None:
        """Give the lease up at once (a clean stop), so that a standby need not wait for it to expire."""
        if self.revision is None:
            return
        revision, self.revision = self.revision, None
        try:
            await self.kv.delete(self.service, last=revision)
        except Exception as err:  # expired or taken meanwhile, or the server away: nothing left to give up
            log.debug("lease release of %s: %s", self.service, err)
