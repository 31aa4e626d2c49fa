"""Read the whole log from the live stream, in order, with a progress callback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from nats.aio.msg import Msg

from libs.bus.jetstream import Bus, stream_seq


async def _messages(bus: Bus, progress: Callable[[int, int], None] | None) -> AsyncIterator[Msg]:
    """Every message of the log up to the sequence that was last when the read began."""
    last = await bus.last_seq()
    if last == 0:
        return
    reader = await bus.reader(bus.log_subjects())
    try:
        seq = 0
        while seq < last:
            msgs = await reader.fetch(2000, timeout=2.0)
            if not msgs:
                break
            for m in msgs:
                seq = stream_seq(m)
                yield m
            if progress is not None:
                progress(seq, last)
    finally:
        await reader.close()


async def read_log(bus: Bus, progress: Callable[[int, int], None] | None = None) -> list[tuple[int, bytes]]:
    return [(stream_seq(m), m.data) async for m in _messages(bus, progress)]


async def read_log_timed(bus: Bus, progress: Callable[[int, int], None] | None = None
                         ) -> list[tuple[int, float, bytes]]:
    """(seq, stored_at, bytes): `stored_at` is when the server stored the message (Unix seconds). Benchmarks
    need it because an event's own `ts` is the time of its trigger, not the time it was decided."""
    return [(stream_seq(m), m.metadata.timestamp.timestamp(), m.data) async for m in _messages(bus, progress)]
