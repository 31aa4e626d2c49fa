"""Redis read models: written by the accounting projector, read by the API.

Every batch is written by one Lua script that first checks the projection's sequence, so a batch applied
twice (or by a stale writer) changes nothing, and the whole batch lands atomically. A writer that has
written before says so (`expect_existing`): if the sequence key is gone, Redis lost the views (FLUSHALL, a
restart without persistence) and the script refuses the batch, so that the writer rebuilds every view
instead of writing one batch into an empty store and re-creating the key that would have told it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import redis.asyncio as aioredis

from contracts.views import JobView, NodeView, QueueView, TeamUsage

_APPLY = """
local raw = redis.call('GET', KEYS[1])
if not raw and ARGV[3] == 'expect' then return -1 end
local current = tonumber(raw or '0')
local seq = tonumber(ARGV[1])
if seq <= current and ARGV[3] ~= 'force' then return 0 end
local ops = cjson.decode(ARGV[2])
for _, op in ipairs(ops) do
  redis.call(unpack(op))
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


class ViewsVanished(Exception):
    """The projection's sequence key is missing although the writer wrote it before: the views are gone."""


class ViewStore:
    def __init__(self, client: aioredis.Redis, prefix: str = "gs") -> None:
        self.r = client
        self.p = prefix
        self._apply = client.register_script(_APPLY)

    @classmethod
    def from_url(cls, url: str, prefix: str = "gs") -> ViewStore:
        return cls(aioredis.from_url(url), prefix)

    async def close(self) -> None:
        await self.r.aclose()

    # --- keys --------------------------------------------------------------------------------------

    def job_key(self, job_id: str) -> str:
        return f"{self.p}:job:{job_id}"

    def index_key(self, kind: str = "", value: str = "") -> str:
        return f"{self.p}:jobs" if not kind else f"{self.p}:jobs:{kind}:{value}"

    @property
    def seq_key(self) -> str:
        return f"{self.p}:projection:seq"

    # --- writing -----------------------------------------------------------------------------------

    async def apply(self, seq: int, ops: list[list[Any]], force: bool = False,
                    expect_existing: bool = False) -> bool:
        """Write one batch. `force` writes whatever the stored sequence (a rebuild), and writes the sequence
        key even with no ops, so that a later `expect_existing` finds it. `expect_existing` raises
        ViewsVanished instead of writing when the sequence key is missing; it runs the script even with no ops,
        which makes it a one-round-trip check per batch."""
        mode = "force" if force else "expect" if expect_existing else ""
        if not ops and not mode:
            return False
        payload = json.dumps(ops, separators=(",", ":"))
        done = await self._apply(keys=[self.seq_key], args=[seq, payload, mode])
        if done == -1:
            raise ViewsVanished(f"{self.seq_key} is missing: the read models were lost")
        return bool(done)

    async def clear(self) -> None:
        """Drop every view (before a rebuild from the log), a thousand keys per call."""
        keys: list[bytes] = []
        async for key in self.r.scan_iter(match=f"{self.p}:*", count=1000):
            keys.append(key)
            if len(keys) >= 1000:
                await self.r.delete(*keys)
                keys.clear()
        if keys:
            await self.r.delete(*keys)

    # --- reading -----------------------------------------------------------------------------------

    async def job(self, job_id: str) -> JobView | None:
        raw = await self.r.get(self.job_key(job_id))
        return msgspec.json.decode(raw, type=JobView) if raw else None

    async def jobs(self, queue: str = "", state: str = "", team: str = "", limit: int = 1000,
                   offset: int = 0) -> list[JobView]:
        index = (self.index_key("state", state) if state else
                 self.index_key("queue", queue) if queue else
                 self.index_key("team", team) if team else self.index_key())
        views: list[JobView] = []
        start = offset
        while len(views) < limit:
            ids = await self.r.zrange(index, start, start + max(limit, 200) - 1)
            if not ids:
                break
            start += len(ids)
            raws = await self.r.mget([self.job_key(i.decode() if isinstance(i, bytes) else str(i)) for i in ids])
            for raw in raws:
                if not raw:
                    continue
                v = msgspec.json.decode(raw, type=JobView)
                if (queue and v.queue != queue) or (state and v.state != state) or (team and v.team != team):
                    continue
                views.append(v)
        return views[:limit]

    async def queues(self) -> list[QueueView]:
        raw = await self.r.hgetall(f"{self.p}:queues")
        return sorted((msgspec.json.decode(v, type=QueueView) for v in raw.values()), key=lambda q: q.name)

    async def nodes(self) -> list[NodeView]:
        raw = await self.r.hgetall(f"{self.p}:nodes")
        return sorted((msgspec.json.decode(v, type=NodeView) for v in raw.values()), key=lambda n: n.name)

    async def usage(self) -> list[TeamUsage]:
        raw = await self.r.hgetall(f"{self.p}:usage")
        return sorted((msgspec.json.decode(v, type=TeamUsage) for v in raw.values()), key=lambda u: u.team)
