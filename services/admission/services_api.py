"""The inference services API: deploy (or update), list, show, delete, and report load.

Every write is a command on the bus (`DeployService`, `DeleteService`, `ReportServiceLoad`) decided by the
admission core, so scale decisions are audited and replayed like any other. A deployment is checked at once
with the same rules the core applies, so the caller gets its 4xx with the reason code (503 `not_ready` until
a first node has registered, as for jobs). Reads come from the admission core's own fold: it is the one that
decides the services' replicas.
"""

from __future__ import annotations

import math
import time
import uuid

import msgspec
from aiohttp import web

from contracts import DeleteService, DeployService, ReportServiceLoad, ServiceSpec
from contracts.views import LoadReport, ServiceAccepted, ServiceView
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.inference_services import METRICS, ServiceState
from libs.runtime.http import HttpError, decode_body, error_response, json_response
from services.admission.api import require_inventory
from services.admission.auth import JOB_READERS, JOB_WRITERS, require, require_team

API = "api"
_service_decoder = msgspec.json.Decoder(ServiceSpec)
_load_decoder = msgspec.json.Decoder(LoadReport)


def service_view(state: ServiceState) -> ServiceView:
    spec = state.spec
    return ServiceView(name=spec.name, team=spec.replica.team, queue=spec.replica.queue,
                       priority=spec.replica.priority, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                       desired_replicas=state.desired, ready_replicas=state.ready, replicas=len(state.replicas),
                       load=state.load, metric=spec.autoscaling.metric if spec.autoscaling else "", spec=spec)


class ServicesApi:
    def __init__(self, bus: Bus, decider: AdmissionDecider) -> None:
        self.bus = bus
        self.decider = decider

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/services", self.deploy)
        app.router.add_get("/v1/services", self.list_services)
        app.router.add_get("/v1/services/{name}", self.show)
        app.router.add_delete("/v1/services/{name}", self.delete)
        app.router.add_post("/v1/services/{name}/load", self.load)

    def _state(self, name: str) -> ServiceState:
        state = self.decider.state.services.services.get(name)
        if state is None:
            raise HttpError(404, "unknown_service", f"service {name!r} does not exist")
        return state

    async def deploy(self, request: web.Request) -> web.Response:
        who = require(request, JOB_WRITERS, "deploying a service")
        spec = decode_body(await request.read(), _service_decoder)
        require_team(who, spec.replica.team, "deploy services")
        require_inventory(self.decider)
        refusal = self.decider.service_refusal(spec)
        if refusal is not None:
            status = 409 if refusal.code in ("service_exists", "replica_spec_changed") else 422
            return error_response(status, refusal.code, refusal.message)
        existed = spec.name in self.decider.state.services.services
        command = DeployService(id=new_command_id(), ts=time.time(), source=API, correlation_id=spec.name,
                                service=spec)
        await self.bus.publish([command])
        return json_response(ServiceAccepted(name=spec.name, state="updating" if existed else "deploying"),
                             status=200 if existed else 201, headers={"Location": f"/v1/services/{spec.name}"})

    async def list_services(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "listing services")
        views = [service_view(s) for _, s in sorted(self.decider.state.services.services.items())
                 if not who.team_scope or s.spec.replica.team == who.team_scope]
        return json_response(views)

    async def show(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "reading a service")
        state = self._state(request.match_info["name"])
        if who.team_scope and state.spec.replica.team != who.team_scope:
            return error_response(404, "unknown_service", f"service {state.spec.name!r} does not exist")
        return json_response(service_view(state))

    async def delete(self, request: web.Request) -> web.Response:
        who = require(request, JOB_WRITERS, "deleting a service")
        state = self._state(request.match_info["name"])
        require_team(who, state.spec.replica.team, "delete services")
        command = DeleteService(id=new_command_id(), ts=time.time(), source=API, correlation_id=state.spec.name,
                                name=state.spec.name, team=state.spec.replica.team)
        await self.bus.publish([command])
        return json_response(ServiceAccepted(name=state.spec.name, state="deleting"), status=202)

    async def load(self, request: web.Request) -> web.Response:
        who = require(request, JOB_WRITERS, "reporting a service's load")
        state = self._state(request.match_info["name"])
        require_team(who, state.spec.replica.team, "report load")
        report = decode_body(await request.read(), _load_decoder)
        if report.metric not in METRICS:
            return error_response(422, "unknown_metric", f"metric {report.metric!r} unknown ({', '.join(METRICS)})")
        if not (math.isfinite(report.value) and report.value >= 0):
            return error_response(422, "invalid_load", f"load must be a number >= 0, got {report.value}")
        command = ReportServiceLoad(id=new_command_id(), ts=time.time(), source=API,
                                    correlation_id=state.spec.name, service=state.spec.name, metric=report.metric,
                                    value=report.value)
        await self.bus.publish([command])
        return json_response(report, status=202)


def new_command_id() -> str:
    """A fresh id per request: each is a distinct command (a retried HTTP call is a new report)."""
    return str(uuid.uuid4())
