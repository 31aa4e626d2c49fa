"""Read the whole log from the live stream, in order, with a progress callback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import nats.errors
from nats.aio.msg import Msg

from libs.bus.consumer import Consumer, stream_seq
from libs.bus.jetstream import Bus

# How long a read waits for a log that has more to give but does not answer (a stream leader moving).
STALL_LIMIT_S = 30.0


class LogReadError(RuntimeError):
    pass


async def _messages(bus: Bus, progress: Callable[[int, int], None] | None) -> AsyncIterator[Msg]:
    """Every message of the log up to the sequence that was last when the read began. An empty fetch ends the
    read only when the reader has nothing pending: a stream between leaders answers nothing for a while, and
    stopping there would hand back a log cut short as if it were whole."""
    last = await bus.last_seq()
    if last == 0:
        return
    reader = await bus.reader(bus.log_subjects())
    try:
        seq = 0
        stalled_since: float | None = None
        while seq < last:
            msgs = await reader.fetch(2000, timeout=2.0)
            if not msgs:
                if await _nothing_pending(reader):
                    break
                now = time.monotonic()
                stalled_since = stalled_since if stalled_since is not None else now
                if now - stalled_since > STALL_LIMIT_S:
                    raise LogReadError(f"the log stopped answering after sequence {seq} of {last} "
                                       f"for {STALL_LIMIT_S:.0f} s")
                continue
            stalled_since = None
            for m in msgs:
                seq = stream_seq(m)
                yield m
            if progress is not None:
                progress(seq, last)
    finally:
        await reader.close()


async def _nothing_pending(reader: Consumer) -> bool:
    """Has the reader been handed every message of its subjects? (No answer counts as not known yet.)"""
    try:
        info = await reader.sub.consumer_info()
    except (nats.errors.Error, TimeoutError):  # the stream is between leaders: ask after the next fetch
        return False
    return not info.num_pending


async def read_log(bus: Bus, progress: Callable[[int, int], None] | None = None) -> list[tuple[int, bytes]]:
    return [(stream_seq(m), m.data) async for m in _messages(bus, progress)]


async def read_log_timed(bus: Bus, progress: Callable[[int, int], None] | None = None
                         ) -> list[tuple[int, float, bytes]]:
    """(seq, stored_at, bytes): `stored_at` is when the server stored the message (Unix seconds). Benchmarks
    need it because an event's own `ts` is the time of its trigger, not the time it was decided."""
    return [(stream_seq(m), m.metadata.timestamp.timestamp(), m.data) async for m in _messages(bus, progress)]
