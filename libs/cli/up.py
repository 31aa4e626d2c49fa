"""`gpusched up`: the whole platform on this machine, in one command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.status import Status
from rich.table import Table

from libs.cli.data_folder import archive
from libs.files import write_whole
from libs.runtime.api_tokens import TOKENS_ENV
from libs.runtime.platform import EdgeProcesses, start_platform, stop_all
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY, SERVICES

console = Console(stderr=True)


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
