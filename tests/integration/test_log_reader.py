"""Reading the whole log from a real JetStream server: a fetch that comes back empty while the reader still
has messages pending (a stream between leaders) does not cut the log short."""

from __future__ import annotations

import pytest

from libs.audit import log_reader
from libs.audit.log_reader import read_log
from libs.bus.consumer import Consumer
from libs.bus.jetstream import Bus
from tests.integration.test_reactor_on_jetstream import setup_events, submit


async def test_an_empty_fetch_midway_does_not_end_the_read(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    events = setup_events() + [submit(i) for i in range(30)]
    await bus.publish(events)
    fetch = Consumer.fetch
    calls = 0

    async def silent_at_first(self: Consumer, batch: int, timeout: float) -> list:
        nonlocal calls
        calls += 1
        if calls <= 2:  # the server answers nothing twice, with every message still pending
            return []
        return await fetch(self, 5, timeout)  # then in small batches

    monkeypatch.setattr(Consumer, "fetch", silent_at_first)
    log = await read_log(bus)
    assert [seq for seq, _ in log] == list(range(1, len(events) + 1))
    assert calls > 2


async def test_a_log_that_never_answers_again_is_an_error_not_a_short_log(bus: Bus,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    await bus.publish([submit(1), submit(2)])

    async def silent(self: Consumer, batch: int, timeout: float) -> list:
        return []

    monkeypatch.setattr(Consumer, "fetch", silent)
    monkeypatch.setattr(log_reader, "STALL_LIMIT_S", 0.0)
    with pytest.raises(log_reader.LogReadError, match="after sequence 0 of 2"):
        await read_log(bus)

