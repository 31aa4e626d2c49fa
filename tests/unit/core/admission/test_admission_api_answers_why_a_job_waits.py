"""The admission API's answer to a submission its queue's policy cannot serve now: accepted (201, the command on
the bus), with the reason it waits for, the one quota tells it; a submission no policy could serve is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from contracts import FlavorQuota, QueueSpec, SubmitJob
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.http import base_app
from libs.views.store import ViewStore
from services.admission.api import JobsApi
from tests.unit.builders import EventFeed, node
from tests.unit.core.admission.test_admission_not_ready import RecordingBus

QUEUE = QueueSpec(name="ml", team="ml", flavors=(FlavorQuota(model="A100", nominal_gpus=4),), user_max_gpus=6)


@pytest.fixture
async def api() -> AsyncIterator[tuple[TestClient, RecordingBus]]:
    decider = AdmissionDecider()
    feed = EventFeed(decider)
    feed.queues(QUEUE)
    feed.nodes(node("a", 8), node("b", 4, "H100"))
    bus = RecordingBus()
    app = base_app("admission", lambda: True)
    JobsApi(cast(Bus, bus), decider, cast(ViewStore, None)).routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, bus
    await client.close()


@pytest.mark.parametrize(("job", "reason"), [
    pytest.param({"gpus": 2}, "", id="within its queue's quota: no reason"),
    pytest.param({"gpus": 5}, "exceeds_queue_quota", id="over its queue's ceiling"),
    pytest.param({"gpus": 2, "gpu_models": ["H100"]}, "no_quota_for_models", id="no quota of its model"),
    pytest.param({"gpus": 4, "replicas": 2}, "user_limit", id="over its user limit alone"),
])
async def test_a_submission_its_queue_cannot_hold_now_is_accepted_with_the_reason_it_waits_for(
        api: tuple[TestClient, RecordingBus], job: dict[str, object], reason: str) -> None:
    client, bus = api
    resp = await client.post("/v1/jobs", json={"team": "ml", "queue": "ml", **job})
    answer = await resp.json()
    assert (resp.status, answer["state"], answer.get("reason", "")) == (201, "pending", reason)
    assert bool(answer.get("message")) is bool(reason)
    [command] = bus.published
    assert isinstance(command, SubmitJob)


async def test_a_submission_no_policy_could_serve_is_refused_at_once(api: tuple[TestClient, RecordingBus]) -> None:
    client, bus = api
    resp = await client.post("/v1/jobs", json={"team": "ml", "queue": "ml", "gpus": 9})
    assert (resp.status, (await resp.json())["code"]) == (422, "exceeds_node_capacity")
    assert bus.published == []
