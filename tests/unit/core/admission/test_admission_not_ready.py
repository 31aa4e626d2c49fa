"""The admission API before a first node registers: job and service writes are 503 `not_ready` with
Retry-After (capacity cannot be checked yet), /readyz says the inventory is not known, and both change as
soon as a node registers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from contracts import EventBase, SubmitJob
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.http import READY_DETAILS, base_app
from libs.views.store import ViewStore
from services.admission.api import JobsApi
from services.admission.services_api import ServicesApi
from tests.unit.builders import EventFeed, node, queue

JOB = {"team": "ml", "queue": "ml-dev", "gpus": 2}


@dataclass
class RecordingBus:
    published: list[EventBase] = field(default_factory=list)

    async def publish(self, events: Sequence[EventBase], headers: Any = None) -> None:
        self.published.extend(events)


@dataclass
class Api:
    client: TestClient
    bus: RecordingBus
    feed: EventFeed


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    decider = AdmissionDecider()
    feed = EventFeed(decider)
    feed.queues(queue("ml-dev", "ml", None))
    bus = RecordingBus()
    app = base_app("admission", lambda: True)
    app[READY_DETAILS] = lambda: {"inventory": decider.state.inventory.known}
    JobsApi(cast(Bus, bus), decider, cast(ViewStore, None)).routes(app)
    ServicesApi(cast(Bus, bus), decider).routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield Api(client, bus, feed)
    await client.close()


async def test_a_submission_before_any_node_registers_is_503_not_ready_with_retry_after(api: Api) -> None:
    resp = await api.client.post("/v1/jobs", json=JOB)
    assert (resp.status, (await resp.json())["code"], resp.headers["Retry-After"]) == (503, "not_ready", "1")
    assert api.bus.published == []
    api.feed.nodes(node("a", 8))
    resp = await api.client.post("/v1/jobs", json=JOB)
    assert resp.status == 201
    [command] = api.bus.published
    assert isinstance(command, SubmitJob) and command.spec.gpus == 2
    resp = await api.client.post("/v1/jobs", json={**JOB, "gpus": 9})
    assert (resp.status, (await resp.json())["code"]) == (422, "exceeds_node_capacity")


async def test_a_deployment_before_any_node_registers_is_503_not_ready(api: Api) -> None:
    spec = {"name": "chat", "replica": {"team": "ml", "queue": "ml-dev", "gpus": 1}, "min_replicas": 1,
            "max_replicas": 2}
    resp = await api.client.post("/v1/services", json=spec)
    assert (resp.status, (await resp.json())["code"], resp.headers["Retry-After"]) == (503, "not_ready", "1")
    api.feed.nodes(node("a", 8))
    resp = await api.client.post("/v1/services", json=spec)
    assert resp.status == 201, await resp.text()


async def test_readyz_stays_ready_and_says_whether_the_inventory_is_known(api: Api) -> None:
    resp = await api.client.get("/readyz")
    body = await resp.json()
    assert (resp.status, body["ready"], body["inventory"]) == (200, True, False)
    api.feed.nodes(node("a", 8))
    body = await (await api.client.get("/readyz")).json()
    assert (body["ready"], body["inventory"]) == (True, True)
