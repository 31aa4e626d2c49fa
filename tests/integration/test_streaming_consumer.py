"""The streaming pull consumer on a real JetStream server: in order past many top-ups, through expired pull
requests, and after the server drops its requests (the consumer deleted under it)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from nats.aio.msg import Msg

from contracts import ClockTick
from libs.bus import streaming
from libs.bus.consumer import Consumer, stream_seq
from libs.bus.jetstream import Bus
from libs.bus.streaming import StreamingConsumer

SUBJECTS = ("ClockTick",)


def ticks(start: int, n: int) -> list[ClockTick]:
    return [ClockTick(id=f"t{i}", ts=float(i), source="test") for i in range(start, start + n)]


async def consumer(bus: Bus, rest_wait_s: float = 0.0) -> StreamingConsumer:
    c = await bus.durable("streaming-test", [bus.subject_for_type(ClockTick)], rest_wait_s=rest_wait_s)
    assert isinstance(c, StreamingConsumer)
    return c


async def take(c: StreamingConsumer, n: int, batch: int = 97) -> list[int]:
    seqs: list[int] = []
    for _ in range(200):
        msgs = await c.fetch(batch, timeout=0.5)
        seqs += [stream_seq(m) for m in msgs]
        if msgs:
            await msgs[-1].ack()
        if len(seqs) >= n:
            break
    return seqs


async def test_every_message_once_in_order_across_many_top_ups(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "CREDITS", 40)  # 1,000 messages: dozens of requests
    await bus.publish(ticks(0, 1000))
    c = await consumer(bus)
    seqs = await take(c, 1000)
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == 1000
    assert c.credits <= 40 * 2
    await c.close()


async def test_requests_that_expire_are_renewed(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "EXPIRES_S", 0.3)
    monkeypatch.setattr(streaming, "HEARTBEAT_S", 0.1)
    c = await consumer(bus)
    assert await c.fetch(10, timeout=1.0) == []  # the first request expires while nothing comes
    await asyncio.sleep(0.5)
    await bus.publish(ticks(0, 5))
    assert len(await take(c, 5)) == 5
    await c.close()


async def test_a_batch_waits_its_rest_wait_for_more(bus: Bus) -> None:
    # The rest wait leaves the later publish (0.1 s after the first) time to arrive on a loaded machine too.
    c = await consumer(bus, rest_wait_s=1.0)
    await bus.publish(ticks(0, 1))

    async def later() -> None:
        await asyncio.sleep(0.1)
        await bus.publish(ticks(1, 2))

    task = asyncio.create_task(later())
    msgs = await c.fetch(10, timeout=2.0)
    await task
    assert len(msgs) == 3  # the first, then two more within the rest wait
    await c.close()


async def test_the_consumer_deleted_under_it_is_noticed(bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    c = await consumer(bus)
    await bus.publish(ticks(0, 3))
    assert len(await take(c, 3)) == 3
    await bus.js.delete_consumer(bus.config.stream, "streaming-test")
    # The server ends the open request (409): its credits are written off, not waited for.
    with caplog.at_level(logging.INFO, logger="libs.bus.streaming"):
        assert await c.fetch(10, timeout=1.0) == []
    assert "409" in caplog.text
    assert c.credits == 0
    await c.close()


def status(code: str, **headers: str) -> Msg:
    return Msg(_client=None, subject="inbox", headers={"Status": code, **headers})  # type: ignore[arg-type]


async def test_each_word_from_a_leader_ends_a_wait_for_one(bus: Bus) -> None:
    """An election (503), then quiet heartbeats for longer than the failover limit, then another election:
    the second is a new wait, not the first one gone on too long."""
    c = await consumer(bus)
    c._failover.limit_s = 0.05
    assert await c._take(status("503"), [])  # waits (briefly) for a leader
    await asyncio.sleep(0.1)
    assert not await c._take(status("100"), [])  # a heartbeat: someone leads the consumer again
    assert await c._take(status("503"), [])  # a new election; would raise if the first wait had gone on
    await c.close()


async def test_an_expired_request_is_renewed_at_once_when_credits_run_low(bus: Bus) -> None:
    c = await consumer(bus)
    await c._top_up()
    c.credits = streaming.CREDITS  # one request open
    assert not await c._take(status("408", **{"Nats-Pending-Messages": str(streaming.CREDITS - 10)}), [])
    assert c.credits == 10 + streaming.CREDITS  # what it still owed written off, a new request out
    await c.close()


async def test_a_server_that_keeps_ending_requests_is_asked_ever_more_slowly(bus: Bus) -> None:
    c = await consumer(bus)
    started = time.monotonic()
    for _ in range(4):
        assert await c._take(status("409", Description="Exceeded MaxRequestBatch of 10"), [])
    # 0, then 50, 100 and 200 ms
    assert time.monotonic() - started >= 0.3
    await c.close()


async def test_a_nats_py_without_the_known_internals_fetches_batch_by_batch(bus: Bus,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "streams", lambda sub: False)
    c = await bus.durable("streaming-test", [bus.subject_for_type(ClockTick)], rest_wait_s=0.0)
    assert type(c) is Consumer
    await bus.publish(ticks(0, 3))
    msgs = await c.fetch(10, timeout=1.0)
    assert [stream_seq(m) for m in msgs][:1] == [1]
    await c.close()


async def test_this_nats_py_streams(bus: Bus) -> None:
    c = await consumer(bus)
    assert streaming.streams(c.sub)
    await c.close()
