"""The one reactor shell every service runs: fetch a batch -> decode -> fold -> react -> publish
decisions -> acknowledge.

- Batches: one fetch of up to `batch_size` events, all decisions published pipelined, one AckAll.
- Idempotence: the shell remembers the last stream sequence it handled and skips redeliveries; decisions
  re-derived after a crash carry the same ids, which the server de-duplicates.
- Restart: restore the latest usable snapshot (libs/runtime/snapshots.py), replay the log from there up to
  the durable consumer's ack floor (no publishing), then go live. Every so many events, a snapshot of the
  state is taken after a batch is acknowledged.
- Poison: a message that does not decode, or whose type does not match its subject, or that makes the
  handler raise, goes to the dead-letter stream with its reason; the consumer keeps going.
- Traces (when a tracing is given): each event about a job is handled under a span that continues the
  trace its message's headers carry, and each decision about a job goes out with its job's `traceparent`
  (libs/telemetry/tracing.py). Catch-up is never traced (it re-derives what was traced the first time);
  it only recalls each job's last context, so that decisions after a restart continue the job's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError

from contracts.codec import decode
from contracts.events import EventBase
from libs.audit.verify import make_checkpoint
from libs.bus.consumer import REST_WAIT_S, Consumer, stream_seq
from libs.bus.jetstream import Bus
from libs.core.kernel.decider import Chain, derived_id
from libs.runtime.handler import Handler
from libs.runtime.snapshots import Snapshotter
from libs.telemetry import metrics
from libs.telemetry.tracing import Headers, ServiceTracing

log = logging.getLogger(__name__)
# Within a batch, decisions are published at least this often (seconds of handling).
FLUSH_EVERY_S = 0.01


class Reactor:
    def __init__(self, bus: Bus, handler: Handler, durable: str | None = None, batch_size: int = 500,
                 fetch_timeout: float = 0.5, audit_key: bytes | None = None, audit_every: int = 500,
                 tracing: ServiceTracing | None = None, snapshots: Snapshotter | None = None,
                 batch_wait_s: float = REST_WAIT_S) -> None:
        self.bus = bus
        # None: no snapshots; a restart replays the whole log.
        self.snapshots = snapshots
        self._restored = False
        self.handler = handler
        # None: tracing is off, and handling costs one None check per event.
        self.tracing = tracing
        self.durable = durable or handler.name
        self.batch_size = batch_size
        self.fetch_timeout = fetch_timeout
        # Once a batch has a first message, how long it waits for more (until it is full); 0: what has arrived.
        self.batch_wait_s = batch_wait_s
        self.subject_types = {bus.subject_for_type(t): t for t in handler.input_types()}
        self.last_seq = 0
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self.audit_key = audit_key
        self.audit_every = audit_every
        self._attested = 0
        self._consumer: Consumer | None = None
        # Consumer delivery sequence of the last message seen: a jump means a delivery went missing.
        self._delivered = 0

    async def start(self) -> None:
        """Catch up with what was handled before a restart, then consume in order from there."""
        floor = await self.bus.ack_floor(self.durable)
        started = time.perf_counter()
        await self.restore(floor)
        if floor > self.last_seq:
            await self._catch_up(floor)
        await self._bind()
        metrics.CATCH_UP_SECONDS.labels(self.handler.name).set(time.perf_counter() - started)
        await self.handler.after_catch_up()
        chain: Chain | None = getattr(self.handler, "chain", None)
        if chain is not None:  # what was attested before the restart need not be attested again
            self._attested = chain.length - chain.length % self.audit_every
        self.ready.set()
        log.info("%s ready at sequence %d (replayed in %.2fs)", self.handler.name, self.last_seq,
                 time.perf_counter() - started)

    async def restore(self, floor: int) -> None:
        """Before anything was handled: start from the latest usable snapshot at or below `floor`, if any (once:
        a standby restores before it follows the log, and its takeover starts from where it got to)."""
        if self.snapshots is not None and not self._restored and self.last_seq == 0 and floor > 0:
            self._restored = True
            self.last_seq = await self.snapshots.load(floor)

    async def _catch_up(self, floor: int) -> None:
        reader = await self.bus.reader(self.subject_types, start_seq=self.last_seq + 1)
        try:
            while self.last_seq < floor:
                msgs = await reader.fetch(1000, timeout=2.0)
                # Past the floor, or nothing more for this service (the events up to the floor are in the log
                # already, so none can come after the last one): done, without waiting for a fetch to expire.
                if not msgs or self.replay(msgs, floor) or not msgs[-1].metadata.num_pending:
                    break
        finally:
            self.last_seq = max(self.last_seq, floor)
            await reader.close()

    def replay(self, msgs: list[Msg], upto: int) -> list[Msg]:
        """Fold events decided before (by this process before a restart, or by the leader this replica
        stands by for) up to sequence `upto`, publishing nothing; returns the messages beyond `upto`."""
        for i, msg in enumerate(msgs):
            seq = stream_seq(msg)
            if seq > upto:
                return msgs[i:]
            if seq <= self.last_seq:
                continue
            event = self._decode(msg)
            if event is not None:
                try:
                    self.handler.replay(seq, event)
                except Exception:  # it was dead-lettered the first time round too
                    log.exception("replay of %d failed", seq)
                if self.tracing is not None:
                    self.tracing.recall(msg.headers, event)
            self.last_seq = seq
        return []

    async def _bind(self) -> None:
        if self._consumer is not None:
            await self._consumer.close()
        self._consumer = await self.bus.durable(self.durable, self.subject_types, start_seq=self.last_seq + 1,
                                                rest_wait_s=self.batch_wait_s)
        self._delivered = 0

    def _decode(self, msg: Msg) -> EventBase | None:
        return self._decode_or_reason(msg)[0]

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self._consumer is None:
            await self.start()
        while not self._stop.is_set():
            await self.step()

    async def step(self) -> int:
        """Fetch one batch and handle it; returns how many messages came."""
        assert self._consumer is not None, "start() first"
        msgs = await self._consumer.fetch(self.batch_size, timeout=self.fetch_timeout)
        if not msgs:
            return 0
        first, last = int(msgs[0].metadata.sequence.consumer), int(msgs[-1].metadata.sequence.consumer)
        # Deliveries are numbered one by one: a batch starts right after the last one seen and has no hole (a
        # batch may hold what more than one pull request delivered, so it is checked whole, not only at its start).
        if first != self._delivered + 1 or last - first != len(msgs) - 1:
            # A delivery was lost (e.g. to a fetch that timed out): never skip ahead of it, because
            # AckAll would acknowledge it unseen. Start again right after the last handled event.
            log.warning("%s: delivery gap after %d; re-reading from %d", self.handler.name, self._delivered,
                        self.last_seq + 1)
            await self._bind()
            return 0
        self._delivered = last
        await self.process(msgs)
        return len(msgs)

    async def process(self, msgs: list[Msg]) -> None:
        started = time.perf_counter()
        name = self.handler.name
        decisions: list[EventBase] = []
        # Parallel to `decisions` when tracing: each one's trace headers.
        headers: list[Headers | None] | None = None if self.tracing is None else []
        handled = 0
        kinds: dict[type[EventBase], int] = {}  # events handled per type, counted once per batch
        flushed = started
        for msg in msgs:
            if decisions and time.perf_counter() - flushed > FLUSH_EVERY_S:
                # A long batch publishes as it goes, so its first events' decisions move on at once.
                await self.bus.publish(decisions, headers)
                self._count(decisions)
                decisions = []
                headers = None if headers is None else []
                flushed = time.perf_counter()
            seq = stream_seq(msg)
            if seq <= self.last_seq:
                continue  # redelivered after a lost ack: already decided
            event, reason = self._decode_or_reason(msg)
            if event is None:
                await self._dead_letter(msg, reason)
            else:
                try:
                    if headers is None:
                        decisions.extend(self.handler.on_event(seq, event))
                    else:
                        made, made_headers = self._traced(msg, seq, event)
                        decisions.extend(made)
                        headers.extend(made_headers)
                    kind = type(event)
                    kinds[kind] = kinds.get(kind, 0) + 1
                    handled += 1
                except Exception as err:
                    log.exception("%s failed on %s at %d", name, type(event).__name__, seq)
                    await self._dead_letter(msg, f"handler_error: {type(err).__name__}: {err}")
            self.last_seq = seq
        await self.bus.publish(decisions, headers)
        self._count(decisions)
        for kind, n in kinds.items():
            metrics.EVENTS.labels(name, kind.__name__).inc(n)
        await self._attest()
        await self.handler.after_batch()
        snapshot = self.snapshots is not None and self.snapshots.due(self.last_seq, len(msgs))
        with contextlib.suppress(MsgAlreadyAckdError):
            if snapshot:
                # A snapshot may reflect only what the server knows acknowledged: wait for this ack.
                snapshot = await self._ack_sync(msgs[-1])
            else:
                await msgs[-1].ack()  # AckAll: acknowledges the whole batch
        if snapshot and self.snapshots is not None:
            self.snapshots.take(self.last_seq)
        metrics.LAST_SEQ.labels(name).set(self.last_seq)
        # What the server still holds for this consumer after the batch: the service's lag behind the log.
        metrics.LAG.labels(name).set(getattr(msgs[-1].metadata, "num_pending", 0) or 0)
        metrics.BATCH_SIZE.labels(name).observe(handled)
        metrics.BATCH_SECONDS.labels(name).observe(time.perf_counter() - started)

    async def _ack_sync(self, msg: Msg) -> bool:
        try:
            await msg.ack_sync(timeout=5.0)
        except (TimeoutError, nats.errors.Error) as err:  # handled all the same; only the snapshot waits
            log.warning("%s: acknowledgement not confirmed (%s); no snapshot this time", self.handler.name, err)
            return False
        return True

    def _traced(self, msg: Msg, seq: int, event: EventBase) -> tuple[list[EventBase], list[Headers | None]]:
        """The handler's decisions on `event` under its trace span, with each decision's trace headers."""
        assert self.tracing is not None
        return self.tracing.on_event(msg.headers, seq, event, lambda: self.handler.on_event(seq, event))

    async def _attest(self) -> None:
        """Every `audit_every` decisions, a keyed checkpoint of the service's chain (when a key is set)."""
        chain: Chain | None = getattr(self.handler, "chain", None)
        if self.audit_key is None or chain is None or chain.length - self._attested < self.audit_every:
            return
        # The chain's own name: a handler may run a decider whose decisions carry another source.
        name = getattr(self.handler, "chain_source", self.handler.name)
        checkpoint = make_checkpoint(name, chain.head, chain.length, self.audit_key, time.time(),
                                     derived_id(name, "checkpoint", chain.length))
        await self.bus.publish([checkpoint])
        self._attested = chain.length

    def _count(self, decisions: list[EventBase]) -> None:
        kinds: dict[type[EventBase], int] = {}
        for d in decisions:
            kind = type(d)
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind, n in kinds.items():
            metrics.DECISIONS.labels(self.handler.name, kind.__name__).inc(n)

    def _decode_or_reason(self, msg: Msg) -> tuple[EventBase | None, str]:
        try:
            event = decode(msg.data)
        except msgspec.ValidationError as err:
            return None, f"invalid: {err}"
        except msgspec.DecodeError as err:
            return None, f"malformed: {err}"
        expected = self.subject_types.get(msg.subject)
        if expected is not type(event):
            return None, f"type_mismatch: subject {msg.subject} carries {type(event).__name__}"
        return event, ""

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        code = reason.split(":", 1)[0]
        metrics.DEAD_LETTERS.labels(self.handler.name, code).inc()
        log.warning("%s dead-letters sequence %s: %s", self.handler.name, msg.metadata.sequence.stream, reason)
        await self.bus.dead_letter(self.handler.name, msg, reason)
