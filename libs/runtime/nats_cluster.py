"""A NATS cluster with JetStream on this machine: three (or more) `nats-server` processes from the shipped
configuration (infra/nats/cluster/node.conf), each with its own free client, route and monitoring ports and
its own store. For tests and experiments with a replicated log: a server can be killed and started again
with the same ports and store, as a lost machine that comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs.runtime.embedded import free_port, nats_server_binary, wait_port
from libs.runtime.settings import REPO_ROOT

NODE_CONF = REPO_ROOT / "infra" / "nats" / "cluster" / "node.conf"
HOST = "127.0.0.1"


@dataclass
class NatsNode:
    name: str
    port: int
    cluster_port: int
    monitor_port: int
    store: Path
    routes: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self) -> dict[str, str]:
        """What node.conf reads from the environment."""
        return {"GPUSCHED_NATS_NAME": self.name, "GPUSCHED_NATS_HOST": HOST, "GPUSCHED_NATS_PORT": str(self.port),
                "GPUSCHED_NATS_CLUSTER_PORT": str(self.cluster_port),
                "GPUSCHED_NATS_MONITOR_PORT": str(self.monitor_port), "GPUSCHED_NATS_STORE": str(self.store),
                "GPUSCHED_NATS_ROUTES": "[" + ", ".join(self.routes) + "]"}

    def start(self) -> None:
        if self.alive:
            return
        self.store.mkdir(parents=True, exist_ok=True)
        with open(self.store.parent / f"{self.name}.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen([nats_server_binary(), "-c", str(NODE_CONF)],
                                         env={**os.environ, **self.env()}, stdout=log, stderr=subprocess.STDOUT)
        wait_port(self.port, proc=self.proc, name=f"nats {self.name}", log_path=self.store.parent / f"{self.name}.log")

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to hand its leaderships over, as when its machine is lost."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def monitor(self, path: str) -> tuple[int, Any]:
        """GET a monitoring endpoint: (HTTP status, JSON body); (0, None) when the server does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.monitor_port}{path}", timeout=2) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, None
        except (OSError, ValueError):
            return 0, None

    def meta_leader(self) -> str:
        """The JetStream meta leader as this server sees it; "" while there is none (or it does not answer)."""
        _, body = self.monitor("/jsz")
        return str(((body or {}).get("meta_cluster") or {}).get("leader") or "")

    def healthy(self) -> bool:
        """JetStream up and current: the meta layer and every stream and consumer this server holds caught up."""
        return self.monitor("/healthz")[0] == 200


@dataclass
class NatsCluster:
    nodes: list[NatsNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Every server's client URL, comma-separated: a NATS_URL for the services and the CLI."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Until every live server agrees on a meta leader and says it is healthy; the leader's name."""
        deadline = time.monotonic() + timeout
        while True:
            live = [n for n in self.nodes if n.alive]
            leaders = {n.meta_leader() for n in live}
            if len(leaders) == 1 and "" not in leaders and all(n.healthy() for n in live):
                return leaders.pop()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no JetStream meta leader agreed on after {timeout}s (seen: {sorted(leaders)})")
            time.sleep(0.1)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def start_nats_cluster(data_dir: Path, size: int = 3, timeout: float = 30.0) -> NatsCluster:
    """`size` servers n1..nN on free loopback ports, stores under `data_dir`; returns once JetStream has a meta
    leader that every server agrees on."""
    names = [f"n{i + 1}" for i in range(size)]
    free = _distinct_free_ports(3 * size)
    ports = {name: (free[3 * i], free[3 * i + 1], free[3 * i + 2]) for i, name in enumerate(names)}
    routes = [f"nats://{HOST}:{ports[name][1]}" for name in names]
    cluster = NatsCluster([NatsNode(name, *ports[name], data_dir / name, routes) for name in names])
    try:
        for n in cluster.nodes:
            n.start()
        cluster.wait_ready(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
