"""OpenTelemetry traces: one trace per job lifecycle, across every service, carried in NATS message headers
as a W3C `traceparent`.

Tracing lives in the shell only (reactor, bus, HTTP API, executor): the decision core never sees it, so it
cannot change a decision nor an event's bytes; the context travels in headers, never in the payload.

- The admission API opens the job's root span and its `SubmitJob` carries the context.
- The reactor wraps each consumed event that concerns a job in a span `"{service} {EventType}"`, child of
  the context its message carried (or, when it carried none, of the last context this service saw for the
  job); each decision about a job gets a short span `"{service} decide {DecisionType}"` whose context goes
  out as that decision's `traceparent`, so the next service's span hangs under it.
- Decisions published outside a consumed event (the simulated executor's timers) continue the last context
  the service saw for their job (`headers_for`).

`setup_tracing(service, "none")` returns None: callers then skip tracing with one None check, and no SDK
provider exists, so the platform's throughput does not move.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from contracts import JobFinished, JobRejected
from contracts.events import EventBase

if TYPE_CHECKING:  # the SDK is imported only when an exporter is chosen
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

Headers = dict[str, str]
EXPORTERS = ("none", "console", "otlp")
# How many jobs' last trace contexts a service keeps: enough for every job in flight on a large cluster,
# bounded so that a long-running service does not grow without end.
JOBS_REMEMBERED = 100_000
# After these a job has nothing more to trace in any service.
FINAL_EVENTS = (JobFinished, JobRejected)

# W3C trace context only: whatever OTEL_PROPAGATORS says, the headers between our services keep one format.
_propagator = TraceContextTextMapPropagator()
_current: ServiceTracing | None = None


def job_of(event: EventBase) -> str | None:
    """The job an event concerns: its `job_id`, or the job a preemption was decided for."""
    job: str | None = getattr(event, "job_id", None)
    if job is None:
        job = getattr(event, "preemptor_id", None)
    return job


def extract(carrier: Mapping[str, str] | None) -> Context | None:
    """The context that message headers carry; None when they carry none (or a malformed one)."""
    if not carrier:
        return None
    ctx = _propagator.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def inject(span_context: SpanContext) -> Headers:
    """The headers (`traceparent`, and `tracestate` when set) that carry `span_context` to the next hop."""
    carrier: Headers = {}
    _propagator.inject(carrier, context=_as_context(span_context))
    return carrier


def _as_context(span_context: SpanContext) -> Context:
    return trace.set_span_in_context(NonRecordingSpan(span_context), Context())


class ServiceTracing:
    """One service's tracer and its memory of the last trace context it saw for each job."""

    def __init__(self, service: str, provider: TracerProvider) -> None:
        self.service = service
        self.provider = provider
        self.tracer = provider.get_tracer("gpusched")
        self._jobs: OrderedDict[str, SpanContext] = OrderedDict()

    # --- the reactor -------------------------------------------------------------------------------

    def on_event(self, carrier: Mapping[str, str] | None, seq: int, event: EventBase,
                 decide: Callable[[], list[EventBase]]) -> tuple[list[EventBase], list[Headers | None]]:
        """Run `decide` for a consumed event, under its span when it concerns a job; returns the decisions
        and, parallel to them, the headers each is to be published with."""
        job = job_of(event)
        if job is None:  # a tick, an inventory or policy change: decisions about jobs continue their traces
            decisions = decide()
            return decisions, self.headers_for(decisions)
        parent = extract(carrier) or self._context_of(job) or Context()
        with self.tracer.start_as_current_span(
            f"{self.service} {type(event).__name__}", context=parent, kind=SpanKind.CONSUMER,
            attributes={**self._attributes(job), "gpusched.seq": seq, "messaging.message.id": event.id},
        ) as span:
            here = span.get_span_context()
            self._remember(job, here)
            decisions = decide()
            headers = [self._decision_headers(d, job, here) for d in decisions]
        if isinstance(event, FINAL_EVENTS):
            self._jobs.pop(job, None)
        return decisions, headers

    def recall(self, carrier: Mapping[str, str] | None, event: EventBase) -> None:
        """Start-up catch-up: no span (it was traced the first time), but remember the job's context that the
        message carried, so that a restarted service's later decisions still continue the job's trace."""
        job = job_of(event)
        if job is None:
            return
        if isinstance(event, FINAL_EVENTS):
            self._jobs.pop(job, None)
            return
        ctx = extract(carrier)
        if ctx is not None:
            self._remember(job, trace.get_current_span(ctx).get_span_context())

    def headers_for(self, events: Sequence[EventBase]) -> list[Headers | None]:
        """Headers for events published without a consumed trigger (timers, start-up): each continues the
        last trace this service saw for its job."""
        return [self._decision_headers(e, None, None) for e in events]

    def _decision_headers(self, decision: EventBase, trigger_job: str | None,
                          trigger: SpanContext | None) -> Headers | None:
        job = job_of(decision)
        if job is None:
            return None
        parent = trigger if job == trigger_job else self._jobs.get(job)
        if parent is None:
            # A job this service holds no trace for (e.g. since a restart): the next service continues
            # the job's trace from its own memory rather than this one starting a second trace.
            return None
        span = self.tracer.start_span(
            f"{self.service} decide {type(decision).__name__}", context=_as_context(parent),
            kind=SpanKind.PRODUCER, attributes={**self._attributes(job), "messaging.message.id": decision.id},
        )
        span.end()
        here = span.get_span_context()
        self._remember(job, here)
        return inject(here)

    # --- commands from outside the log (the HTTP API) -------------------------------------------------

    @contextmanager
    def command(self, name: str, job: str, carrier: Mapping[str, str] | None = None) -> Iterator[Headers]:
        """A span `"{service} {name}"` around a command published for `job`; yields the command's headers.

        Its parent is the caller's context when the request carried one, else the job's last known context;
        a new job's submission so opens the job's trace."""
        parent = extract(carrier) or self._context_of(job) or Context()
        with self.tracer.start_as_current_span(f"{self.service} {name}", context=parent, kind=SpanKind.SERVER,
                                               attributes=self._attributes(job)) as span:
            here = span.get_span_context()
            self._remember(job, here)
            yield inject(here)

    # --- the job -> context memory -----------------------------------------------------------------------

    def _context_of(self, job: str) -> Context | None:
        known = self._jobs.get(job)
        return None if known is None else _as_context(known)

    def _remember(self, job: str, span_context: SpanContext) -> None:
        self._jobs[job] = span_context
        self._jobs.move_to_end(job)
        if len(self._jobs) > JOBS_REMEMBERED:
            self._jobs.popitem(last=False)

    def _attributes(self, job: str) -> dict[str, AttributeValue]:
        return {"gpusched.job_id": job, "gpusched.service": self.service, "messaging.system": "nats"}

    # --- lifecycle ----------------------------------------------------------------------------------------

    def force_flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Export what is buffered and stop; the process's current tracing is cleared if it was this one."""
        global _current
        self.provider.shutdown()
        if _current is self:
            _current = None


def setup_tracing(service: str, exporter: str | SpanExporter = "none") -> ServiceTracing | None:
    """The service's tracing, also made the process's current one (for the HTTP API and the executor's
    timers, which publish outside the reactor); None for exporter "none".

    `exporter`: "none", "console" (spans as JSON on stdout), "otlp" (OTLP over HTTP to
    OTEL_EXPORTER_OTLP_ENDPOINT, default http://localhost:4318), or a SpanExporter (tests)."""
    global _current
    span_exporter = _make_exporter(exporter)
    if span_exporter is None:
        _current = None
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"gpusched-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    _current = ServiceTracing(service, provider)
    return _current


def current_tracing() -> ServiceTracing | None:
    """The tracing `setup_tracing` set up for this process; None when tracing is off."""
    return _current


def _make_exporter(kind: str | SpanExporter) -> SpanExporter | None:
    if not isinstance(kind, str):
        return kind
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp":
        # Imported only when chosen: it brings protobuf and an HTTP client along.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    raise ValueError(f"trace exporter must be one of {', '.join(EXPORTERS)}, not {kind!r}")
