"""The operator's queue API: read the queue tree, and change one queue. A change is an input event in the
log (QueuePolicyChanged from the operator), so it is audited and replayed like any other."""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from contracts import QueuePolicyChanged, QueueSpec
from contracts.views import QueueView
from libs.bus.jetstream import Bus
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import derived_id
from libs.core.kernel.queue_limits import check_tree
from libs.runtime.http import decode_body, error_response, json_response
from libs.views.store import ViewStore
from services.admission.auth import CLUSTER_READERS, OPERATOR_ONLY, require

OPERATOR = "operator"
_queue_decoder = msgspec.json.Decoder(QueueSpec)


class QueuesApi:
    def __init__(self, bus: Bus, decider: AdmissionDecider, store: ViewStore) -> None:
        self.bus = bus
        self.decider = decider
        self.store = store

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/queues", self.list_queues)
        app.router.add_get("/v1/queues/{name}", self.get_queue)
        app.router.add_put("/v1/queues/{name}", self.put_queue)

    async def list_queues(self, request: web.Request) -> web.Response:
        require(request, CLUSTER_READERS, "reading queues")
        return json_response(await self.store.queues())

    async def get_queue(self, request: web.Request) -> web.Response:
        """The queue's read model; its spec from admission's own fold of the log, which is fresher than the
        projection (a queue just PUT is already there)."""
        require(request, CLUSTER_READERS, "reading queues")
        name = request.match_info["name"]
        view = next((q for q in await self.store.queues() if q.name == name), None)
        spec = self.decider.state.policy.queues.get(name)
        if view is None and spec is None:
            return error_response(404, "unknown_queue", f"queue {name!r} does not exist")
        if view is None:
            assert spec is not None
            view = QueueView(name=name, team=spec.team, parent=spec.parent, cohort=spec.cohort, weight=spec.weight)
        if spec is not None:
            view.spec = spec
        return json_response(view)

    async def put_queue(self, request: web.Request) -> web.Response:
        """Create or replace one queue. 200 with the spec as logged; 422 with a code when the tree would
        break; the change reaches every service through the log."""
        require(request, OPERATOR_ONLY, "changing a queue")
        name = request.match_info["name"]
        spec = decode_body(await request.read(), _queue_decoder)
        if spec.name != name:
            return error_response(422, "name_mismatch", f"the body names queue {spec.name!r}, the path {name!r}")
        queues = self.decider.state.policy.queues
        problem = check_tree({n: q for n, q in queues.items() if n != name}, spec)
        if problem is not None:
            return error_response(422, "invalid_queue", problem)
        if queues.get(name) == spec:
            return json_response(spec)  # nothing changes: nothing to log
        version = await self.bus.last_seq()
        await self.bus.publish([QueuePolicyChanged(
            id=derived_id(OPERATOR, "queue", name, version, msgspec.json.encode(spec).decode()), ts=time.time(),
            source=OPERATOR, correlation_id=name, queue=spec, version=version)])
        return json_response(spec, status=201 if name not in queues else 200)
