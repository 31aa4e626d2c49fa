"""A small synchronous client of the gpusched API (also the Python client for producers).

It authenticates with the bearer token in GPUSCHED_TOKEN, or in the file GPUSCHED_TOKEN_FILE names (so the
token need not sit in the environment); with neither, it sends none (an open, development-mode API).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from libs.cli.endpoints import Endpoint, api_endpoint


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status, self.code, self.message = status, code, message


class NotReady(ApiError):
    """503 not_ready: the platform is starting or catching up; it took nothing, so asking again is safe."""

    def __init__(self, status: int, code: str, message: str, retry_after: float) -> None:
        super().__init__(status, code, message)
        self.retry_after = retry_after


def _seconds(header: str | None) -> float:
    try:
        return min(max(float(header or 1), 0.1), 5.0)
    except ValueError:
        return 1.0


def token_from_env() -> str | None:
    """GPUSCHED_TOKEN, else the first line of the file GPUSCHED_TOKEN_FILE names, else None."""
    token = os.environ.get("GPUSCHED_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("GPUSCHED_TOKEN_FILE", "").strip()
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as err:
        raise ApiError(0, "token_file", f"cannot read GPUSCHED_TOKEN_FILE {path}: {err.strerror}") from None


class Client:
    def __init__(self, base_url: str | None = None, timeout: float = 10.0, token: str | None = None,
                 ready_wait_s: float = 30.0) -> None:
        # Where the API is: the caller's, GPUSCHED_API, the local platform's endpoints file, or the default.
        found = Endpoint(base_url, "the caller") if base_url else api_endpoint()
        self.base, self.base_source = found.value.rstrip("/"), found.source
        self.timeout = timeout
        self.ready_wait_s = ready_wait_s
        self._token = token if token is not None else token_from_env()

    def __repr__(self) -> str:  # never the token: clients end up in tracebacks and logs
        return f"Client({self.base!r}, token={'set' if self._token else 'none'})"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        # A platform still starting (or catching up with its log) answers 503 not_ready with Retry-After and
        # has taken nothing: asking again is safe, for a while.
        deadline = time.monotonic() + self.ready_wait_s
        while True:
            try:
                return self._call_once(method, path, body)
            except NotReady as err:
                if time.monotonic() + err.retry_after > deadline:
                    raise
                time.sleep(err.retry_after)

    def _call_once(self, method: str, path: str, body: Any) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self._headers())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            try:
                payload = json.loads(err.read())
                code, message = payload.get("code", "error"), payload.get("message", "")
            except (ValueError, AttributeError):
                raise ApiError(err.code, "http_error", str(err)) from None
            if err.code == 503 and code == "not_ready":
                raise NotReady(err.code, code, message, _seconds(err.headers.get("Retry-After"))) from None
            raise ApiError(err.code, code, message) from None
        except urllib.error.URLError as err:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self.base} (from {self.base_source}): "
                           f"{err.reason}") from None
        except TimeoutError:
            raise ApiError(0, "unreachable", f"the API at {self.base} (from {self.base_source}) did not answer "
                           f"within {self.timeout:g}s") from None

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", spec)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def jobs(self, **filters: Any) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({k: v for k, v in filters.items() if v not in (None, "")})
        return self._call("GET", "/v1/jobs" + (f"?{query}" if query else ""))

    def explain(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/explain")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{urllib.parse.quote(job_id)}")

    def queues(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/queues")

    def queue(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/queues/{urllib.parse.quote(name)}")

    def put_queue(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/queues/{urllib.parse.quote(name)}", spec)

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes")

    def usage(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/usage")

    def deploy_service(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/services", spec)

    def services(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/services")

    def service(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/services/{urllib.parse.quote(name)}")

    def delete_service(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/services/{urllib.parse.quote(name)}")

    def report_load(self, name: str, value: float, metric: str = "requests_per_s") -> dict[str, Any]:
        return self._call("POST", f"/v1/services/{urllib.parse.quote(name)}/load", {"value": value, "metric": metric})

    def node_action(self, name: str, action: str, reason: str = "", operator: str = "") -> dict[str, Any]:
        """`action` is cordon, drain, uncordon or remove."""
        body = {"reason": reason, "operator": operator}
        if action == "remove":
            return self._call("DELETE", f"/v1/nodes/{urllib.parse.quote(name)}", body)
        return self._call("POST", f"/v1/nodes/{urllib.parse.quote(name)}/{action}", body)

    def logs(self, job_id: str, tail: int = 65536) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}/logs?tail={tail}")
