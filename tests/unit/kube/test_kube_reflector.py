"""The reflector against a scripted API server (aiohttp on a free port): a list, a watch with a bookmark, a
dropped connection resumed from the bookmark's resourceVersion, `410 Gone` and the relist that hands over
exactly what changed meanwhile, each change once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from libs.kube.client import KubeClient, KubeConfig
from libs.kube.reflector import Reflector
from libs.runtime.embedded import free_port


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version, "uid": name}}


class ScriptedServer:
    """Answers lists from `collection` and plays one scripted watch per request."""

    def __init__(self) -> None:
        self.collection: list[dict[str, Any]] = [pod("a", "10"), pod("b", "10")]
        self.list_version = "10"
        self.watches: list[list[dict[str, Any]] | None] = []  # None: answer 410 at once
        self.watch_versions: list[str] = []
        self.lists = 0
        self.closing = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "1":
            self.lists += 1
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": self.list_version},
                                      "items": self.collection})
        self.watch_versions.append(request.query["resourceVersion"])
        script = self.watches.pop(0) if self.watches else []
        response = web.StreamResponse()
        await response.prepare(request)
        if script is None:
            script = [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                   "message": "too old resource version"}}]
        for event in script:
            await response.write((json.dumps(event) + "\n").encode())
        if not self.watches:
            await self.closing.wait()  # the last watch stays open until the test ends
        return response  # the server ends the request: a dropped watch


async def test_a_watch_resumes_from_its_bookmark_and_a_410_relists_what_was_missed() -> None:
    server = ScriptedServer()
    server.watches = [
        [{"type": "ADDED", "object": pod("c", "11")}, {"type": "BOOKMARK", "object": pod("", "15")}],  # then drops
        None,  # resuming from 15: gone
        [],
    ]
    app = web.Application()
    app.router.add_get("/api/v1/pods", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    seen: list[tuple[str, str, str]] = []

    async def handler(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        seen.append((kind, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}"))
    reflector = Reflector(client, "/api/v1/pods", handler)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 5)
        # Meanwhile (while the watch is gone) b changed, a was deleted, d was added.
        server.collection = [pod("b", "20"), pod("c", "11"), pod("d", "21")]
        server.list_version = "21"
        for _ in range(100):
            if reflector.relists >= 1 and server.lists >= 2 and len(server.watch_versions) >= 3:
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        server.closing.set()
        await client.close()
        await runner.cleanup()
    assert server.watch_versions[:3] == ["10", "15", "21"]  # from the list, from the bookmark, after the relist
    assert reflector.relists == 1
    assert seen == [("ADDED", "a", "10"), ("ADDED", "b", "10"), ("ADDED", "c", "11"),
                    ("MODIFIED", "b", "20"), ("ADDED", "d", "21"), ("DELETED", "a", "10")]
    assert sorted(reflector.store) == ["ns/b", "ns/c", "ns/d"]
