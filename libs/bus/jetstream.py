"""The JetStream adapter: one append-only stream for every command and event, a dead-letter stream,
idempotent setup, de-duplicated publishing and in-order batched pull consumers.

Needs nats-server >= 2.10 (consumers with several filter subjects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NoStreamResponseError, NotFoundError, ServiceUnavailableError

from contracts.codec import encode
from contracts.events import SUBJECT_PREFIX, EventBase, subject_for_type
from libs.bus import streaming
from libs.bus.consumer import REST_WAIT_S, Consumer
from libs.bus.failover import FAILOVER_WAIT_S

log = logging.getLogger(__name__)

DEFAULT_STREAM = "GPUSCHED"
# Bytes kept free for a dead letter's headers (reason up to 1,000 characters, subject, service, sequence).
DEAD_LETTER_HEADER_ROOM = 4096
# Long enough to cover a service restart that re-derives decisions it published before it crashed.
DUPLICATE_WINDOW_S = 600.0
# How long a request to JetStream (a publish's acknowledgement included) may take.
ACK_TIMEOUT_S = 10.0
# How long a publish or a stream lookup waits for the stream to have a leader again: a NATS cluster elects
# another within seconds of losing one (docs/scaling.md). Well inside the duplicate window, so a publish
# sent again is still recognised.
# The first pause before a publish is sent again; it doubles up to 1 s.
FIRST_RETRY_S = 0.1
# Each stream lookup's own wait, so that one made while no server leads the stream is asked again soon.
LOOKUP_TIMEOUT_S = 2.0


DEFAULT_INBOX = "_INBOX"


def inbox_prefix(user: str) -> str:
    """Where a user's replies arrive: `_INBOX.<user>`, so that its NATS permissions can let it subscribe to
    its own replies only (libs/bus/permissions.py renders the same rule), not to every client's."""
    return f"{DEFAULT_INBOX}.{user}" if user else DEFAULT_INBOX


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """Who a process is on the bus: a user and password (the server's config grants each user its own
    subjects) or a credentials file (user JWT and nkey seed). The password never appears in a repr."""

    user: str = ""
    password: str = field(default="", repr=False)
    creds_file: str = ""

    def __post_init__(self) -> None:
        if self.creds_file and self.user:
            raise ValueError("NATS credentials: give a user and password or a creds file, not both")
        if not self.creds_file and not self.user:
            raise ValueError("NATS credentials: a user (with its password) or a creds file")

    def connect_options(self) -> dict[str, Any]:
        if self.creds_file:
            return {"user_credentials": self.creds_file}
        return {"user": self.user, "password": self.password, "inbox_prefix": inbox_prefix(self.user)}


REPLICAS_ENV = "GPUSCHED_STREAM_REPLICAS"
# JetStream keeps at most 5 copies of a stream; 3 survive the loss of any one server.
MAX_REPLICAS = 5


def stream_replicas_from_env(env: Mapping[str, str] | None = None) -> int:
    """How many servers keep a copy of the log's streams: GPUSCHED_STREAM_REPLICAS (1 to 5, default 1).
    Only a NATS cluster can hold more than one; 3 is the usual choice (docs/scaling.md)."""
    raw = (os.environ if env is None else env).get(REPLICAS_ENV, "").strip()
    if not raw:
        return 1
    replicas = int(raw)
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"{REPLICAS_ENV} must be between 1 and {MAX_REPLICAS}, not {replicas}")
    return replicas


