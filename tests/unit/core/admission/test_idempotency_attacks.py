"""Attacks on idempotency keys (libs/core/admission/idempotency_keys.py, libs/core/admission/decider.py,
services/admission/api.py,
services/admission/in_flight.py): sequences of submissions that break a promise of docs/DESIGN.md's
"Invariants". Each test is one finding and fails for the reason its docstring gives.

The API tests run the real `JobsApi` handlers on an in-memory bus: what the API publishes goes through the
log's codec into a real `AdmissionDecider` (the core the API consults), as the bus and the reactor would do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
from aiohttp.test_utils import TestClient, TestServer

from contracts import EventBase, JobRejected, JobSpec, SubmitJob
from contracts.codec import decode, encode
from contracts.views import JobView
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.idempotency_keys import job_id_for_key, refused_id
from libs.runtime.http import base_app
from libs.views.store import ViewStore
from services.admission.api import JobsApi
from tests.unit.builders import EventFeed, brief, node, queue

# --- the pure core, as the bus feeds it ---------------------------------------------------------------


def admission(*queues: Any) -> EventFeed:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*(queues or (queue("ml-train", "ml", 8), queue("cv-train", "cv", 4))))
    feed.nodes(node("a", 8, "A100"))
    return feed


def wire_submit(feed: EventFeed, job_id: str, spec_json: bytes) -> list[EventBase]:
    """A producer's SubmitJob as the admission core receives it: decoded from the bytes on the bus."""
    spec = msgspec.json.decode(spec_json, type=JobSpec)
    command = SubmitJob(id=f"cmd-{len(feed.log)}", ts=feed.now, source="producer", correlation_id=job_id,
                        job_id=job_id, spec=spec)
    return feed.deliver(decode(encode(command)))


