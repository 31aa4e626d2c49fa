"""`gpusched agent`: one per GPU server. Announces the node's inventory, heartbeats, reports GPU faults,
exports GPU telemetry, runs the jobs placed on the node as processes, and serves their logs.

Heartbeats and log requests use plain NATS subjects (`<prefix>.hb.<node>`, `<prefix>.logs`): they are
liveness and convenience, not facts of the log. Inventory, faults and job reports go to the log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
from aiohttp import web
from nats.aio.msg import Msg
from prometheus_client import Gauge

from contracts import GpuFault, NodeRegistered, NodeSpec
from contracts.views import JobLogs
from libs.bus.jetstream import Bus
from libs.core.kernel.decider import derived_id
from libs.core.node_health.announcements import registration_id
from libs.nodes.backend import AgentBackend, make_agent_backend
from libs.nodes.sim import SimNodeBackend
from libs.runtime.main import configure_logging
from libs.runtime.reactor import Reactor
from libs.runtime.service import run_service
from libs.runtime.settings import Settings
from libs.telemetry.gpu import sample_forever
from services.agent.executor import ProcessExecutor

log = logging.getLogger(__name__)
THROTTLES = ("thermal", "power")
THROTTLED = Gauge("gpusched_gpu_throttled", "1 while the GPU's clocks are held back (thermal or power)",
                  ["node", "gpu", "reason"])


@dataclass
class Heartbeat:
    every_s: float = 1.0
    stopped: bool = False  # fault injection: a node that stops heartbeating (hung, partitioned)


def heartbeat_subject(prefix: str, node: str) -> str:
    return f"{prefix}.hb.{node}"


def logs_subject(prefix: str) -> str:
    return f"{prefix}.logs"


def fault_subject(prefix: str, node: str) -> str:
    return f"{prefix}.agent.{node}.fault"


def make_backend(kind: str, node: str, gpus: int | None, model: str, cluster_csv: str | None) -> AgentBackend:
    if kind == "sim" and gpus is not None:
        return SimNodeBackend(None, node, gpus, model)  # a synthesised node (benchmarks, demos)
    return make_agent_backend(kind, cluster_csv, node, gpus)


class Agent:
    def __init__(self, settings: Settings, node: str, backend: AgentBackend, workdir: Path,
                 heartbeat_s: float) -> None:
        self.settings = settings
        self.node = node
        self.backend = backend
        self.heartbeat = Heartbeat(every_s=heartbeat_s)
        self.executor = ProcessExecutor(node=node, workdir=workdir)
        self.executor.name = f"agent-{node}"  # the durable consumer and the metrics' service label
        self.faults = 0

    @property
    def prefix(self) -> str:
        return self.settings.subject_prefix

    async def on_ready(self, bus: Bus, reactor: Reactor) -> None:
        self.executor.bus = bus
        self.executor.live_from = await bus.last_seq() + 1
        self.executor.reconcile()
        await bus.nc.subscribe(logs_subject(self.prefix), cb=self._serve_logs)
        await bus.nc.subscribe(fault_subject(self.prefix, self.node), cb=self._inject_fault)

    async def announce(self, bus: Bus, reactor: Reactor) -> None:
        """Register the node once the log's history is folded (so the version follows the last one): at start
        when the log's inventory differs or says the node was lost, later whenever the inventory changes. A
        node lost while this agent runs comes back through node-telemetry, when it hears the heartbeats again."""
        await self.executor.history_done.wait()
        first = True
        while True:
            found = [n for n in await asyncio.to_thread(self.backend.discover) if n.name == self.node]
            ex = self.executor
            if found and (ex.spec != found[0] or (first and ex.lost)):
                version = ex.registrations + 1
                await bus.publish([NodeRegistered(id=registration_id(found[0], version), ts=time.time(),
                                                  source=ex.source, correlation_id=self.node, node=found[0])])
                log.info("%s registered (version %d, %d GPUs)", self.node, version, len(found[0].gpus))
                await self._echo(found[0])
            first = False
            await asyncio.sleep(max(self.heartbeat.every_s, 1.0))

    async def _echo(self, spec: NodeSpec, timeout_s: float = 10.0) -> None:
        """Wait until the log hands the registration back, so it is not published twice."""
        deadline = time.monotonic() + timeout_s
        while self.executor.spec != spec and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def beat(self, bus: Bus, reactor: Reactor) -> None:
        subject = heartbeat_subject(self.prefix, self.node)
        while True:
            if not self.heartbeat.stopped:
                body = {"node": self.node, "ts": time.time(), "running": self.executor.running()}
                await bus.nc.publish(subject, json.dumps(body).encode())
            await asyncio.sleep(self.heartbeat.every_s)

    async def watch_health(self, bus: Bus, reactor: Reactor) -> None:
        """XID and ECC errors the backend observes go to the log as `GpuFault` (node-telemetry decides
        whether they quarantine the GPU); throttling is telemetry only."""
        await self.executor.history_done.wait()
        throttled: set[tuple[str, str]] = set()
        while True:
            observations = await asyncio.to_thread(self.backend.poll_health, 1000)
            now_throttled = {(str(o.index), o.kind) for o in observations if o.kind in THROTTLES}
            for gpu, kind in throttled | now_throttled:
                THROTTLED.labels(self.node, gpu, kind).set(1 if (gpu, kind) in now_throttled else 0)
            throttled = now_throttled
            events = []
            for obs in observations:
                if obs.kind in THROTTLES:
                    continue
                self.faults += 1
                events.append(GpuFault(id=derived_id(self.executor.source, "fault", obs.index, obs.kind, obs.code,
                                                     time.time_ns()),
                                       ts=time.time(), source=self.executor.source, correlation_id=self.node,
                                       node=self.node, index=obs.index, kind=obs.kind, code=obs.code,
                                       detail=obs.detail))
            if events:
                await bus.publish(events)
            else:
                await asyncio.sleep(0.2)

    async def watch_checkpoints(self, bus: Bus, reactor: Reactor) -> None:
        while True:
            reports = self.executor.checkpoints()
            if reports:
                await bus.publish(reports)
            await asyncio.sleep(0.25)  # a replica's readiness is a scale-up's last step: look often

    async def sample(self, bus: Bus, reactor: Reactor) -> None:
        try:
            await sample_forever(self.backend.sample, 5.0, in_thread=True)
        finally:
            self.backend.close()

    async def _serve_logs(self, msg: Msg) -> None:
        """A log request names a job; the agent that ran it answers with the tail of its log."""
        try:
            req = json.loads(msg.data)
            job_id, tail = str(req["job_id"]), int(req.get("tail", 65536))
        except (ValueError, KeyError, TypeError):
            return
        path = self.executor.log_path(job_id)
        if "/" in job_id or not path.exists() or not msg.reply:
            return
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - max(tail, 0)))
            text = f.read().decode(errors="replace")
        await msg.respond(msgspec.json.encode(JobLogs(node=self.node, bytes=size, log=text)))

    async def _inject_fault(self, msg: Msg) -> None:
        """Simulated backends take faults on command: an XID or ECC error on a GPU, stopped or slow
        heartbeats. The real backend refuses."""
        answer: dict[str, object]
        try:
            cmd = json.loads(msg.data)
            kind = cmd["kind"]
            if kind == "heartbeats":
                self.heartbeat.stopped = bool(cmd.get("stop", False))
                self.heartbeat.every_s = float(cmd.get("every_s", self.heartbeat.every_s))
                answer = {"ok": True}
            elif kind in ("xid", "ecc") and hasattr(self.backend, f"inject_{kind}"):
                getattr(self.backend, f"inject_{kind}")(int(cmd["gpu"]), int(cmd["code"]))
                answer = {"ok": True}
            else:
                answer = {"ok": False, "error": f"{self.backend.name} backend cannot inject {kind!r}"}
        except (ValueError, KeyError, TypeError) as err:
            answer = {"ok": False, "error": f"bad fault command: {err}"}
        if msg.reply:
            await msg.respond(json.dumps(answer).encode())


async def serve(agent: Agent) -> None:
    def routes(app: web.Application, bus: Bus, reactor: Reactor) -> None:
        async def status(_: web.Request) -> web.Response:
            return web.json_response({"node": agent.node, "running": agent.executor.running(),
                                      "heartbeat_s": agent.heartbeat.every_s, "faults": agent.faults})

        app.router.add_get("/v1/agent", status)
        app.on_shutdown.append(lambda _: agent.executor.shutdown())

    await run_service(agent.settings, agent.executor, configure_app=routes, on_ready=agent.on_ready,
                      background=(agent.announce, agent.beat, agent.watch_health, agent.watch_checkpoints,
                                  agent.sample))


def cmd_agent(args: argparse.Namespace) -> None:
    node = args.node or socket.gethostname()
    configure_logging(f"agent-{node}")
    base = Settings.from_env("node-telemetry")
    settings = Settings(service="agent", nats_url=base.nats_url, redis_url=base.redis_url, stream=base.stream,
                        subject_prefix=base.subject_prefix, http_host=base.http_host, http_port=args.port,
                        batch_size=base.batch_size)
    backend = make_backend(args.backend, node, args.gpus, args.model, args.cluster)
    workdir = Path(args.workdir or os.environ.get("GPUSCHED_AGENT_DIR", f".data/agent-{node}"))
    asyncio.run(serve(Agent(settings, node, backend, workdir.resolve(), args.heartbeat_s)))


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run the node agent of this GPU server (inventory, health, process executor)")
    p.add_argument("--node", help="node name (default: the host name)")
    p.add_argument("--backend", choices=("nvml", "ascend", "sim"), default="nvml")
    p.add_argument("--gpus", type=int, help="sim backend without --cluster: GPUs of the simulated node")
    p.add_argument("--model", default="A100", help="sim backend without --cluster: their model")
    p.add_argument("--cluster", help="sim backend: the cluster CSV holding this node")
    p.add_argument("--port", type=int, default=8090, help="HTTP port for /metrics, /healthz and /v1/agent")
    p.add_argument("--workdir", help="job logs and checkpoints (default .data/agent-NODE)")
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.set_defaults(func=cmd_agent)
