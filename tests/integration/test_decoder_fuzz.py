"""Fuzzing the event decoder on a real JetStream server: whatever lands on a subject a service consumes --
malformed JSON, random bytes, JSON of an unknown type or with wrong fields, a valid event on another type's
subject, a message as large as the log accepts -- goes to the dead-letter stream with its reason and its
original bytes, and the consumer keeps going: a valid event published after the poison is still decided.

Hypothesis draws the poison (a list of it per example, on subjects admission consumes); each example gets
a stream of its own, so examples cannot see each other's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import typing
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js.api import AckPolicy, ConsumerConfig

from contracts import (
    CancelJob,
    CordonNode,
    EventBase,
    GpuSpec,
    JobSpec,
    NodeRegistered,
    NodeSpec,
    QueuePolicyChanged,
    QueueSpec,
    SubmitJob,
)
from contracts.codec import encode
from contracts.events import Event
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.handler import DeciderHandler
from libs.runtime.reactor import Reactor

MAX_MSG_SIZE = 1 << 20  # the log stream's max_msg_size (libs/bus/jetstream.py)
# What a dead letter adds to the payload (reason, subject, service and sequence headers, at most ~1.2 KiB):
# a message larger than the server's max_payload less this is dead-lettered with its head only.
DEAD_LETTER_ROOM = 2048
KNOWN_TYPES = frozenset(t.__name__ for t in typing.get_args(Event))
SETUP: list[EventBase] = [
    QueuePolicyChanged(id="q1", ts=1.0, source="operator", queue=QueueSpec(name="q", team="t", nominal_gpus=8),
                       version=1),
    NodeRegistered(id="n1", ts=1.0, source="node-telemetry",
                   node=NodeSpec(name="n1", gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))),
]
VALID: list[EventBase] = [
    *SETUP,
    SubmitJob(id="s0", ts=2.0, source="api", job_id="job-0", spec=JobSpec(team="t", queue="q", gpus=1)),
    CancelJob(id="c0", ts=2.0, source="api", job_id="job-0"),
    CordonNode(id="k0", ts=2.0, source="operator", node="n1"),
]
ADMISSION_INPUTS = tuple(AdmissionDecider().input_types())


@dataclass(frozen=True)
class Poison:
    kind: str
    on: type[EventBase]  # the type whose subject it is published on
    payload: bytes
    reasons: frozenset[str]  # the dead-letter reason codes it may carry


def _truncated(data: st.DataObject) -> bytes:
    raw = encode(data.draw(st.sampled_from(VALID)))
    return raw[: data.draw(st.integers(1, len(raw) - 1))]


def _unknown_type(data: st.DataObject) -> bytes:
    tag = data.draw(st.one_of(st.text(max_size=30).filter(lambda t: t not in KNOWN_TYPES), st.integers(),
                              st.none(), st.lists(st.integers(), max_size=3)))
    extra = data.draw(st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=20), max_size=4))
    return json.dumps({**extra, "type": tag, "id": "x", "ts": 1.0, "source": "fuzz"}).encode()


def _bad_fields(data: st.DataObject) -> bytes:
    """A known type whose fields are missing or of the wrong type."""
    body = json.loads(encode(data.draw(st.sampled_from(VALID))))
    key = data.draw(st.sampled_from(sorted(k for k in body if k != "type")))
    if data.draw(st.booleans()):
        del body[key]
    else:
        body[key] = data.draw(st.sampled_from([[], {}, "not-a-number", -1.5, True])
                              .filter(lambda v: type(v) is not type(body[key])))
    return json.dumps(body).encode()


def _oversized(data: st.DataObject) -> bytes:
    size = data.draw(st.integers(64 << 10, MAX_MSG_SIZE - DEAD_LETTER_ROOM))
    head = b'{"type":"SubmitJob","id":"big","ts":1,"source":"fuzz","pad":"'
    return (head + b"x" * size)[:size]  # an unterminated string: malformed


@st.composite
def poisons(draw: st.DrawFn) -> Poison:
    data = draw(st.data())
    on = draw(st.sampled_from(ADMISSION_INPUTS))
    kind = draw(st.sampled_from(["truncated", "trailing", "random", "unknown_type", "bad_fields", "mismatch",
                                 "oversized"]))
    if kind == "truncated":
        return Poison(kind, on, _truncated(data), frozenset({"malformed"}))
    if kind == "trailing":
        return Poison(kind, on, encode(draw(st.sampled_from(VALID))) + draw(st.sampled_from([b"}", b",", b"x"])),
                      frozenset({"malformed"}))
    if kind == "random":
        return Poison(kind, on, draw(st.binary(max_size=2000)), frozenset({"malformed", "invalid"}))
    if kind == "unknown_type":
        return Poison(kind, on, _unknown_type(data), frozenset({"invalid"}))
    if kind == "bad_fields":
        return Poison(kind, on, _bad_fields(data), frozenset({"invalid"}))
    if kind == "mismatch":
        event = draw(st.sampled_from([e for e in VALID if type(e) is not on]))
        return Poison(kind, on, encode(event), frozenset({"type_mismatch"}))
    return Poison(kind, on, _oversized(data), frozenset({"malformed"}))


@contextlib.asynccontextmanager
async def fresh_bus(url: str) -> AsyncIterator[Bus]:
    """A bus on a stream (and dead-letter stream) of its own, deleted afterwards."""
    name = f"F{uuid.uuid4().hex[:12].upper()}"
    bus = await Bus.connect(BusConfig(url=url, stream=name, subject_prefix=name.lower()))
    try:
        yield bus
    finally:
        for stream in (bus.config.stream, bus.config.dlq_stream):
            with contextlib.suppress(Exception):
                await bus.js.delete_stream(stream)
        await bus.close()


async def decide_through(reactor: Reactor, seq: int, timeout: float = 20.0) -> None:
    """Step the reactor until it has handled stream sequence `seq`."""
    deadline = time.monotonic() + timeout
    while reactor.last_seq < seq:
        left = deadline - time.monotonic()
        assert left > 0, f"the consumer stopped at {reactor.last_seq}, before {seq}"
        await asyncio.wait_for(reactor.step(), left)


async def dead_letters(bus: Bus, expected: int) -> list[Msg]:
    sub = await bus.js.pull_subscribe("", stream=bus.config.dlq_stream,
                                      config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    out: list[Msg] = []
    with contextlib.suppress(asyncio.TimeoutError):  # nats' TimeoutError is one
        while len(out) < expected:
            out += await sub.fetch(expected - len(out), timeout=2.0)
    with contextlib.suppress(asyncio.TimeoutError):
        out += await sub.fetch(1, timeout=0.2)  # and nothing more
    return out


async def poison_then_valid(url: str, poison: list[Poison]) -> tuple[list[int], list[Msg], Reactor]:
    """Publish the setup, the poison and one valid submission; run admission over it all."""
    async with fresh_bus(url) as bus:
        await bus.publish(SETUP)
        seqs = [(await bus.js.publish(bus.subject_for_type(p.on), p.payload)).seq for p in poison]
        valid = await bus.js.publish(bus.subject_for_type(SubmitJob), encode(
            SubmitJob(id="s1", ts=3.0, source="api", job_id="job-1", spec=JobSpec(team="t", queue="q", gpus=1))))
        reactor = Reactor(bus, DeciderHandler(AdmissionDecider()), fetch_timeout=0.2)
        await reactor.start()
        await decide_through(reactor, valid.seq)
        return seqs, await dead_letters(bus, len(poison)), reactor


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(poison=st.lists(poisons(), min_size=1, max_size=6))
async def test_poison_goes_to_the_dead_letter_stream_and_the_consumer_keeps_going(
        nats_server: EmbeddedServer, poison: list[Poison]) -> None:
    seqs, dead, reactor = await poison_then_valid(nats_server.url, poison)

    assert len(dead) == len(poison), [p.kind for p in poison]
    for p, seq, msg in zip(poison, seqs, dead, strict=True):
        headers = msg.headers or {}
        assert headers["Gpusched-Reason"].split(":")[0] in p.reasons, (p.kind, headers["Gpusched-Reason"])
        assert (headers["Gpusched-Seq"], headers["Gpusched-Service"]) == (str(seq), "admission")
        assert headers["Gpusched-Subject"].endswith(f".{p.on.__name__}")
        # The original bytes are kept for whoever investigates: whole, or their head when the reason headers
        # would not fit beside them (the log keeps them whole at Gpusched-Seq).
        if "Gpusched-Truncated-From" in headers:
            assert headers["Gpusched-Truncated-From"] == str(len(p.payload)) and p.payload.startswith(msg.data)
        else:
            assert msg.data == p.payload
    decider = typing.cast(AdmissionDecider, typing.cast(DeciderHandler, reactor.handler).decider)
    assert decider.state.jobs.get("job-1") == "admitted"  # the valid event after the poison was decided


async def test_a_message_larger_than_the_log_accepts_never_reaches_a_consumer(nats_server: EmbeddedServer) -> None:
    async with fresh_bus(nats_server.url) as bus:
        with pytest.raises(MaxPayloadError):
            await bus.js.publish(bus.subject_for_type(SubmitJob), b"{" * (MAX_MSG_SIZE + 1))
        assert await bus.last_seq() == 0


async def test_a_poison_message_of_the_largest_size_the_log_accepts_is_dead_lettered_too(
        nats_server: EmbeddedServer) -> None:
    """Its dead letter keeps the head of it (the log keeps it whole at Gpusched-Seq) so that the reason headers
    still fit the server's payload limit, and the consumer goes on."""
    payload = b"{" + b"x" * (MAX_MSG_SIZE - 1)
    _, dead, _ = await asyncio.wait_for(poison_then_valid(nats_server.url, [
        Poison("oversized", SubmitJob, payload, frozenset({"malformed"}))]), 30)
    assert len(dead) == 1 and dead[0].headers is not None
    assert dead[0].headers["Gpusched-Truncated-From"] == str(len(payload))
    assert payload.startswith(dead[0].data) and len(dead[0].data) >= MAX_MSG_SIZE - 8192
