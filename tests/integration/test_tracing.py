"""One trace per job, across every service, on a real JetStream server.

The six services' handlers run in-process on their reactors (one event loop, one stream), each with its
own tracing (resource service.name=gpusched-<service>) exporting to one in-memory exporter, so the test
sees every service's spans. A job goes in through the admission HTTP API and runs to its end on the
simulated executor; its spans must form one tree, rooted at the API's submission span."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contracts import (
    CancelJob,
    EventBase,
    GpuSpec,
    JobCancelled,
    JobFinished,
    JobSpec,
    NodeRegistered,
    NodeSpec,
    QueuePolicyChanged,
    QueueSpec,
    SubmitJob,
)
from contracts.codec import decode
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.handler import DeciderHandler, Handler
from libs.runtime.reactor import Reactor
from libs.sim.live_executor import SimExecutor
from libs.telemetry.tracing import ServiceTracing, job_of, setup_tracing
from libs.views.projector import Projector
from libs.views.store import ViewStore
from services.admission.api import JobsApi

TIME_SCALE = 20.0  # the job's 2 declared seconds run in 0.1 s


def setup_events() -> list[EventBase]:
    return [
        QueuePolicyChanged(id="q1", ts=1.0, source="operator", queue=QueueSpec(name="q", team="t", nominal_gpus=8),
                           version=1),
        NodeRegistered(id="n1", ts=1.0, source="node-telemetry",
                       node=NodeSpec(name="n1", gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))),
    ]


@dataclass
class Platform:
    bus: Bus
    api: TestClient
    tracings: dict[str, ServiceTracing]
    exporter: InMemorySpanExporter

    def spans_of(self, job_id: str) -> list[ReadableSpan]:
        for tracing in self.tracings.values():
            tracing.force_flush()
        return [s for s in self.exporter.get_finished_spans() if (s.attributes or {}).get("gpusched.job_id") == job_id]


@pytest.fixture
async def platform(bus: Bus, redis_server: EmbeddedServer, stream_name: str) -> AsyncIterator[Platform]:
    await bus.publish(setup_events())
    exporter = InMemorySpanExporter()
    store = ViewStore.from_url(redis_server.url, prefix=stream_name.lower())
    admission = AdmissionDecider()
    executor = SimExecutor(bus, time_scale=TIME_SCALE)
    handlers: list[Handler] = [
        DeciderHandler(admission), DeciderHandler(QuotaDecider()), DeciderHandler(PlacementDecider()),
        DeciderHandler(PreemptionDecider()), Projector(store), executor,
    ]
    tracings = {h.name: _tracing(h.name, exporter) for h in handlers}
    executor.tracing = tracings[executor.name]  # in a service process it finds the process's tracing
    reactors = [Reactor(bus, h, fetch_timeout=0.2, tracing=tracings[h.name]) for h in handlers]
    for r in reactors:
        await r.start()
    tasks = [asyncio.create_task(r.run()) for r in reactors]
    app = web.Application()
    JobsApi(bus, admission, store, tracing=tracings["admission"]).routes(app)
    api = TestClient(TestServer(app))
    await api.start_server()
    try:
        await _until(lambda: admission.state.policy.queues and admission.state.inventory.nodes,
                     "admission never saw the setup")
        yield Platform(bus, api, tracings, exporter)
    finally:
        await api.close()
        for r in reactors:
            r.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for tracing in tracings.values():
            tracing.shutdown()
        await store.close()


def _tracing(service: str, exporter: InMemorySpanExporter) -> ServiceTracing:
    tracing = setup_tracing(service, exporter)
    assert tracing is not None
    return tracing


async def _until(condition: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def log_messages(bus: Bus) -> list[Msg]:
    """Every message of the log, headers included."""
    last = await bus.last_seq()
    reader = await bus.reader(bus.log_subjects())
    out: list[Msg] = []
    try:
        while len(out) < last:
            msgs = await reader.fetch(1000, timeout=2.0)
            if not msgs:
                break
            out += msgs
    finally:
        await reader.close()
    return out


async def run_one_job(platform: Platform) -> str:
    resp = await platform.api.post("/v1/jobs", json={"team": "t", "queue": "q", "gpus": 2, "duration_s": 2.0})
    assert resp.status == 201, await resp.text()
    job_id: str = (await resp.json())["id"]

    async def finished() -> bool:
        return any(isinstance(decode(m.data), JobFinished) and decode(m.data).job_id == job_id  # type: ignore[attr-defined]
                   for m in await log_messages(platform.bus))

    deadline = time.monotonic() + 30.0
    while not await finished():
        assert time.monotonic() < deadline, "the job never finished"
        await asyncio.sleep(0.1)
    # Let the services consume the JobFinished too (accounting, quota's release).
    await _until(lambda: any(s.name == "accounting JobFinished" for s in platform.spans_of(job_id)),
                 "accounting never handled the job's end")
    return job_id


async def test_a_job_has_one_trace_across_every_service(platform: Platform) -> None:
    job_id = await run_one_job(platform)
    spans = platform.spans_of(job_id)
    names = {s.name for s in spans}

    services = {(s.attributes or {})["gpusched.service"] for s in spans}
    assert {"admission", "quota", "placement", "node-telemetry", "accounting"} <= services
    assert len({s.context.trace_id for s in spans}) == 1, "the job's spans are split over several traces"

    # One root: the API's submission; every other span's parent is one of the job's spans.
    roots = [s for s in spans if s.parent is None]
    assert [r.name for r in roots] == ["admission submit"]
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:
        if s.parent is not None:
            assert s.parent.trace_id == s.context.trace_id
            assert s.parent.span_id in by_id, f"{s.name} hangs under a span outside the job's trace"

    # The hops: a service's consumer span hangs under the decision span of the service that published it.
    def parent_name(name: str) -> str:
        span = next(s for s in spans if s.name == name)
        assert span.parent is not None
        return by_id[span.parent.span_id].name

    assert parent_name("admission SubmitJob") == "admission submit"
    assert parent_name("admission decide JobAdmitted") == "admission SubmitJob"
    assert parent_name("quota JobAdmitted") == "admission decide JobAdmitted"
    assert parent_name("placement QuotaReserved") == "quota decide QuotaReserved"
    assert parent_name("node-telemetry JobPlaced") == "placement decide JobPlaced"
    # The finish comes from the executor's timer, not from a consumed event: it continues the job's trace.
    assert "node-telemetry decide JobFinished" in names
    assert parent_name("accounting JobFinished") == "node-telemetry decide JobFinished"

    for s in spans:
        attrs = s.attributes or {}
        assert attrs["messaging.system"] == "nats"
        assert s.resource.attributes["service.name"] == f"gpusched-{attrs['gpusched.service']}"
    consumer = next(s for s in spans if s.name == "quota JobAdmitted")
    assert isinstance((consumer.attributes or {})["gpusched.seq"], int)


async def test_every_message_about_the_job_carries_its_traceparent(platform: Platform) -> None:
    job_id = await run_one_job(platform)
    trace_id = f"{platform.spans_of(job_id)[0].context.trace_id:032x}"
    about_job = [m for m in await log_messages(platform.bus) if job_of(decode(m.data)) == job_id]
    kinds = {type(decode(m.data)).__name__ for m in about_job}
    assert {"SubmitJob", "JobAdmitted", "QuotaReserved", "JobPlaced", "JobStarted", "JobFinished"} <= kinds
    for m in about_job:
        headers = m.headers or {}
        assert headers.get("traceparent", "").split("-")[1] == trace_id, type(decode(m.data)).__name__
        assert headers["Nats-Msg-Id"] == decode(m.data).id  # the de-duplication key is untouched
    # Events that concern no job carry no trace.
    assert all("traceparent" not in (m.headers or {}) for m in await log_messages(platform.bus)
               if job_of(decode(m.data)) is None)


async def test_a_restarted_service_continues_the_jobs_trace_without_tracing_its_catch_up(bus: Bus) -> None:
    before, after = InMemorySpanExporter(), InMemorySpanExporter()
    api = _tracing("api", before)
    with api.command("submit", "job-1") as headers:
        submit = SubmitJob(id="s1", ts=2.0, source="api", job_id="job-1", spec=JobSpec(team="t", queue="q", gpus=1))
        await bus.publish([*setup_events(), submit], [None, None, headers])
    first = Reactor(bus, DeciderHandler(AdmissionDecider()), fetch_timeout=0.2, tracing=_tracing("admission", before))
    await first.start()
    while await bus.ack_floor("admission") < 3:  # the submission handled and acknowledged
        await first.step()
    assert first.tracing is not None
    first.tracing.shutdown()
    api.shutdown()
    trace_id = before.get_finished_spans()[0].context.trace_id

    tracing = _tracing("admission", after)
    restarted = Reactor(bus, DeciderHandler(AdmissionDecider()), fetch_timeout=0.2, tracing=tracing)
    await restarted.start()
    tracing.force_flush()
    assert after.get_finished_spans() == ()  # the catch-up re-derived what was traced already
    # A command without a trace context (e.g. published by a script): the job's trace goes on all the same.
    await bus.publish([CancelJob(id="c1", ts=3.0, source="script", job_id="job-1")])
    cancel_seq, deadline = await bus.last_seq(), time.monotonic() + 20.0
    while restarted.last_seq < cancel_seq:  # one fetch may come back empty on a loaded machine
        assert time.monotonic() < deadline, "the cancel was never handled"
        await restarted.step()
    tracing.shutdown()

    spans = after.get_finished_spans()
    assert {s.name for s in spans} == {"admission CancelJob", "admission decide JobCancelled"}
    assert {s.context.trace_id for s in spans} == {trace_id}
    cancelled = [m for m in await log_messages(bus) if isinstance(decode(m.data), JobCancelled)]
    assert len(cancelled) == 1
    assert (cancelled[0].headers or {})["traceparent"].split("-")[1] == f"{trace_id:032x}"
