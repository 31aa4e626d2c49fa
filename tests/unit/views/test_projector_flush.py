"""The accounting projector notices when Redis loses its read models (FLUSHALL, a restart without
persistence) and writes every view again from its ledger: after the next batch the store holds exactly what a
projector rebuilt from the log would write."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from contracts import JobFinished, JobStarted
from libs.runtime.embedded import EmbeddedServer, start_redis
from libs.views.projector import Projector
from libs.views.store import ViewStore, ViewsVanished
from tests.unit.builders import EventFeed, job, node, pipeline, queue


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Redis of this module's own: FLUSHALL must not reach the session's server other tests use."""
    server = start_redis(Path(tmp_path_factory.mktemp("redis-flush")))
    yield server
    server.stop()


@pytest.fixture
async def store(redis_server: EmbeddedServer) -> AsyncIterator[ViewStore]:
    s = ViewStore.from_url(redis_server.url, prefix=f"flush-{uuid.uuid4().hex[:8]}")
    yield s
    await s.clear()
    await s.close()


def feed_some_jobs() -> EventFeed:
    feed = pipeline()
    feed.at(10.0).queues(queue("fq", "fteam", 8))
    feed.nodes(node("f-a", 4), node("f-b", 4))
    feed.at(20.0).submit("one", job("fteam", "fq").gpus(2))
    feed.submit("two", job("fteam", "fq").fraction(500))
    feed.send(JobStarted, job_id="one")
    return feed


async def project(feed: EventFeed, projector: Projector, start: int) -> int:
    """Hand the feed's new events to the projector as one batch, as the reactor does."""
    for seq, event in enumerate(feed.log[start:], start=start + 1):
        projector.on_event(seq, event)
    await projector.after_batch()
    return len(feed.log)


async def snapshot(store: ViewStore) -> dict[str, object]:
    """Every view the API serves."""
    return {"jobs": await store.jobs(), "queues": await store.queues(), "nodes": await store.nodes(),
            "usage": await store.usage(), "running": await store.jobs(state="running")}


async def rebuilt(feed: EventFeed, redis_url: str) -> dict[str, object]:
    """What a projector that starts afresh and folds the whole log writes (the restart path)."""
    fresh = ViewStore.from_url(redis_url, prefix=f"fresh-{uuid.uuid4().hex[:8]}")
    try:
        projector = Projector(fresh)
        for seq, event in enumerate(feed.log, start=1):
            projector.replay(seq, event)
        await projector.after_catch_up()
        return await snapshot(fresh)
    finally:
        await fresh.clear()
        await fresh.close()


async def test_a_flush_between_batches_is_noticed_and_every_view_is_written_again(
        store: ViewStore, redis_server: EmbeddedServer) -> None:
    projector = Projector(store)
    await projector.after_catch_up()  # an empty log: the sequence key is written all the same
    feed = feed_some_jobs()
    seen = await project(feed, projector, 0)
    assert len(await store.jobs()) == 2

    await store.r.flushall()
    feed.at(30.0).send(JobFinished, job_id="one")  # this batch changes one job only
    await project(feed, projector, seen)

    assert await snapshot(store) == await rebuilt(feed, redis_server.url)
    assert {j.id: j.state for j in await store.jobs()} == {"one": "succeeded", "two": "pending"}


async def test_a_flush_is_noticed_by_a_batch_that_changes_no_view(
        store: ViewStore, redis_server: EmbeddedServer) -> None:
    projector = Projector(store)
    await projector.after_catch_up()
    feed = feed_some_jobs()
    seen = await project(feed, projector, 0)

    await store.r.flushall()
    await project(feed, projector, seen)  # nothing new (a batch of clock ticks): still one check

    assert await snapshot(store) == await rebuilt(feed, redis_server.url)


async def test_the_store_refuses_a_batch_into_an_emptied_store_only_when_the_writer_expects_its_views(
        store: ViewStore) -> None:
    ops = [["SET", store.job_key("x"), "{}"]]
    assert await store.apply(1, ops, expect_existing=False)  # a first write needs no history
    await store.r.delete(store.seq_key)
    with pytest.raises(ViewsVanished):
        await store.apply(2, ops, expect_existing=True)
    assert await store.r.get(store.seq_key) is None  # nothing written, the key is not re-created
    assert await store.apply(2, [], force=True)  # a rebuild writes the key even with no views
    assert not await store.apply(2, ops, expect_existing=True)  # a stale batch is still ignored
