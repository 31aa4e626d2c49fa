"""A small asynchronous client of the Kubernetes REST API, on aiohttp: JSON in, JSON out, and watches as
streams of events. Objects stay plain dicts: the bridge reads a few fields of thousands of objects, and a
typed model per object would cost more than the whole decision.

Where it connects: `--kubeconfig` (the current context's server, CA and token), or, inside a pod, the
service account's token and CA that Kubernetes mounts (`KUBERNETES_SERVICE_HOST`).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

Obj = dict[str, Any]
_IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(Exception):
    """An answer other than 2xx: its HTTP status and the Status object's reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


@dataclass(frozen=True)
class KubeConfig:
    server: str
    token: str = ""
    ca_file: str = ""
    insecure: bool = False

    @classmethod
    def load(cls, kubeconfig: str | None = None) -> KubeConfig:
        """From a kubeconfig file (the argument, else $KUBECONFIG), else the in-cluster service account."""
        path = kubeconfig or os.environ.get("KUBECONFIG", "")
        if path:
            return cls.from_kubeconfig(Path(path))
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if host and (_IN_CLUSTER / "token").exists():
            return cls(server=f"https://{host}:{port}", token=(_IN_CLUSTER / "token").read_text().strip(),
                       ca_file=str(_IN_CLUSTER / "ca.crt"))
        raise ValueError("no Kubernetes API: give --kubeconfig (or KUBECONFIG), or run inside a cluster")

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeConfig:
        doc = yaml.safe_load(path.read_text())
        current = doc.get("current-context", "")
        context = next((c["context"] for c in doc.get("contexts", []) if c["name"] == current), None)
        if context is None:
            raise ValueError(f"{path}: no current context")
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        user: dict[str, str] = next((u["user"] for u in doc.get("users", []) if u["name"] == context.get("user")), {})
        token = user.get("token", "")
        if not token and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        return cls(server=cluster["server"].rstrip("/"), token=token,
                   ca_file=cluster.get("certificate-authority", ""),
                   insecure=bool(cluster.get("insecure-skip-tls-verify", False)))


class KubeClient:
    def __init__(self, config: KubeConfig, user_agent: str = "gpusched-bridge") -> None:
        self.config = config
        context: ssl.SSLContext | bool = True
        if config.insecure:
            context = False
        elif config.ca_file:
            context = ssl.create_default_context(cafile=config.ca_file)
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._connector = aiohttp.TCPConnector(ssl=context, limit=64)
        # A watch event is one line; a real Node (its image list) can pass aiohttp's 64 KiB default.
        self.session = aiohttp.ClientSession(headers=headers, connector=self._connector, read_bufsize=1 << 22)

    async def close(self) -> None:
        await self.session.close()

    async def request(self, method: str, path: str, body: Obj | list[Obj] | None = None,
                      params: dict[str, str] | None = None, content_type: str = "application/json") -> Obj:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        async with self.session.request(method, self.config.server + path, data=data, params=params,
                                        headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as answer:
            text = await answer.text()
            try:
                doc: Obj = json.loads(text) if text else {}
            except ValueError:
                doc = {"message": text}
            if answer.status >= 300:
                raise ApiError(answer.status, str(doc.get("reason", "")), str(doc.get("message", text)))
            return doc

    async def get(self, path: str, params: dict[str, str] | None = None) -> Obj:
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def strategic_patch(self, path: str, body: Obj) -> Obj:
        return await self.request("PATCH", path, body, content_type="application/strategic-merge-patch+json")

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        return await self.request("DELETE", path, body)

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Obj]:
        """The events of one watch request, as the server sends them, until it ends the request."""
        query = {**params, "watch": "1"}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=int(params.get("timeoutSeconds",
                                                                                               "300")) + 30)
        async with self.session.get(self.config.server + path, params=query, timeout=timeout) as answer:
            if answer.status >= 300:
                text = await answer.text()
                try:
                    doc = json.loads(text)
                except ValueError:
                    doc = {"message": text}
                raise ApiError(answer.status, str(doc.get("reason", "")), str(doc.get("message", text)))
            async for line in answer.content:
                if line.strip():
                    yield json.loads(line)
