"""The OpenAPI document of the public API, generated from the contracts so it cannot drift."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts import JobSpec, QueueSpec, ServiceSpec
from contracts.views import (
    ApiError,
    Explanation,
    JobCreated,
    JobLogs,
    JobView,
    LoadReport,
    NodeAction,
    NodeView,
    QueueView,
    ServiceAccepted,
    ServiceView,
    TeamUsage,
)

_MODELS = (JobSpec, QueueSpec, JobView, QueueView, NodeView, TeamUsage, ApiError, JobCreated, Explanation, NodeAction,
           JobLogs, ServiceSpec, ServiceView, ServiceAccepted, LoadReport)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): _json(_ref("ApiError"), "error with a machine-readable code and a message") for c in codes}


def _not_ready() -> dict[str, Any]:
    """A write checked against the cluster's capacity, answered before any node has registered."""
    return {"503": {**_errors(503)["503"], "description": "`not_ready`: no node has registered yet, so the "
                    "cluster's capacity is unknown; retry",
                    "headers": {"Retry-After": _header("seconds to wait", {"type": "integer", "minimum": 1})}}}


def _key_reused() -> dict[str, Any]:
    """A submission whose idempotency key a job made with another spec holds."""
    return {"409": {**_errors(409)["409"], "description": "`idempotency_key_reused`: the key belongs to a job made "
                    "with another spec (the message names the fields that differ); that job is unchanged"}}


_WRITES = ("post", "put", "patch", "delete")
_BEARER = {"bearerAuth": {"type": "http", "scheme": "bearer",
                          "description": "a token from `gpusched token create`; without GPUSCHED_API_TOKENS_FILE the "
                                         "API is open (development mode) and ignores it"}}


def _header(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "schema": schema}


def _auth_errors(method: str) -> dict[str, Any]:
    """What every operation may answer for want of a token, a role or patience (writes only)."""
    out = {
        "401": {**_errors(401)["401"], "description": "no valid bearer token",
                "headers": {"WWW-Authenticate": _header("the Bearer challenge", {"type": "string"})}},
        "403": {**_errors(403)["403"], "description": "the token's role (or team) may not do this"},
    }
    if method in _WRITES:
        out["429"] = {**_errors(429)["429"], "description": "too many writes from this team; retry later",
                      "headers": {"Retry-After": _header("seconds to wait", {"type": "integer", "minimum": 1})}}
    return out


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """Every operation under bearer authentication, with its 401/403 (and, for writes, 429) answers."""
    for operations in paths.values():
        for method, operation in operations.items():
            operation["security"] = [{"bearerAuth": []}]
            operation["responses"].update(_auth_errors(method))
    return paths


