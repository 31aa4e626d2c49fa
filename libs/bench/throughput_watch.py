"""What the throughput bench reads from the server while it runs: how far behind each service is, how many
messages each was handed, and a stretch of the log with the time the server stored each message."""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.api import ConsumerInfo

from libs.bench.kueue_run import Backlog
from libs.bus.consumer import stream_seq
from libs.bus.jetstream import Bus


async def consumers(bus: Bus) -> dict[str, ConsumerInfo]:
    """Each service's durable consumer, now; {} when the server does not answer in time (a lost sample)."""
    with contextlib.suppress(Exception):
        infos = await bus.js.consumers_info(bus.config.stream)
        return {i.config.durable_name: i for i in sorted(infos, key=lambda i: i.config.durable_name or "")
                if i.config.durable_name}
    return {}


async def backlogs(bus: Bus) -> dict[str, int]:
    """What each service has not yet handled, now."""
    return {name: int(i.num_pending or 0) + int(i.num_ack_pending or 0) for name, i in (await consumers(bus)).items()}


async def deliveries(bus: Bus) -> dict[str, int]:
    """How many messages each service's consumer has delivered so far."""
    return {name: int(i.delivered.consumer_seq or 0) if i.delivered else 0
            for name, i in (await consumers(bus)).items()}


async def sample_backlog(bus: Bus, backlog: Backlog, every_s: float = 0.5) -> None:
    while True:
        for name, count in (await backlogs(bus)).items():
            backlog.add(name, count)
        await asyncio.sleep(every_s)


async def read_range(bus: Bus, start: int, end: int) -> list[tuple[int, float, bytes]]:
    """(seq, stored at, bytes) of the log's messages from sequence `start` to `end`."""
    out: list[tuple[int, float, bytes]] = []
    if end < start:
        return out
    reader = await bus.reader(bus.log_subjects(), start_seq=start)
    try:
        while not out or out[-1][0] < end:
            msgs = await reader.fetch(2000, timeout=2.0)
            if not msgs:
                break
            out += [(seq, m.metadata.timestamp.timestamp(), m.data) for m in msgs if (seq := stream_seq(m)) <= end]
    finally:
        await reader.close()
    return out
