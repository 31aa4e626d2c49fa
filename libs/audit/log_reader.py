"""Read the whole log from the live stream, in order, with a progress callback."""

from __future__ import annotations

from collections.abc import Callable

from libs.bus.jetstream import Bus, stream_seq


async def read_log(bus: Bus, progress: Callable[[int, int], None] | None = None) -> list[tuple[int, bytes]]:
    last = await bus.last_seq()
    out: list[tuple[int, bytes]] = []
    if last == 0:
        return out
    reader = await bus.reader(bus.log_subjects())
    try:
        seq = 0
        while seq < last:
            msgs = await reader.fetch(2000, timeout=2.0)
            if not msgs:
                break
            for m in msgs:
                seq = stream_seq(m)
                out.append((seq, m.data))
            if progress is not None:
                progress(seq, last)
    finally:
        await reader.close()
    return out
