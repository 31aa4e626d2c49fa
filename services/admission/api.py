"""The public HTTP API. Writes become commands on the bus; reads come from the Redis read models.

A submission is checked at once with the same `validate` the admission core applies to the logged
command, so the caller gets its 4xx (with the reason code) immediately and the log agrees. One only a change of
policy could serve (over its queue's ceiling or user limit, no quota of its models) is accepted, and its answer
carries the reason it waits for (`reason`, `message`), the one quota tells it. Until a first
node has registered, the cluster's capacity is unknown: a submission is then answered 503 `not_ready` with
Retry-After, so that the caller retries once it can be checked. An accepted submission opens the job's
trace: its `SubmitJob` carries the `traceparent` every later hop continues.

An idempotency key names one job (libs/core/admission/idempotency_keys.py): the same key and spec again answer 200 with
that job as it stands (its stored spec and current state); the same key with another spec answers 409
`idempotency_key_reused`, naming the fields that differ.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import msgspec
from aiohttp import web

from contracts import CancelJob, JobSpec, SubmitJob
from contracts.views import FINAL_JOB_STATES, JOB_STATES, JobCreated, JobView
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.idempotency_keys import Resubmission, job_id_for_key, key_reused, spec_fingerprint
from libs.core.admission.validation import validate
from libs.core.kernel.decider import derived_id
from libs.core.kernel.inadmissible import waits_by_policy
from libs.runtime.http import HttpError, check_query, decode_body, error_response, json_response
from libs.telemetry.tracing import ServiceTracing, current_tracing
from libs.views.explain import explain
from libs.views.store import ViewStore
from services.admission.auth import (
    CLUSTER_READERS,
    JOB_READERS,
    JOB_WRITERS,
    Principal,
    require,
    require_team,
)
from services.admission.in_flight import InFlight
from services.admission.openapi import openapi_document

API = "api"
_spec_decoder = msgspec.json.Decoder(JobSpec)
_LIST_PARAMETERS = frozenset({"queue", "state", "team", "limit", "offset"})
# Redis indexes sorted sets with signed 64-bit integers; an offset beyond this would be a server error.
_MAX_OFFSET = 1 << 60
# The admission core's states of a job, as the API names them (it does not follow a job's runs: a job it has
# admitted is "pending" to it until the read model says more).
_DECIDED_STATES = {"submitted": "pending", "admitted": "pending", "rejected": "rejected", "cancelled": "cancelled",
                   "succeeded": "succeeded", "failed": "failed"}


def require_inventory(decider: AdmissionDecider) -> None:
    """503 with Retry-After while no node has registered: what the cluster can hold is not known yet."""
    if not decider.state.inventory.known:
        raise HttpError(503, "not_ready", "no node has registered yet: the cluster's capacity is unknown; "
                        "try again shortly", {"Retry-After": "1"})


class JobsApi:
    def __init__(self, bus: Bus, decider: AdmissionDecider, store: ViewStore,
                 tracing: ServiceTracing | None = None) -> None:
        self.bus = bus
        self.decider = decider
        self.store = store
        # None: the process's tracing (the admission reactor's, so API and reactor share the jobs' contexts).
        self._tracing = tracing
        self._openapi = msgspec.json.encode(openapi_document())
        self._in_flight = InFlight(decider.state.jobs)

    @property
    def tracing(self) -> ServiceTracing | None:
        return self._tracing or current_tracing()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/jobs", self.submit)
        app.router.add_get("/v1/jobs", self.list_jobs)
        app.router.add_get("/v1/jobs/{job_id}", self.get_job)
        app.router.add_get("/v1/jobs/{job_id}/explain", self.explain)
        app.router.add_delete("/v1/jobs/{job_id}", self.cancel)
        app.router.add_get("/v1/nodes", self.nodes)
        app.router.add_get("/v1/usage", self.usage)
        app.router.add_get("/openapi.json", self.openapi)

    async def submit(self, request: web.Request) -> web.Response:
        who = require(request, JOB_WRITERS, "submitting a job")
        spec = decode_body(await request.read(), _spec_decoder)
        require_team(who, spec.team, "submit jobs")
        if spec.idempotency_key:
            job_id = job_id_for_key(spec.team, spec.idempotency_key)
            again = self._resubmission(job_id, spec)
            if again is not None:
                return await self._answer_again(again, spec)
            # The command's id names the spec too: should another API process publish this key with another spec
            # at the same moment, the server's de-duplication must not drop it silently; the core refuses it.
            command_id = derived_id(API, "submit", job_id, spec_fingerprint(spec))
        else:
            job_id = str(uuid.uuid4())
            command_id = derived_id(API, "submit", job_id)
        require_inventory(self.decider)
        rejection = validate(spec, self.decider.state.policy, self.decider.state.inventory)
        if rejection is not None:
            return error_response(422, rejection.code, rejection.message)
        command = SubmitJob(id=command_id, ts=time.time(), source=API, correlation_id=job_id, job_id=job_id,
                            spec=spec)
        if spec.idempotency_key:
            self._in_flight.add(command)  # before the publish yields: a request meanwhile sees it
        try:
            await self._publish_traced(command, "submit", job_id, request.headers)
        except BaseException:
            self._in_flight.discard(job_id)
            raise
        waits = waits_by_policy(spec, self.decider.state.policy)
        reason, message = (waits[0], waits[1]) if waits is not None else ("", "")
        return json_response(JobCreated(id=job_id, state="pending", spec=spec, reason=reason, message=message),
                             status=201, headers={"Location": f"/v1/jobs/{job_id}"})

    def _resubmission(self, job_id: str, spec: JobSpec) -> Resubmission | None:
        """The job that already holds this key, decided by the core or only published by this API."""
        again = self.decider.resubmission(job_id, spec)
        if again is None and (pending := self._in_flight.get(job_id)) is not None:
            again = Resubmission(job_id, spec_fingerprint(pending) == spec_fingerprint(spec))
        return again

    async def _answer_again(self, again: Resubmission, spec: JobSpec) -> web.Response:
        """200 with the key's job as it stands (its stored spec and current state), or 409 naming what differs.
        The job is the caller's team's: its id (or key) is derived from that team."""
        view = await self.store.job(again.job_id)
        stored = ((view.spec if view is not None else None) or self.decider.state.specs.get(again.job_id)
                  or self._in_flight.get(again.job_id))
        if not again.same:
            refusal = key_reused(again, stored, spec)
            return error_response(409, refusal.code, refusal.message)
        in_flight = self._in_flight.command(again.job_id)
        if in_flight is not None:
            # The first attempt's publish may still fail: the retry publishes the same command (the same id,
            # so the server keeps one), and is told the job exists only once the log holds it.
            await self.bus.publish([in_flight])
        answer = JobCreated(id=again.job_id, state=self._state(again.job_id, view), duplicate=True, spec=stored or spec)
        return json_response(answer, status=200, headers={"Location": f"/v1/jobs/{again.job_id}"})

    def _state(self, job_id: str, view: JobView | None) -> str:
        """The job's current state: the read model's, unless admission already knows it ended (the read model
        trails the log) or the read model has no view of it yet."""
        decided = _DECIDED_STATES.get(self.decider.state.jobs.get(job_id, ""))
        if view is not None and view.state and (view.state in FINAL_JOB_STATES or decided not in FINAL_JOB_STATES):
            return view.state
        return decided or "pending"

    def _team_of(self, job_id: str, view: JobView) -> str:
        """The job's team: from its view, else from admission's own fold ("" when neither knows it yet)."""
        return view.team or self.decider.state.job_team.get(job_id, "")

    def _decided(self, job_id: str) -> JobView | None:
        """A job decided but not yet projected into the read model, from admission's own state."""
        state = self.decider.state.jobs.get(job_id)
        if state is None:
            return None
        return JobView(id=job_id, state=_DECIDED_STATES.get(state, "pending"),
                       team=self.decider.state.job_team.get(job_id, ""), queue="", phase=state,
                       spec=self.decider.state.specs.get(job_id))

    async def _job(self, who: Principal, job_id: str, projected_only: bool = False) -> JobView:
        """The job as this caller may see it. Another team's job is 404 exactly like a missing one, so that a
        submitter cannot even learn which ids are taken."""
        view = await self.store.job(job_id)
        if view is None and not projected_only:
            view = self._decided(job_id)
        if view is None or not who.sees(self._team_of(job_id, view)):
            raise HttpError(404, "unknown_job", f"job {job_id} not found")
        return view

    async def get_job(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "reading jobs")
        return json_response(await self._job(who, request.match_info["job_id"]))

    async def explain(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "explaining a job")
        view = await self._job(who, request.match_info["job_id"], projected_only=True)
        queue = next((q for q in await self.store.queues() if q.name == view.queue), None)
        cluster_running = await self.store.jobs(state="running", limit=100_000)
        queue_running = [j for j in cluster_running if j.queue == view.queue]
        answer = explain(view, queue, queue_running, cluster_running, await self.store.nodes(), time.time())
        return json_response(answer)

    async def list_jobs(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "listing jobs")
        check_query(request, _LIST_PARAMETERS)
        q = request.query
        state = q.get("state", "")
        if state and state not in JOB_STATES:
            return error_response(400, "unknown_state", f"state must be one of {', '.join(JOB_STATES)}")
        try:
            limit = int(q.get("limit", "1000"))
            offset = int(q.get("offset", "0"))
        except ValueError:
            return error_response(400, "invalid_paging", "limit and offset must be integers")
        if limit < 0 or offset < 0:
            return error_response(400, "invalid_paging", "limit and offset must be >= 0")
        if offset > _MAX_OFFSET:  # past any list there can be (and past what Redis can index): nothing
            return json_response([])
        team = q.get("team", "")
        if who.team_scope is not None:  # a submitter's list holds its own team's jobs only
            if team not in ("", who.team_scope):
                return json_response([])
            team = who.team_scope
        views = await self.store.jobs(queue=q.get("queue", ""), state=state, team=team,
                                      limit=min(limit, 100_000), offset=offset)
        return json_response(views)

    async def cancel(self, request: web.Request) -> web.Response:
        who = require(request, JOB_WRITERS, "cancelling a job")
        job_id = request.match_info["job_id"]
        # A submitter's cancel names its team: the admission core refuses it for another team's job too.
        team = who.team_scope or ""
        refusal = self.decider.cancel_refusal(job_id, team=team)
        if refusal is not None:
            return error_response(404 if refusal.code == "unknown_job" else 409, refusal.code, refusal.message)
        command = CancelJob(id=derived_id(API, "cancel", job_id), ts=time.time(), source=API,
                            correlation_id=job_id, job_id=job_id, team=team)
        await self._publish_traced(command, "cancel", job_id, request.headers)
        return json_response(JobCreated(id=job_id, state="cancelling"), status=202)

    async def _publish_traced(self, command: SubmitJob | CancelJob, action: str, job_id: str,
                              request_headers: Mapping[str, str]) -> None:
        """Publish a command about a job, under a span `"admission {action}"` whose context it carries (a
        submission's span is the job's root, unless the caller's request carried a traceparent)."""
        tracing = self.tracing
        if tracing is None:
            await self.bus.publish([command])
            return
        with tracing.command(action, job_id, request_headers) as headers:
            await self.bus.publish([command], [headers])

    async def nodes(self, request: web.Request) -> web.Response:
        require(request, CLUSTER_READERS, "reading nodes")
        return json_response(await self.store.nodes())

    async def usage(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "reading usage")
        return json_response([u for u in await self.store.usage() if who.sees(u.team)])

    async def openapi(self, _: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")
