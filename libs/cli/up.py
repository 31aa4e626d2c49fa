"""`gpusched up`: the whole platform on this machine, in one command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.status import Status
from rich.table import Table

from libs.cli.data_folder import archive
from libs.files import write_whole
from libs.runtime.api_tokens import TOKENS_ENV
from libs.runtime.embedded import EmbeddedServer, free_port, port_open, start_nats, start_redis
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY, DEFAULT_PORTS, SERVICES
from libs.runtime.supervisor import Supervisor

console = Console(stderr=True)


def _ports(api_port: int) -> dict[str, int]:
    """The well-known ports (8080-8085) when the API gets its default one; otherwise (a second platform on
    this machine, a test) free ports for every service, so that two platforms never race for a port."""
    if api_port != DEFAULT_PORTS["admission"]:
        return {name: api_port if name == "admission" else free_port() for name in DEFAULT_PORTS}
    return {name: port if not port_open(port) else free_port() for name, port in DEFAULT_PORTS.items()}


def _readiness(api: str) -> dict[str, object]:
    """Admission's public readiness probe (counts only): it needs no token, whatever the API's auth."""
    try:
        with urllib.request.urlopen(f"{api}/readyz", timeout=2) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as err:  # 503 while not ready: the body still says what it has
        with contextlib.suppress(ValueError):
            return dict(json.loads(err.read()))
    except (OSError, ValueError):
        pass
    return {}


def _wait_for_cluster(api: str, logs: Path, status: Status, source: str, timeout: float = 60.0) -> tuple[int, int]:
    """Until nodes (from `source`) and queues are registered; the status line says what is still awaited."""
    deadline = time.monotonic() + timeout
    nodes = queues = 0
    while time.monotonic() < deadline:
        ready = _readiness(api)
        nodes, queues = int(str(ready.get("nodes", 0))), int(str(ready.get("queues", 0)))
        if nodes and queues:
            return nodes, queues
        awaited = [what for what, got in ((f"nodes from {source}", nodes), ("queues from the policy", queues))
                   if not got]
        status.update(f"waiting for {' and '.join(awaited)} at {api} "
                      f"({int(deadline - time.monotonic())}s left) ...")
        time.sleep(0.2)
    missing = " and ".join(what for what, got in (("nodes", nodes), ("queues", queues)) if not got)
    raise TimeoutError(f"no {missing} in the API at {api} after {timeout:g}s; see the service logs in {logs}")


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


def cmd_up(args: argparse.Namespace) -> None:
    data = Path(args.data).resolve()
    if args.agents and args.kubeconfig:
        raise ValueError("--agents and --kubeconfig exclude each other: the nodes come from one or the other")
    backend = "agents" if args.agents else "kubernetes" if args.kubeconfig else ""
    extra = {"GPUSCHED_NODE_BACKEND": backend} if backend else {}
    agents: EdgeProcesses | None = None
    if args.fresh:
        if os.environ.get("NATS_URL"):
            raise ValueError("--fresh archives the log kept under --data; with NATS_URL set the log is on that server")
        archived = archive(data)
        console.print(f"the previous log is archived in {archived} (gpusched up --data {archived} serves it again)"
                      if archived else f"nothing to archive in {data}: starting afresh")
    with console.status("starting NATS, Redis and the six services...") as status:
        sup, servers, env = start_platform(data, Path(args.cluster), Path(args.policy), args.port, extra_env=extra)
        api = f"http://127.0.0.1:{sup.ports['admission']}"
        try:
            if args.agents:
                status.update(f"starting {args.agents} node agent(s) with {args.agent_gpus} simulated GPUs each ...")
                agents = EdgeProcesses(env, data)
                agents.start_agents(args.agents, args.agent_gpus)
            elif args.kubeconfig:
                status.update("starting the Kubernetes bridge ...")
                agents = EdgeProcesses(env, data)
                agents.start_bridge(Path(args.kubeconfig))
            source = (f"{args.agents} node agent(s)" if args.agents else "the Kubernetes bridge" if args.kubeconfig
                      else args.cluster)
            n_nodes, n_queues = _wait_for_cluster(api, data / "logs", status, source)
        except BaseException:
            stop_all(sup, servers, agents)
            raise
    table = Table(title="gpusched is up", show_header=False)
    table.add_row("API", api)
    table.add_row("use it", f"export GPUSCHED_API={api}; gpusched submit --team demo --queue demo --gpus 1 "
                            "--duration 5")
    table.add_row("NATS", env["NATS_URL"])
    table.add_row("Redis", env["REDIS_URL"])
    for name in SERVICES:
        table.add_row(f"{name} metrics", f"http://127.0.0.1:{sup.ports[name]}/metrics")
    table.add_row("logs", str((data / "logs").resolve()))
    table.add_row("audit key", f"{env['GPUSCHED_AUDIT_KEY_FILE']} (gpusched audit verify --key-file ...)")
    table.add_row("state", f"{data} (the log in nats/; gpusched up --fresh archives it and starts afresh)")
    tokens = os.environ.get(TOKENS_ENV)
    if tokens:
        table.add_row("auth", f"tokens from {tokens}: callers need GPUSCHED_TOKEN or GPUSCHED_TOKEN_FILE "
                              "(gpusched token create)")
    where = (f"{args.agents} node agent(s), jobs run as processes" if args.agents else
             f"of Kubernetes ({args.kubeconfig}), pods and Jobs with schedulerName gpusched" if args.kubeconfig
             else f"from {args.cluster}")
    table.add_row("cluster", f"{n_nodes} nodes {where}; {n_queues} queues from {args.policy}")
    console.print(table)
    console.print("Ctrl-C stops everything.")
    # Whoever waits for the file (scripts, tests) must never read it half written.
    write_whole(data / "endpoints.json", json.dumps({"api": api, **env, "ports": sup.ports}, indent=2))

    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopping:
            for name in [*sup.restart_dead(), *(agents.restart_dead() if agents else [])]:
                console.print(f"[yellow]{name} died; restarted (it resumes from the log)[/yellow]")
            time.sleep(0.5)
    finally:
        console.print("stopping...")
        # The endpoints are gone with the platform: a later command must not find them and try a dead address.
        (data / "endpoints.json").unlink(missing_ok=True)
        stop_all(sup, servers, agents)
        console.print("stopped.")


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run the whole platform locally (embedded NATS and Redis unless given)")
    p.add_argument("--cluster", default=str(DEFAULT_CLUSTER), help="node list CSV (openb format)")
    p.add_argument("--policy", default=str(DEFAULT_POLICY), help="queues and priority classes (TOML)")
    p.add_argument("--data", default=".data", help="folder for the log (nats/), views, logs and the audit key")
    p.add_argument("--fresh", action="store_true",
                   help="start with an empty log: the old one is archived under DATA/archive/<time>, not deleted")
    p.add_argument("--port", type=int, default=8080, help="API port (another free one if taken)")
    p.add_argument("--agents", type=int, default=0,
                   help="instead of the simulated cluster: N node agents (simulated GPUs, jobs run as processes)")
    p.add_argument("--agent-gpus", type=int, default=8, help="GPUs of each agent's simulated server")
    p.add_argument("--kubeconfig", help="instead of the simulated cluster: schedule this Kubernetes cluster's GPU "
                   "pods and Jobs (runs `gpusched kube`; docs/kubernetes.md)")
    p.set_defaults(func=cmd_up)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: gpusched up")
