"""The streaming pull consumer on a real JetStream server: in order past many top-ups, through expired pull
requests, and after the server drops its requests (the consumer deleted under it)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from contracts import ClockTick
from libs.bus import streaming
from libs.bus.jetstream import Bus, stream_seq
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
    c = await consumer(bus, rest_wait_s=0.3)
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
