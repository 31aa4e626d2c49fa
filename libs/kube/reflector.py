"""A reflector, as client-go and kopf keep one: list, then watch from the list's resourceVersion, and keep a
store of the objects as last seen. Every change reaches the handler exactly once, in order:

1. list (in pages) and compare with the store: what appeared, changed (another resourceVersion) or vanished
   while nobody watched is handed over as ADDED / MODIFIED / DELETED, so a relist never hides a change;
2. watch from the list's resourceVersion with bookmarks: a BOOKMARK moves the resourceVersion on without a
   change, so a reconnect after a quiet hour does not fall off the server's window;
3. a dropped connection (or the server ending the request) watches again from the last resourceVersion;
4. `410 Gone` (the resourceVersion is older than the server keeps) goes back to 1.

An event whose object has the resourceVersion the store already holds is a repeat and is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from libs.kube.client import ApiError, KubeClient, Obj

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
Handler = Callable[[str, Obj | None, Obj | None], Awaitable[None]]  # (type, old, new)


def key_of(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace", "")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def version_of(obj: Obj | None) -> str:
    return str((obj or {}).get("metadata", {}).get("resourceVersion", ""))


@dataclass
class Reflector:
    client: KubeClient
    path: str  # the collection, e.g. /api/v1/pods or /api/v1/namespaces/ns/pods
    handler: Handler
    label_selector: str = ""
    field_selector: str = ""
    page_size: int = 500
    watch_timeout_s: int = 240
    store: dict[str, Obj] = field(default_factory=dict)
    resource_version: str = ""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    relists: int = 0  # lists after the first (410 Gone): observable by tests and metrics
    on_relist: Callable[[str], None] | None = None

    def _selectors(self) -> dict[str, str]:
        out = {}
        if self.label_selector:
            out["labelSelector"] = self.label_selector
        if self.field_selector:
            out["fieldSelector"] = self.field_selector
        return out

    async def relist(self) -> None:
        """Step 1: the whole collection, and what changed against the store."""
        items: list[Obj] = []
        params = {**self._selectors(), "limit": str(self.page_size)}
        while True:
            page = await self.client.get(self.path, params)
            items += page.get("items", [])
            token = page.get("metadata", {}).get("continue", "")
            if not token:
                break
            params = {**self._selectors(), "limit": str(self.page_size), "continue": token}
        listed_version = str(page.get("metadata", {}).get("resourceVersion", ""))
        kind = self.path.rsplit("/", 1)[-1]
        seen = set()
        for item in items:
            item.setdefault("kind", page.get("kind", "").removesuffix("List") or kind)
            key = key_of(item)
            seen.add(key)
            old = self.store.get(key)
            if old is None:
                await self._apply(ADDED, item)
            elif version_of(old) != version_of(item):
                await self._apply(MODIFIED, item)
        for key in sorted(set(self.store) - seen):
            await self._apply(DELETED, self.store[key])
        self.resource_version = listed_version
        self.synced.set()

    async def _apply(self, kind: str, obj: Obj) -> None:
        key = key_of(obj)
        old = self.store.get(key)
        if kind == DELETED:
            if old is None:
                return
            del self.store[key]
            await self._hand_over(DELETED, old, obj)
            return
        if old is not None and version_of(old) == version_of(obj):
            return  # a repeat (a watch resumed just before this change)
        self.store[key] = obj
        await self._hand_over(ADDED if old is None else MODIFIED, old, obj)

    async def _hand_over(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """One object the handler cannot take (a bug, an object no one foresaw) is logged and passed over: it
        must not stop the informer, and with it every other object."""
        try:
            await self.handler(kind, old, new)
        except Exception:
            log.exception("%s: handling %s %s failed; going on", self.path, kind, key_of(new or old or {}))

    async def watch_once(self) -> None:
        """Steps 2-3: one watch request, applied as it streams."""
        params = {**self._selectors(), "resourceVersion": self.resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(self.watch_timeout_s)}
        async for event in self.client.watch(self.path, params):
            kind, obj = event.get("type", ""), event.get("object", {})
            if kind == "ERROR":
                code = int(obj.get("code", 0))
                raise ApiError(code, str(obj.get("reason", "")), str(obj.get("message", "")))
            if kind == "BOOKMARK":
                self.resource_version = version_of(obj) or self.resource_version
                continue
            await self._apply(kind, obj)
            self.resource_version = version_of(obj) or self.resource_version

    async def run(self) -> None:
        """List, then watch for ever (step 4 on 410, a short pause on other failures)."""
        first = True
        while True:
            try:
                if first or not self.resource_version:
                    await self.relist()
                    first = False
                await self.watch_once()
            except ApiError as err:
                if err.status == 410:
                    log.info("%s: resourceVersion %s is gone; listing again", self.path, self.resource_version)
                    self.relists += 1
                    if self.on_relist is not None:
                        self.on_relist(self.path)
                    self.resource_version = ""
                    continue
                log.warning("%s: %s; trying again", self.path, err)
                await asyncio.sleep(1.0)
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as err:
                log.info("%s: watch dropped (%s); watching again from %s", self.path, err or type(err).__name__,
                         self.resource_version)
                await asyncio.sleep(0.5)
