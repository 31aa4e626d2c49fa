"""With the trace exporter "none" (the default) tracing costs nothing: no SDK provider, no span, and every
message goes out with its Nats-Msg-Id alone, even when the message it reacts to carried a traceparent."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from contracts import (
    EventBase,
    GpuSpec,
    JobFinished,
    JobSpec,
    NodeRegistered,
    NodeSpec,
    QueuePolicyChanged,
    QueueSpec,
    SubmitJob,
)
from contracts.codec import encode
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.reactor import Reactor
from libs.runtime.settings import Settings
from libs.sim.live_executor import SimExecutor
from libs.telemetry.tracing import current_tracing, setup_tracing
from services.admission.api import JobsApi

# A traceparent an upstream producer might have sent.
UPSTREAM = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@dataclass
class FakeJetStream:
    """Records what would have been published, with its headers."""

    sent: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        self.sent.append((subject, payload, headers))

    async def publish_async(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[None]:
        self.sent.append((subject, payload, headers))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class FakeNats:
    def __init__(self) -> None:
        self.js = FakeJetStream()

    def jetstream(self, timeout: float) -> FakeJetStream:
        return self.js


def fake_bus() -> tuple[Bus, FakeJetStream]:
    nc = FakeNats()
    return Bus(nc, BusConfig()), nc.js  # type: ignore[arg-type]


def setup_events() -> list[EventBase]:
    return [
        QueuePolicyChanged(id="q1", ts=1.0, source="operator", queue=QueueSpec(name="q", team="t", nominal_gpus=8),
                           version=1),
        NodeRegistered(id="n1", ts=1.0, source="node-telemetry",
                       node=NodeSpec(name="n1", gpus=tuple(GpuSpec(index=i, model="A100") for i in range(8)))),
    ]


def message(bus: Bus, seq: int, event: EventBase, headers: dict[str, str] | None = None) -> Any:
    """What the reactor reads of a JetStream message."""
    sequence = SimpleNamespace(stream=seq, consumer=seq)

    async def ack() -> None:
        return None

    return SimpleNamespace(subject=bus.subject_for_type(type(event)), data=encode(event), headers=headers,
                           metadata=SimpleNamespace(sequence=sequence), ack=ack)


class SpanWatchingHandler(DeciderHandler):
    """The admission handler, noting whether a span was current while it decided."""

    def __init__(self) -> None:
        super().__init__(AdmissionDecider())
        self.spans_seen: list[bool] = []

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        self.spans_seen.append(trace.get_current_span().get_span_context().is_valid)
        return super().on_event(seq, event)


def test_none_sets_up_nothing() -> None:
    assert setup_tracing("quota", "none") is None
    assert current_tracing() is None
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)  # no SDK provider anywhere
    assert Settings(service="quota").trace_exporter == "none"


def test_the_exporter_comes_from_the_environment_and_a_wrong_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_TRACE_EXPORTER", " OTLP ")
    assert Settings.from_env("quota").trace_exporter == "otlp"
    monkeypatch.setenv("GPUSCHED_TRACE_EXPORTER", "")
    assert Settings.from_env("quota").trace_exporter == "none"
    with pytest.raises(ValueError, match="none, console, otlp"):
        setup_tracing("quota", "jaeger")


async def test_the_reactor_without_tracing_records_nothing_and_adds_no_header() -> None:
    bus, js = fake_bus()
    handler = SpanWatchingHandler()
    reactor = Reactor(bus, handler, tracing=setup_tracing("admission", "none"))
    submit = SubmitJob(id="s1", ts=2.0, source="api", job_id="job-1", spec=JobSpec(team="t", queue="q", gpus=1))
    msgs = [message(bus, i + 1, e) for i, e in enumerate(setup_events())]
    await reactor.process([*msgs, message(bus, 3, submit, UPSTREAM)])

    assert handler.spans_seen == [False, False, False]
    assert len(js.sent) == 2  # JobSubmitted, JobAdmitted
    assert all(set(headers) == {"Nats-Msg-Id"} for _, _, headers in js.sent)


async def test_the_executors_reports_and_the_api_add_no_header() -> None:
    bus, js = fake_bus()
    await SimExecutor(bus)._publish([JobFinished(id="f1", ts=3.0, source="sim-executor", job_id="job-1")])

    decider = AdmissionDecider()
    for seq, event in enumerate(setup_events(), start=1):
        DeciderHandler(decider).on_event(seq, event)
    app = web.Application()
    JobsApi(bus, decider, store=None).routes(app)  # type: ignore[arg-type]  # submit reads no view
    async with TestClient(TestServer(app)) as api:
        resp = await api.post("/v1/jobs", json={"team": "t", "queue": "q", "gpus": 1}, headers=UPSTREAM)
        assert resp.status == 201, await resp.text()

    assert len(js.sent) == 2
    assert all(set(headers) == {"Nats-Msg-Id"} for _, _, headers in js.sent)
