"""The platform's processes on this machine: NATS and Redis (embedded unless given), the six services under a
supervisor, and the processes at its edge (node agents, the Kubernetes bridge). `gpusched up`, the benchmarks
and the end-to-end tests all start the platform through here."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.embedded import EmbeddedServer, free_port, port_open, start_nats, start_redis
from libs.runtime.settings import DEFAULT_PORTS
from libs.runtime.supervisor import Supervisor


def _ports(api_port: int) -> dict[str, int]:
    """The well-known ports (8080-8085) when the API gets its default one; otherwise (a second platform on
    this machine, a test) free ports for every service, so that two platforms never race for a port."""
    if api_port != DEFAULT_PORTS["admission"]:
        return {name: api_port if name == "admission" else free_port() for name in DEFAULT_PORTS}
    return {name: port if not port_open(port) else free_port() for name, port in DEFAULT_PORTS.items()}


def audit_key_file(data: Path) -> Path:
    """The key that signs the decision chains' checkpoints: made once, readable by its owner only."""
    path = data / "audit.key"
    if not path.exists():
        data.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.resolve()


def start_platform(data: Path, cluster: Path, policy: Path, api_port: int,
                   extra_env: dict[str, str] | None = None,
                   own_servers: bool = False, service_env: dict[str, dict[str, str]] | None = None,
                   ) -> tuple[Supervisor, list[EmbeddedServer], dict[str, str]]:
    """The six services; on NATS_URL / REDIS_URL when set, else (or with `own_servers`, e.g. a benchmark
    that must start from an empty log) on servers of their own under `data`. `service_env` adds variables
    for one service only (e.g. its NATS credentials)."""
    data = data.resolve()  # every path a child gets is absolute: children resolve against their own folder
    servers: list[EmbeddedServer] = []
    sup: Supervisor | None = None
    try:
        nats_url = None if own_servers else os.environ.get("NATS_URL")
        redis_url = None if own_servers else os.environ.get("REDIS_URL")
        if not nats_url:
            servers.append(start_nats(data / "nats"))
            nats_url = servers[-1].url
        if not redis_url:
            servers.append(start_redis(data / "redis"))
            redis_url = servers[-1].url
        env = {"NATS_URL": nats_url, "REDIS_URL": redis_url, "GPUSCHED_CLUSTER": str(cluster.resolve()),
               "GPUSCHED_POLICY": str(policy.resolve()), "GPUSCHED_AUDIT_KEY_FILE": str(audit_key_file(data)),
               **(extra_env or {})}
        sup = Supervisor(env=env, ports=_ports(api_port), log_dir=data / "logs", service_env=service_env or {})
        sup.start()
        sup.wait_ready()
    except BaseException:
        # Nothing this call started outlives its failure.
        stop_all(sup, servers)
        raise
    return sup, servers, env


def stop_all(sup: Supervisor | None, servers: list[EmbeddedServer], agents: EdgeProcesses | None = None) -> None:
    """Agents, then services, then the servers they use, in that order."""
    if agents is not None:
        agents.stop()
    if sup is not None:
        sup.stop()
    for s in reversed(servers):
        s.stop()


@dataclass
class EdgeProcesses:
    """The processes at the platform's edge that `up` runs beside the services: node agents with the simulated
    backend (`--agents N`, each a simulated GPU server whose jobs run as real processes), or the Kubernetes
    bridge (`--kubeconfig`). Restarted when they die, like the services."""

    env: dict[str, str]
    data: Path
    commands: dict[str, list[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_agents(self, count: int, gpus: int) -> None:
        for i in range(count):
            node = f"agent-{i}"
            self._spawn(node, [sys.executable, "-m", "services.agent", "--node", node, "--backend", "sim",
                               "--gpus", str(gpus), "--port", str(free_port()),
                               "--workdir", str(self.data / "agents" / node)])

    def start_bridge(self, kubeconfig: Path) -> None:
        self._spawn("kube-bridge", [sys.executable, "-m", "services.kube_bridge", "--kubeconfig",
                                    str(kubeconfig.resolve()), "--port", str(free_port())])

    def _spawn(self, name: str, argv: list[str]) -> None:
        (self.data / "logs").mkdir(parents=True, exist_ok=True)
        self.commands[name] = argv
        with open(self.data / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, env={**os.environ, **self.env}, stdout=log,
                                                stderr=subprocess.STDOUT)

    def restart_dead(self) -> list[str]:
        dead = [name for name, proc in self.procs.items() if proc.poll() is not None]
        for name in dead:
            self._spawn(name, self.commands[name])
        return dead

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
