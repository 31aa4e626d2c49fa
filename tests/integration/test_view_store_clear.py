"""Clearing the read models before a rebuild drops every view of the platform, and nothing of another's."""

from __future__ import annotations

from libs.runtime.embedded import EmbeddedServer
from libs.views.store import ViewStore


async def test_clear_drops_every_key_of_its_prefix_in_batches(redis_server: EmbeddedServer) -> None:
    mine, other = ViewStore.from_url(redis_server.url, prefix="clearme"), ViewStore.from_url(redis_server.url,
                                                                                              prefix="keepme")
    try:
        await mine.r.mset({mine.job_key(f"j{i}"): b"{}" for i in range(2500)})
        await other.r.set(other.job_key("j0"), b"{}")
        await mine.clear()
        assert [k async for k in mine.r.scan_iter(match="clearme:*")] == []
        assert await other.r.get(other.job_key("j0")) == b"{}"
    finally:
        await other.r.delete(other.job_key("j0"))
        await mine.close()
        await other.close()