def openapi_document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(_MODELS, ref_template="#/components/schemas/{name}")
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    queue_name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    query: list[dict[str, Any]] = [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
             for n in ("queue", "state", "team")]
    query += [{"name": n, "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}}
              for n in ("limit", "offset")]
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpusched API", "version": "1"},
        "paths": _secured({
            "/v1/jobs": {
                "post": {
                    "summary": "Submit a job",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobSpec")}}},
                    "responses": {"201": _json(_ref("JobCreated"), "accepted; follow the job by its id (`spec`: the "
                                               "spec as stored; `reason`, `message`: why it waits, holding nothing, "
                                               "until a policy change gives it room, when its queue's quota or user "
                                               "limit cannot hold it now)"),
                                  "200": _json(_ref("JobCreated"), "the same idempotency key and spec were seen "
                                               "before: the job they made (`duplicate`), its stored spec and current "
                                               "state"),
                                  **_errors(400, 413, 422), **_key_reused(), **_not_ready()},
                },
                "get": {"summary": "List jobs", "parameters": query,
                        "responses": {"200": _json({"type": "array", "items": _ref("JobView")}, "jobs"),
                                      **_errors(400)}},
            },
            "/v1/jobs/{job_id}": {
                "get": {"summary": "One job", "parameters": [job_id],
                        "responses": {"200": _json(_ref("JobView"), "the job"), **_errors(404)}},
                "delete": {"summary": "Cancel a job", "parameters": [job_id],
                           "responses": {"202": _json(_ref("JobCreated"), "cancellation accepted"),
                                         **_errors(404, 409)}},
            },
            "/v1/jobs/{job_id}/explain": {
                "get": {"summary": "Why the job waits, what would unblock it, when it should start",
                        "parameters": [job_id],
                        "responses": {"200": _json(_ref("Explanation"), "the explanation"), **_errors(404)}},
            },
            "/v1/queues": {"get": {"summary": "Queues: quota, borrowing, lending, fair share, budget",
                                   "responses": {"200": _json({"type": "array", "items": _ref("QueueView")}, "")}}},
            "/v1/queues/{name}": {
                "get": {"summary": "One queue", "parameters": [queue_name],
                        "responses": {"200": _json(_ref("QueueView"), "the queue"), **_errors(404)}},
                "put": {"summary": "Create or replace a queue (an audited event in the log)",
                        "parameters": [queue_name],
                        "requestBody": {"required": True,
                                        "content": {"application/json": {"schema": _ref("QueueSpec")}}},
                        "responses": {"201": _json(_ref("QueueSpec"), "created"),
                                      "200": _json(_ref("QueueSpec"), "replaced (or unchanged)"),
                                      **_errors(400, 422)}},
            },
            "/v1/nodes": {"get": {"summary": "Nodes and their GPUs",
                                  "responses": {"200": _json({"type": "array", "items": _ref("NodeView")}, "")}}},
            **{f"/v1/nodes/{{name}}/{action}": {"post": {
                "summary": summary, "parameters": [queue_name],
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("NodeAction")}}},
                "responses": {"202": _json({"type": "object"}, "the command is in the log"), **_errors(400, 404)}}}
               for action, summary in (("cordon", "No new jobs on the node (an audited command)"),
                                       ("drain", "Cordon, and stop the node's jobs so they run elsewhere"),
                                       ("uncordon", "The node takes new jobs again"))},
            "/v1/nodes/{name}": {"delete": {
                "summary": "The node leaves the inventory (an audited command); its jobs are requeued",
                "parameters": [queue_name],
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("NodeAction")}}},
                "responses": {"202": _json({"type": "object"}, "the command is in the log"), **_errors(400, 404)}}},
            "/v1/jobs/{job_id}/logs": {
                "get": {"summary": "The tail of a job's output, from the node agent that ran it",
                        "parameters": [job_id, {"name": "tail", "in": "query", "required": False,
                                                "schema": {"type": "integer", "minimum": 0, "maximum": 16 << 20}}],
                        "responses": {"200": _json(_ref("JobLogs"), "the log's tail"), **_errors(400, 404)}},
            },
            "/v1/services": {
                "post": {"summary": "Deploy an inference service, or change its bounds and autoscaling",
                         "requestBody": {"required": True,
                                         "content": {"application/json": {"schema": _ref("ServiceSpec")}}},
                         "responses": {"201": _json(_ref("ServiceAccepted"), "deploying"),
                                       "200": _json(_ref("ServiceAccepted"), "updating"),
                                       **_errors(400, 409, 413, 422), **_not_ready()}},
                "get": {"summary": "Inference services: replicas desired and ready, load",
                        "responses": {"200": _json({"type": "array", "items": _ref("ServiceView")}, "")}},
            },
            "/v1/services/{name}": {
                "get": {"summary": "One inference service", "parameters": [queue_name],
                        "responses": {"200": _json(_ref("ServiceView"), "the service"), **_errors(404)}},
                "delete": {"summary": "Stop every replica and forget the service", "parameters": [queue_name],
                           "responses": {"202": _json(_ref("ServiceAccepted"), "deleting"), **_errors(404)}},
            },
            "/v1/services/{name}/load": {
                "post": {"summary": "Report a service's load for its autoscaling", "parameters": [queue_name],
                         "requestBody": {"required": True,
                                         "content": {"application/json": {"schema": _ref("LoadReport")}}},
                         "responses": {"202": _json(_ref("LoadReport"), "the report is in the log"),
                                       **_errors(400, 404, 413, 422)}},
            },
            "/v1/usage": {"get": {"summary": "GPU-seconds per team",
                                  "responses": {"200": _json({"type": "array", "items": _ref("TeamUsage")}, "")}}},
        }),
        "components": {"schemas": components, "securitySchemes": _BEARER},
    }
