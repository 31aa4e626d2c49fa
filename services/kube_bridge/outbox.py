"""What the bridge tells the log, in order: submissions, cancels and executor reports. The informers never wait
for the bus: one flusher publishes what has queued up meanwhile, pipelined, in batches."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from contracts import EventBase
from libs.bus.jetstream import Bus

BATCH = 500


@dataclass
class Outbox:
    bus: Bus | None = None
    reported: set[str] = field(default_factory=set)  # ids published (the stream drops a repeat anyway)
    queued: list[EventBase] = field(default_factory=list)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish(self, events: list[EventBase]) -> None:
        fresh = [e for e in events if e.id not in self.reported]
        if not fresh:
            return
        self.reported.update(e.id for e in fresh)
        self.queued.extend(fresh)
        self._ready.set()

    async def flush_forever(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self.queued and self.bus is not None:
                batch, self.queued = self.queued[:BATCH], self.queued[BATCH:]
                await self.bus.publish_until_stored(batch)