def test_a_retry_that_spells_out_the_default_priority_is_refused_as_a_reused_key() -> None:
    """Guarantee: a retried identical submission is never refused (DESIGN "no job lost or duplicated").

    `spec_fingerprint` claims to be "equal for equal specs however they were built", but JobSpec has
    `omit_defaults=True` and msgspec omits a default only when the value *is* the default object. A string
    default that arrives from JSON (`"priority": "training"`, `"workload": "training"`: what a job file, a
    `--priority training` flag or any client that writes every field sends) is another object, so it stays in
    the encoding and the fingerprint differs from the same spec with the field left out. The retry is refused
    with `idempotency_key_reused` and "fields that differ: none"."""
    feed = admission()
    first = wire_submit(feed, "j1", b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-7"}')
    assert brief(first) == [("JobSubmitted", "j1"), ("JobAdmitted", "j1")]

    retry = wire_submit(feed, "j1", b'{"team":"ml","queue":"ml-train","priority":"training",'
                                    b'"idempotency_key":"nightly-7"}')
    assert retry == [], (f"an identical retry (the default priority written out) was refused: "
                         f"{[(type(d).__name__, getattr(d, 'code', ''), getattr(d, 'message', '')) for d in retry]}")


def test_a_refusal_recorded_under_its_own_id_takes_a_key_no_job_ever_held() -> None:
    """Guarantee: no job lost; one key -> at most one job, and a key no job holds makes a job.

    A producer that reuses a job id for another key (ids from a counter that restarted, say) is rightly refused:
    the refusal is recorded as `JobRejected(refused_id(j1, spec))`. But the core folds that JobRejected into the
    book of keys like any decided job (`KeyBook.decided` -> `holders.setdefault`), so the refusal record now
    "holds" key `nightly-8`, which no job ever held. The producer's correct submission of `nightly-8` under a
    fresh id is then refused as "belongs to job <refused record>, submitted with this same spec: that job is
    this submission (follow it ...)": it follows a rejected record and the job never runs. (Over HTTP the same
    key answers 200 `duplicate` with that record's id and state `rejected`.)"""
    feed = admission()
    wire_submit(feed, "j1", b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-7"}')
    mistaken = b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-8"}'
    [refused] = wire_submit(feed, "j1", mistaken)  # j1 is taken: refused, j1 untouched (as designed)
    assert isinstance(refused, JobRejected) and refused.job_id == refused_id("j1", refused.spec)  # type: ignore[arg-type]

    decisions = wire_submit(feed, "j2", mistaken)  # the same spec under an id of its own: a new job
    assert brief(decisions) == [("JobSubmitted", "j2"), ("JobAdmitted", "j2")], (
        f"key 'nightly-8' was never held by a job, yet its first real submission got "
        f"{[(type(d).__name__, getattr(d, 'message', '')) for d in decisions]}")


# --- the HTTP API over the real core ------------------------------------------------------------------


@dataclass
class HangingBus:
    """What the API publishes; `hold` makes the next publish wait until released, then fail (a stream that
    does not answer within the publish's retry window, libs/bus/jetstream.py FAILOVER_WAIT_S)."""

    config: BusConfig = field(default_factory=lambda: BusConfig(subject_prefix="t"))
    published: list[EventBase] = field(default_factory=list)
    hold: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish(self, events: Sequence[EventBase], headers: Any = None) -> None:
        if self.hold is not None:
            hold, self.hold = self.hold, None
            self.entered.set()
            await hold.wait()
            raise TimeoutError("the stream did not answer")
        self.published.extend(events)


class NoViews:
    """The read model has not projected anything yet (it trails the log)."""

    async def job(self, job_id: str) -> JobView | None:
        return None


@dataclass
class Api:
    client: TestClient
    bus: HangingBus
    feed: EventFeed

    async def post(self, body: bytes) -> tuple[int, Any]:
        resp = await self.client.post("/v1/jobs", data=body, headers={"Content-Type": "application/json"})
        return resp.status, await resp.json()

    def decide(self) -> list[EventBase]:
        """The admission core consumes what the API published (through the log's codec)."""
        out: list[EventBase] = []
        for command in self.bus.published:
            out += self.feed.deliver(decode(encode(command)))
        self.bus.published.clear()
        return out


@asynccontextmanager
async def api(feed: EventFeed) -> AsyncIterator[Api]:
    decider = feed.deciders[0]
    assert isinstance(decider, AdmissionDecider)
    bus = HangingBus()
    app = base_app("admission", lambda: True)
    JobsApi(cast(Bus, bus), decider, cast(ViewStore, NoViews())).routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield Api(client, bus, feed)
    finally:
        await client.close()


async def test_the_api_answers_409_to_an_identical_retry_that_writes_a_default_out() -> None:
    """Guarantee: a retried identical submission is never refused; same key and spec answer 200 with the job.

    Same root cause as the core test above (the fingerprint keeps a default string written out), seen by a
    user: `gpusched submit --key k ...`, the answer is lost, the retry comes from a job file that says
    `workload: training` (the default). The API answers 409 `idempotency_key_reused` whose message names no
    differing field at all ("fields that differ: none")."""
    async with api(admission()) as a:
        status, created = await a.post(b'{"team":"ml","queue":"ml-train","idempotency_key":"train-7"}')
        assert status == 201
        a.decide()
        status, again = await a.post(b'{"team":"ml","queue":"ml-train","workload":"training",'
                                     b'"idempotency_key":"train-7"}')
        assert (status, again.get("id")) == (200, created["id"]), f"identical retry answered {status}: {again}"


async def test_a_retry_answered_200_while_the_first_publish_hangs_names_a_job_that_is_never_made() -> None:
    """Guarantee: no job lost; "the answer carries ... the true state".

    The API puts a keyed submission in `InFlight` before publishing; a retry that arrives meanwhile is answered
    200 `duplicate` ("pending") from that book. If the first publish then fails (a stream that does not answer
    within the 30 s retry window, while the CLI's client gives up after 10 s and retries), the first request is
    a 500 and the entry is discarded, but the retry's caller was already told the job exists. Nothing was
    published: the job the caller follows is never made, and it is 404 from then on."""
    async with api(admission()) as a:
        body = b'{"team":"ml","queue":"ml-train","idempotency_key":"train-8"}'
        job_id = job_id_for_key("ml", "train-8")
        release = a.bus.hold = asyncio.Event()
        first = asyncio.ensure_future(a.post(body))
        await asyncio.wait_for(a.bus.entered.wait(), 5)  # the first request is publishing

        status, retry = await a.post(body)  # the caller's retry (its first attempt timed out)
        release.set()
        first_status, _ = await first
        decided = a.decide()

        assert first_status == 500  # the first attempt failed, as its caller may never learn
        told_exists = status == 200 and retry.get("id") == job_id
        exists = job_id in cast(AdmissionDecider, a.feed.deciders[0]).state.jobs or any(
            getattr(d, "job_id", "") == job_id for d in decided)
        assert not told_exists or exists, (f"the retry was answered {status} {retry}, but no SubmitJob for "
                                           f"{job_id} was ever published: the job is lost")


async def test_a_key_of_one_team_is_refused_because_another_team_s_key_derives_the_same_job_id() -> None:
    """Guarantee: one key of a team -> at most one job of that team, and a first submission is never refused
    (and another team's job cannot even be seen: the API hides which ids are taken).

    `job_id_for_key` is `derived_id("job", team, key)`, a uuid5 of "job/<team>/<key>": team "ml/nlp" with key
    "run-1" and team "ml" with key "nlp/run-1" give the same job id (team and queue names are not restricted,
    keys are free text). Team ml's first ever use of its key is answered 409 `idempotency_key_reused`, and the
    message shows the other team's stored spec (its team, queue, command)."""
    feed = admission(queue("ml-train", "ml", 8), queue("nlp", "ml/nlp", 4))
    async with api(feed) as a:
        status, _ = await a.post(b'{"team":"ml/nlp","queue":"nlp","command":["secret","--token=abc"],'
                                 b'"idempotency_key":"run-1"}')
        assert status == 201
        a.decide()
        status, answer = await a.post(b'{"team":"ml","queue":"ml-train","idempotency_key":"nlp/run-1"}')
        assert status == 201, f"team ml's first submission of its key was answered {status}: {answer}"


async def test_over_http_the_key_a_refusal_took_answers_200_with_a_rejected_job_that_never_was() -> None:
    """Guarantee: no job lost (the HTTP face of the refusal that takes a key, above).

    After a bus producer's mistaken reuse of job id j1 with key `nightly-8` (refused, rightly), the first HTTP
    submission of `nightly-8` is answered 200 `duplicate` naming the refusal's record, state `rejected`: the
    caller is told its job exists and was rejected, and no job is ever made for the key."""
    feed = admission()
    wire_submit(feed, "j1", b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-7"}')
    wire_submit(feed, "j1", b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-8"}')
    async with api(feed) as a:
        status, answer = await a.post(b'{"team":"ml","queue":"ml-train","idempotency_key":"nightly-8"}')
        assert (status, answer.get("id")) == (201, job_id_for_key("ml", "nightly-8")), (
            f"the first HTTP submission of a key no job held was answered {status} {answer}")
