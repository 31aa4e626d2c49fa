"""The operator's node API (cordon, drain, uncordon, remove) and job logs.

Cordons and removals are commands in the log (`CordonNode`, `UncordonNode`, `RemoveNode`), decided by
node-telemetry, so every one is audited with its operator and reason. Logs stay on the node that ran the
job: the API asks the agents on `<prefix>.logs` and the one that has the job's log answers.
"""

from __future__ import annotations

import json
import time

import msgspec
from aiohttp import web
from nats.errors import NoRespondersError, TimeoutError

from contracts import CordonNode, RemoveNode, UncordonNode
from contracts.views import NodeAction
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import derived_id
from libs.runtime.http import check_query, decode_body, error_response, json_response
from services.admission.auth import JOB_READERS, OPERATOR_ONLY, principal, require

OPERATOR = "operator"
_action_decoder = msgspec.json.Decoder(NodeAction)


class NodesApi:
    def __init__(self, bus: Bus, decider: AdmissionDecider) -> None:
        self.bus = bus
        self.decider = decider

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/nodes/{name}/cordon", self.cordon)
        app.router.add_post("/v1/nodes/{name}/drain", self.drain)
        app.router.add_post("/v1/nodes/{name}/uncordon", self.uncordon)
        app.router.add_delete("/v1/nodes/{name}", self.remove)
        app.router.add_get("/v1/jobs/{job_id}/logs", self.logs)

    async def _action(self, request: web.Request) -> tuple[str, NodeAction] | web.Response:
        require(request, OPERATOR_ONLY, "cordoning, draining, uncordoning or removing a node")
        name = request.match_info["name"]
        if name not in self.decider.state.inventory.nodes:
            return error_response(404, "unknown_node", f"node {name!r} is not registered")
        body = await request.read()
        action = decode_body(body, _action_decoder) if body.strip() else NodeAction()
        who = principal(request)
        if who.authenticated:  # the log records who did it as authenticated, not as the body claims
            action = msgspec.structs.replace(action, operator=who.name)
        return name, action

    async def _publish(self, kind: type[CordonNode] | type[UncordonNode] | type[RemoveNode], name: str,
                       action: NodeAction,
                       **fields: object) -> web.Response:
        version = await self.bus.last_seq()
        command = kind(id=derived_id(OPERATOR, kind.__name__, name, version), ts=time.time(), source=OPERATOR,
                       correlation_id=name, node=name, reason=action.reason, operator=action.operator,
                       **fields)  # type: ignore[arg-type]
        await self.bus.publish([command])
        return json_response({"node": name, "command": kind.__name__, **fields, "reason": action.reason},
                             status=202)

    async def cordon(self, request: web.Request) -> web.Response:
        parsed = await self._action(request)
        return parsed if isinstance(parsed, web.Response) else await self._publish(CordonNode, *parsed, drain=False)

    async def drain(self, request: web.Request) -> web.Response:
        parsed = await self._action(request)
        return parsed if isinstance(parsed, web.Response) else await self._publish(CordonNode, *parsed, drain=True)

    async def uncordon(self, request: web.Request) -> web.Response:
        parsed = await self._action(request)
        return parsed if isinstance(parsed, web.Response) else await self._publish(UncordonNode, *parsed)

    async def remove(self, request: web.Request) -> web.Response:
        """The node leaves the inventory (node-telemetry decides it, so it is audited); its jobs are requeued."""
        parsed = await self._action(request)
        return parsed if isinstance(parsed, web.Response) else await self._publish(RemoveNode, *parsed)

    async def logs(self, request: web.Request) -> web.Response:
        who = require(request, JOB_READERS, "reading job logs")
        check_query(request, frozenset({"tail"}))
        job_id = request.match_info["job_id"]
        if not who.sees(self.decider.state.job_team.get(job_id, "")):
            return error_response(404, "unknown_job", f"job {job_id} not found")
        try:
            tail = int(request.query.get("tail", "65536"))
        except ValueError:
            return error_response(400, "invalid_request", "tail must be a number of bytes")
        if tail < 0 or tail > 16 << 20:
            return error_response(400, "invalid_request", "tail must be between 0 and 16 MiB")
        subject = f"{self.bus.config.subject_prefix}.logs"
        try:
            reply = await self.bus.nc.request(subject, json.dumps({"job_id": job_id, "tail": tail}).encode(),
                                              timeout=2.0)
        except (TimeoutError, NoRespondersError):
            return error_response(404, "no_logs", f"no node agent holds logs of job {job_id} (jobs run by the "
                                                  "simulated executor have none)")
        return web.Response(body=reply.data, content_type="application/json")