def server_urls(url: str) -> list[str]:
    """A NATS_URL as the client's server list: one URL, or several separated by commas (the servers of a
    cluster; the client picks one and moves to another when it goes away)."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError("NATS_URL names no server")
    return urls


@dataclass(frozen=True, slots=True)
class BusConfig:
    # One server, or a cluster's servers separated by commas.
    url: str = "nats://127.0.0.1:4222"
    stream: str = DEFAULT_STREAM
    # Subjects are <prefix>.c.<Command>, <prefix>.e.<Event>, <prefix>.dlq.<service>. A second platform
    # (or a test) on the same server uses another stream and prefix.
    subject_prefix: str = SUBJECT_PREFIX
    # Copies of the streams when they are created. Read from the environment when not given, so every
    # process that may be the first to connect (a service, `gpusched nats-setup`, an audit) creates them alike.
    replicas: int = field(default_factory=stream_replicas_from_env)
    # None: connect without credentials (a server without authorization, e.g. `gpusched up`'s own).
    auth: NatsAuth | None = None

    @property
    def dlq_stream(self) -> str:
        return f"{self.stream}_DLQ"

    @property
    def servers(self) -> list[str]:
        return server_urls(self.url)


async def _probe_any(servers: Sequence[str], source: str, timeout_s: float) -> None:
    """A plain TCP connect to each server until one accepts: a refused or silent address is named at once."""
    failures = []
    for url in servers:
        parsed = urllib.parse.urlparse(url if "://" in url else f"nats://{url}")
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), min(timeout_s, 2.0))
        except (OSError, TimeoutError) as err:
            said = err.strerror if isinstance(err, OSError) and err.strerror else "no answer"
            failures.append(f"{host}:{port}: {said}")
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise ConnectionError(f"cannot reach NATS at {', '.join(servers)} (from {source}): {'; '.join(failures)}")


class Bus:
    """A connection plus the stream conventions every service shares."""

    def __init__(self, nc: NatsClient, config: BusConfig) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=ACK_TIMEOUT_S)
        self.config = config

    @classmethod
    async def connect(cls, config: BusConfig, name: str = "gpusched") -> Bus:
        auth = config.auth.connect_options() if config.auth is not None else {}
        # Reconnect for ever, to whichever server of the list (and those the cluster announces) answers. Pings
        # every 5 s find a server that vanished without closing the connection (a host lost) in about 15 s;
        # one that exits closes it, and the client moves at once.
        nc = await nats.connect(
            config.servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=5, allow_reconnect=True, ping_interval=5, max_outstanding_pings=3,
            error_cb=_log_nats_error, **auth,
        )
        bus = cls(nc, config)
        await bus.ensure_streams()
        return bus

    @classmethod
    async def connect_once(cls, config: BusConfig, source: str, name: str = "gpusched-cli",
                           timeout_s: float = 5.0) -> Bus:
        """For a command that runs once (the CLI): no reconnecting, no streams created, and a server that does
        not answer within `timeout_s` is an error naming the address and where it came from (`source`). The
        client's own first connect retries a refused address for ever, hence the limit around it."""
        auth = config.auth.connect_options() if config.auth is not None else {}

        async def _quiet(_err: Exception) -> None:
            return None

        await _probe_any(config.servers, source, timeout_s)
        try:
            nc = await asyncio.wait_for(nats.connect(
                config.servers, name=name, max_reconnect_attempts=0, allow_reconnect=False,
                connect_timeout=min(timeout_s, 2.0), error_cb=_quiet, **auth), timeout_s)
        except (TimeoutError, OSError, nats.errors.Error) as err:
            reason = "no answer" if isinstance(err, TimeoutError) else (str(err) or type(err).__name__)
            raise ConnectionError(f"cannot reach NATS at {config.url} (from {source}) within {timeout_s:g}s: "
                                  f"{reason}") from None
        bus = cls(nc, config)
        try:
            await asyncio.wait_for(bus.js.stream_info(config.stream), timeout_s)
        except NotFoundError:
            await bus.close()
            raise ConnectionError(f"NATS at {config.url} (from {source}) has no stream {config.stream!r}: "
                                  "is the platform running there? (GPUSCHED_STREAM names another)") from None
        except TimeoutError:
            await bus.close()
            raise ConnectionError(f"NATS at {config.url} (from {source}) did not answer for stream "
                                  f"{config.stream!r} within {timeout_s:g}s (JetStream off?)") from None
        return bus

    async def close(self) -> None:
        # close, not drain: everything handled is already acknowledged, and draining waits for the
        # server to expire outstanding pull requests.
        if not self.nc.is_closed:
            await self.nc.close()

    async def ensure_streams(self) -> None:
        """Create the streams if missing; an existing stream is left as it is (idempotent)."""
        main = StreamConfig(
            name=self.config.stream, subjects=self.log_subjects(),
            retention=RetentionPolicy.LIMITS, storage=StorageType.FILE, discard=DiscardPolicy.OLD,
            duplicate_window=DUPLICATE_WINDOW_S, deny_delete=True, deny_purge=True,
            num_replicas=self.config.replicas, max_msg_size=1 << 20,
        )
        dlq = StreamConfig(
            name=self.config.dlq_stream, subjects=[f"{self.config.subject_prefix}.dlq.>"],
            retention=RetentionPolicy.LIMITS, storage=StorageType.FILE, num_replicas=self.config.replicas,
            max_age=30 * 86400.0,
        )
        for cfg in (main, dlq):
            await self._ensure_stream(cfg)

    async def _ensure_stream(self, cfg: StreamConfig) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILOVER_WAIT_S
        while True:
            try:
                await self._create_or_check(cfg)
                return
            except (TimeoutError, ServiceUnavailableError) as err:
                # A cluster electing the stream's (or its own) leader answers nothing for a few seconds.
                if loop.time() > deadline:
                    raise
                log.warning("stream %s not answering (%s); asking again", cfg.name, err)
                await asyncio.sleep(0.2)

    async def _create_or_check(self, cfg: StreamConfig) -> None:
        try:
            info = await asyncio.wait_for(self.js.stream_info(cfg.name or ""), LOOKUP_TIMEOUT_S)
        except NotFoundError:
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError as err:
                # Another process created it between our check and our add.
                if "already in use" not in str(err):
                    raise
            return
        # Never changed here: a process started without the setting would scale the log down.
        have = info.config.num_replicas or 1
        if have < self.config.replicas:
            log.warning("stream %s keeps %d copies, %s asks for %d; it is left as it is (scale it with "
                        "`nats stream edit %s --replicas %d`)", cfg.name, have, REPLICAS_ENV,
                        self.config.replicas, cfg.name, self.config.replicas)

    # --- subjects ------------------------------------------------------------------------------------

    def log_subjects(self) -> list[str]:
        return [f"{self.config.subject_prefix}.c.>", f"{self.config.subject_prefix}.e.>"]

    def subject_for_type(self, event_type: type[EventBase]) -> str:
        logical = subject_for_type(event_type)
        return self.config.subject_prefix + logical[len(SUBJECT_PREFIX):]

    # --- publishing --------------------------------------------------------------------------------

    async def publish(self, events: Sequence[EventBase],
                      headers: Sequence[Mapping[str, str] | None] | None = None) -> None:
        """Publish in order, pipelined, and wait until the server stored every one.

        The event id is the Nats-Msg-Id: a decision re-derived after a crash is dropped by the server.
        `headers`, parallel to `events`, adds headers to each (a trace context); None (tracing off) costs
        nothing per event.
        """
        if not events:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FAILOVER_WAIT_S
        delay = FIRST_RETRY_S
        while True:
            try:
                await self._publish_once(events, headers)
                return
            except (NoStreamResponseError, TimeoutError) as err:
                # No server leads the stream right now (an election after one was lost), or the answer went
                # with the connection: everything is sent again, in order, and what was stored is dropped as a
                # duplicate. Past the deadline the error is raised and the crash-only restart takes over.
                if loop.time() + delay > deadline:
                    raise
                log.log(logging.WARNING if delay == FIRST_RETRY_S else logging.DEBUG,
                        "stream %s not answering (%s); publishing %d again for up to %.0fs", self.config.stream,
                        err, len(events), FAILOVER_WAIT_S)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _publish_once(self, events: Sequence[EventBase],
                            headers: Sequence[Mapping[str, str] | None] | None) -> None:
        if headers is not None:
            await self._publish_with(events, headers)
            return
        if len(events) == 1:
            e = events[0]
            await self.js.publish(self.subject_for_type(type(e)), encode(e), headers={"Nats-Msg-Id": e.id})
            return
        futures = [
            await self.js.publish_async(self.subject_for_type(type(e)), encode(e), headers={"Nats-Msg-Id": e.id})
            for e in events
        ]
        await _all_stored(futures)

    async def _publish_with(self, events: Sequence[EventBase], headers: Sequence[Mapping[str, str] | None]) -> None:
        futures = [
            await self.js.publish_async(self.subject_for_type(type(e)), encode(e), headers=_with_msg_id(e, extra))
            for e, extra in zip(events, headers, strict=True)
        ]
        await _all_stored(futures)

    async def publish_until_stored(self, events: Sequence[EventBase],
                                   headers: Sequence[dict[str, str] | None] | None = None) -> None:
        """Publish, retrying with backoff while the server is away (restarting, reconnecting). For reports of
        the outside world (executors, agents) that no trigger would re-derive: dropped, they would leave a job
        running for ever. Their ids are derived, so one sent twice is stored once."""
        delay = 0.2
        while True:
            try:
                await self.publish(events, headers)
                return
            except Exception as err:
                log.warning("could not publish %s yet (%s); retrying in %.1fs",
                            [type(e).__name__ for e in events], err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def dead_letter(self, service: str, msg: Msg, reason: str) -> None:
        headers = {
            "Gpusched-Reason": reason[:1000],
            "Gpusched-Subject": msg.subject,
            "Gpusched-Service": service,
        }
        with contextlib.suppress(Exception):  # a message without JetStream metadata is dead-lettered too
            headers["Gpusched-Seq"] = str(msg.metadata.sequence.stream)
        data = msg.data
        # The reason headers come on top of the message: one near the size limit would no longer fit, the server
        # would refuse it, and the service would fail on the same message after every restart. The log keeps
        # the whole message at Gpusched-Seq; the dead letter keeps its head.
        room = self.nc.max_payload - DEAD_LETTER_HEADER_ROOM
        if len(data) > room:
            headers["Gpusched-Truncated-From"] = str(len(data))
            data = data[:max(room, 0)]
        await self.js.publish(f"{self.config.subject_prefix}.dlq.{service}", data, headers=headers)

    # --- consuming ---------------------------------------------------------------------------------

    async def ack_floor(self, durable: str) -> int:
        """The last stream sequence the durable consumer acknowledged; 0 when it does not exist yet."""
        try:
            info = await self.js.consumer_info(self.config.stream, durable)
        except NotFoundError:
            return 0
        return int(info.ack_floor.stream_seq) if info.ack_floor else 0

    async def durable(self, durable: str, subjects: Iterable[str], start_seq: int = 1,
                      max_ack_pending: int = 20_000, rest_wait_s: float | None = None) -> Consumer:
        """(Re)create the durable consumer so that it delivers from `start_seq`, in order. `rest_wait_s`: how
        long each fetch waits for more once it has a first message (default REST_WAIT_S).

        Re-creating (rather than resuming) matters: messages delivered to a crashed process would
        otherwise come back only after the ack wait, behind newer ones, and AckAll would cover them.
        """
        cfg = ConsumerConfig(
            durable_name=durable, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
            ack_policy=AckPolicy.ALL, filter_subjects=sorted(set(subjects)), ack_wait=60.0,
            max_ack_pending=max_ack_pending, max_waiting=16,
        )
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.config.stream, durable)
        sub = await self.js.pull_subscribe(subject="", durable=durable, stream=self.config.stream, config=cfg)
        wait = REST_WAIT_S if rest_wait_s is None else rest_wait_s
        if streaming.streams(sub):  # (through the module: a test swaps it for a nats-py without them)
            return streaming.StreamingConsumer(self.config.stream, self.nc, sub, durable, wait)
        log.warning("this nats-py's pull subscription is not the one the streaming consumer knows: %s fetches "
                    "batch by batch", durable)
        return Consumer(self.config.stream, self.nc, sub, durable, wait)

    async def reader(self, subjects: Iterable[str], start_seq: int = 1) -> Consumer:
        """An ephemeral in-order reader of the log (replay, catch-up, audit); nothing is acknowledged."""
        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
            ack_policy=AckPolicy.NONE, filter_subjects=sorted(set(subjects)), inactive_threshold=30.0,
            mem_storage=True,
        )
        sub = await self.js.pull_subscribe(subject="", stream=self.config.stream, config=cfg)
        return Consumer(self.config.stream, self.nc, sub, durable=None)

    async def last_seq(self) -> int:
        info = await self.js.stream_info(self.config.stream)
        return int(info.state.last_seq)


async def _log_nats_error(err: Exception) -> None:
    # The server refuses a subject this user may not use with an asynchronous -ERR, and the request that
    # used it then only times out: the log line naming the subject is the operator's only clue.
    if "permissions violation" in str(err).lower():
        log.error("NATS refused it: %s; not in this user's permissions (infra/nats/README.md)", err)
    else:
        log.error("NATS: %s", err)


async def _all_stored(futures: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for every acknowledgement, up to ACK_TIMEOUT_S, then raise the first error. A pipelined publish has
    no timeout of its own: one whose server died before it answered would be waited for for ever."""
    _, late = await asyncio.wait(futures, timeout=ACK_TIMEOUT_S)
    for future in late:
        future.cancel()
    for future in futures:
        if future.cancelled():
            raise nats.errors.TimeoutError
        err = future.exception()
        if err is not None:
            raise err


def _with_msg_id(event: EventBase, extra: Mapping[str, str] | None) -> dict[str, str]:
    # The id comes last: extra headers can never override the de-duplication key.
    return {"Nats-Msg-Id": event.id} if not extra else {**extra, "Nats-Msg-Id": event.id}
