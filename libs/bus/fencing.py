"""Fencing: a deposed leader's writes are refused by the server, however late they come.

The scheme: each service has an epoch subject in the log's stream, `<prefix>.fence.<service>`. A replica
that becomes its service's leader (it holds the lease, libs/bus/lease.py) first appends an epoch marker
there, with `Nats-Expected-Last-Subject-Sequence` set to the sequence of the last marker it saw, so of two
replicas racing for the same epoch only one succeeds. The marker's stream sequence is the leader's epoch.
From then on every message the leader appends to the log carries

    Nats-Expected-Last-Subject-Sequence: <its epoch>
    Nats-Expected-Last-Subject-Sequence-Subject: <prefix>.fence.<service>

and the server stores it only while the last message on the epoch subject is still the leader's own marker.
When another replica takes over, its marker moves the epoch subject on, and every later write of the old
leader, even one it had prepared before it was frozen and sends after it wakes up, is refused
(`wrong last sequence`, error 10071): `FencedBus.publish` raises `Deposed`, and the old leader stops.

Why not `Nats-Expected-Last-Sequence` on the stream: every service appends to the one stream, so its last
sequence moves under any writer all the time. Why not the expected last sequence of the decision's own
subject: a batch's decisions are pipelined, and the next one's expected sequence is only known once the
previous is acknowledged. The epoch subject changes only on a takeover, so a whole batch carries the same
headers and stays pipelined; a refused message is never stored, and the server checks the epoch before it
de-duplicates, so not even a decision the new leader has already stored again is acknowledged to the old.

Markers are not events: the epoch subjects lie outside `<prefix>.c.>` and `<prefix>.e.>`, which services,
audits and replays read, so they never see one.

What fencing leaves to determinism: a deposed leader's acknowledgements are not fenced (an AckAll is not a
message in the stream). A deposed leader acknowledges a batch only after storing its decisions, so the
only batches it can still acknowledge are those with no decisions at all, which the new leader, deciding
the same events from the same log, makes none for either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import msgspec
from nats.js.errors import BadRequestError, NotFoundError

from contracts.codec import encode
from contracts.events import EventBase
from libs.bus.jetstream import Bus
from libs.bus.pipelined import PipelinedPublisher

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071  # JSStreamWrongLastSequenceErrF


class Deposed(Exception):
    """This replica is not (or no longer) its service's leader: it must not write."""


class EpochMarker(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    holder: str
    previous: int  # sequence of the marker it replaced (0: the first)
    lease_revision: int
    ts: float


def fence_subject(prefix: str, service: str) -> str:
    return f"{prefix}.fence.{service}"


def fence_subjects(prefix: str) -> str:
    """The stream subjects the epoch markers need (all services)."""
    return f"{prefix}.fence.>"


async def ensure_fence_subjects(bus: Bus) -> None:
    """Add the epoch subjects to the log's stream if missing (idempotent; `gpusched nats-setup` calls it as the
    operator, since services may not change the stream)."""
    wanted = fence_subjects(bus.config.subject_prefix)
    info = await bus.js.stream_info(bus.config.stream)
    subjects = list(info.config.subjects or [])
    if wanted in subjects:
        return
    info.config.subjects = [*subjects, wanted]
    try:
        await bus.js.update_stream(info.config)
    except Exception as err:
        raise RuntimeError(f"stream {bus.config.stream} lacks the subjects {wanted} that replicas need, and this "
                           f"user may not add them ({err}): run `gpusched nats-setup` as the operator") from err
    log.info("stream %s: added %s for the replicas' epoch markers", bus.config.stream, wanted)


class Fence:
    """One service's epoch, as this replica holds it (None: it holds none and may not write)."""

    def __init__(self, bus: Bus, service: str) -> None:
        self.bus = bus
        self.service = service
        self.subject = fence_subject(bus.config.subject_prefix, service)
        self.epoch: int | None = None
        self._publisher = PipelinedPublisher(bus.nc)

    async def current(self) -> int:
        """Sequence of the last epoch marker (0: none yet)."""
        try:
            msg = await self.bus.js.get_last_msg(self.bus.config.stream, self.subject)
        except NotFoundError:
            return 0
        return int(msg.seq or 0)

    async def advance(self, holder: str, lease_revision: int, now: float) -> int:
        """Start a new epoch held by this replica; raises Deposed when another replica started one first."""
        previous = await self.current()
        marker = EpochMarker(service=self.service, holder=holder, previous=previous, lease_revision=lease_revision,
                             ts=now)
        try:
            (ack,) = await self._publisher.publish([(self.subject, msgspec.json.encode(marker),
                                                     {"Nats-Expected-Last-Subject-Sequence": str(previous)})])
        except BadRequestError as err:
            if err.err_code == WRONG_LAST_SEQUENCE:
                raise Deposed(f"{self.service}: another replica started an epoch after {previous}") from err
            raise
        self.epoch = int(ack.seq)
        return self.epoch

    def headers(self) -> dict[str, str]:
        if self.epoch is None:
            raise Deposed(f"{self.service}: this replica holds no epoch")
        return {"Nats-Expected-Last-Subject-Sequence": str(self.epoch),
                "Nats-Expected-Last-Subject-Sequence-Subject": self.subject}

    async def close(self) -> None:
        await self._publisher.close()


class FencedBus(Bus):
    """The bus as a leader writes to the log: every message carries its epoch (same connection and stream
    conventions as the bus it wraps; only how a batch is sent differs)."""

    def __init__(self, bus: Bus, fence: Fence) -> None:
        super().__init__(bus.nc, bus.config)
        self.fence = fence
        self._publisher = PipelinedPublisher(bus.nc)

    async def _publish_once(self, events: Sequence[EventBase],
                            headers: Sequence[Mapping[str, str] | None] | None) -> None:
        # Bus.publish sends a batch again while a cluster elects the stream's leader; a refusal is not retried.
        fence = self.fence.headers()
        extras = headers if headers is not None else [None] * len(events)
        # The id comes last: no extra header overrides the de-duplication key, nor the epoch.
        messages = [(self.subject_for_type(type(e)), encode(e), {**(extra or {}), **fence, "Nats-Msg-Id": e.id})
                    for e, extra in zip(events, extras, strict=True)]
        try:
            await self._publisher.publish(messages)
        except BadRequestError as err:
            if err.err_code == WRONG_LAST_SEQUENCE:
                self.fence.epoch = None
                raise Deposed(f"{self.fence.service}: the server refused a write of epoch "
                              f"{fence['Nats-Expected-Last-Subject-Sequence']}: another replica leads now") from err
            raise

    async def close_fence(self) -> None:
        """Stop listening for acknowledgements (the connection itself belongs to the wrapped bus)."""
        await self._publisher.close()
        await self.fence.close()
