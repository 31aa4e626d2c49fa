"""Least privilege on a real nats-server running the generated config: every service publishes and consumes
what it needs as its own user; a service cannot publish another's decisions, nor the auditor anything; and
the whole platform runs under it without a single refused subject."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from contracts import AuditCheckpoint, JobPlaced, QuotaReserved, SubmitJob
from contracts.codec import decode
from contracts.events import EventBase
from libs.audit.log_reader import read_log
from libs.bus.jetstream import Bus, BusConfig, NatsAuth, inbox_prefix
from libs.bus.permissions import AGENT, AUDITOR, OPERATOR, PUBLISHES, SERVICES, log_subject, render_config, users
from libs.cli.client import Client
from libs.cli.nats_config import write_secrets
from libs.runtime.embedded import EmbeddedServer, free_port, nats_server_binary, wait_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import REPO_ROOT
from libs.runtime.supervisor import Supervisor
from tests.e2e.waiting import wait_for

REFUSED_WITHIN_S = 1.0  # a refused publish is never acknowledged: how long to wait before calling it refused
ACKED_WITHIN_S = 10.0  # an allowed publish is acknowledged: how long to wait for that on a loaded machine
NODE = "n1"  # the agent of part (a) runs as the shared agent user with this node's durable


@dataclass
class SecuredNats:
    """A nats-server with the rendered users (passwords only in its environment) and a fresh store."""

    url: str
    prefix: str
    stream: str
    secrets: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def password_file(self, user: str) -> Path:
        return self.secrets / f"{user}.password"

    def config(self, user: str) -> BusConfig:
        auth = NatsAuth(user=user, password=self.password_file(user).read_text().strip())
        return BusConfig(url=self.url, stream=self.stream, subject_prefix=self.prefix, auth=auth)

    async def connect(self, user: str) -> Bus:
        return await Bus.connect(self.config(user), name=f"test-{user}")

    def violations(self) -> list[str]:
        return [line for line in self.log_path.read_text().splitlines() if "Violation" in line]

    def logged_violation(self, user: str, kind: str, subject: str) -> bool:
        """Whether the server logged refusing `subject` to `user` (its log may trail the client a moment)."""
        deadline = time.monotonic() + 10.0
        while not any(f'"$G/user:{user}"' in v and f"{kind} Violation" in v and f'"{subject}"' in v
                      for v in self.violations()):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        EmbeddedServer("nats", self.url, 0, self.proc).stop()


def start_secured_nats(folder: Path, agent_nodes: Sequence[str] = ()) -> SecuredNats:
    stream = f"T{uuid.uuid4().hex[:12].upper()}"
    prefix = stream.lower()
    conf = folder / "auth.conf"
    conf.write_text(render_config(prefix, stream, agent_nodes))
    env_file = write_secrets(folder / "secrets", [u.name for u in users(prefix, stream, agent_nodes)])
    server_env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    port, log_path = free_port(), folder / "nats-server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(conf), "-js", "-a", "127.0.0.1", "-p", str(port),
                                 "-sd", str(folder / "store")],
                                env={**os.environ, **server_env}, stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc=proc)
    return SecuredNats(f"nats://127.0.0.1:{port}", prefix, stream, folder / "secrets", log_path, proc)


async def create_streams(server: SecuredNats) -> None:
    bus = await server.connect(OPERATOR)
    await bus.close()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    server = start_secured_nats(tmp_path_factory.mktemp("secured-nats"))
    try:
        asyncio.run(create_streams(server))
        yield server
    finally:
        server.stop()


async def publish(bus: Bus, subject: str, timeout: float = ACKED_WITHIN_S) -> int:
    """Publish one message and return the stream sequence the server stored it at."""
    ack = await bus.js.publish(subject, b'{"probe": true}', headers={"Nats-Msg-Id": uuid.uuid4().hex},
                               timeout=timeout)
    return int(ack.seq)


async def last_seq(server: SecuredNats) -> int:
    bus = await server.connect(AUDITOR)
    try:
        return await bus.last_seq()
    finally:
        await bus.close()


async def assert_refused(server: SecuredNats, bus: Bus, subject: str) -> None:
    before = await last_seq(server)
    with pytest.raises(nats.errors.TimeoutError):
        await publish(bus, subject, timeout=REFUSED_WITHIN_S)
    assert await last_seq(server) == before, f"{subject} was stored"


async def wait_for_ack_floor(bus: Bus, durable: str, seq: int) -> None:
    deadline = time.monotonic() + 5.0
    while await bus.ack_floor(durable) != seq:
        assert time.monotonic() < deadline, f"{durable} never acknowledged {seq}"
        await asyncio.sleep(0.02)


# --- (a) each service does what it needs as its own user -----------------------------------------


@pytest.mark.parametrize("user", [*SERVICES, AGENT])
async def test_each_user_publishes_its_own_and_consumes_as_it_needs(secured: SecuredNats, user: str) -> None:
    bus = await secured.connect(user)
    durable = f"{AGENT}-{NODE}" if user == AGENT else user
    try:
        for event_type in sorted(PUBLISHES[user], key=lambda t: t.__name__):
            assert await publish(bus, log_subject(secured.prefix, event_type)) > 0
        await publish(bus, f"{secured.prefix}.dlq.{durable}")  # its dead letters
        consumer = await bus.durable(durable, bus.log_subjects())
        msgs = await consumer.fetch(10, timeout=2.0)
        assert msgs or not PUBLISHES[user]  # accounting publishes nothing: its consumer may find the log empty
        if msgs:
            await msgs[-1].ack()  # as the reactor acknowledges a batch: AckAll on its own durable
            await wait_for_ack_floor(bus, durable, msgs[-1].metadata.sequence.stream)
        reader = await bus.reader(bus.log_subjects())  # the reactor's catch-up after a restart
        await reader.fetch(10, timeout=1.0)
        await reader.close()
        await consumer.close()
    finally:
        await bus.close()


async def test_plain_subjects_heartbeats_and_log_requests(secured: SecuredNats) -> None:
    agent, telemetry, admission = [await secured.connect(u) for u in (AGENT, "node-telemetry", "admission")]
    try:
        beats = await telemetry.nc.subscribe(f"{secured.prefix}.hb.*")
        await telemetry.nc.flush()  # the server knows the subscription before the agent beats

        async def answer(msg: Msg) -> None:
            await msg.respond(b'{"node": "n1", "bytes": 0, "log": ""}')  # allowed on the reply subject only

        await agent.nc.subscribe(f"{secured.prefix}.logs", cb=answer)
        await agent.nc.flush()
        await agent.nc.publish(f"{secured.prefix}.hb.{NODE}", b'{"node": "n1"}')
        assert (await beats.next_msg(timeout=5.0)).subject == f"{secured.prefix}.hb.{NODE}"
        reply = await admission.nc.request(f"{secured.prefix}.logs", b'{"job_id": "j"}', timeout=5.0)
        assert b'"node": "n1"' in reply.data
    finally:
        for bus in (agent, telemetry, admission):
            await bus.close()


async def test_anonymous_and_wrong_password_clients_are_refused(secured: SecuredNats) -> None:
    for options in ({}, {"user": "quota", "password": "p" + "0" * 32}):
        with pytest.raises(nats.errors.Error):
            await nats.connect(secured.url, allow_reconnect=False, connect_timeout=2, **options)


# --- (b), (c) no service publishes another's decisions --------------------------------------------


async def test_placement_cannot_reserve_quota(secured: SecuredNats, caplog: pytest.LogCaptureFixture) -> None:
    bus = await secured.connect("placement")
    try:
        with caplog.at_level(logging.ERROR, logger="libs.bus.jetstream"):
            await assert_refused(secured, bus, log_subject(secured.prefix, QuotaReserved))
            await bus.nc.flush()
        assert any("permissions violation" in r.getMessage() and "quotareserved" in r.getMessage().lower()
                   for r in caplog.records)
        await assert_refused(secured, bus, f"{secured.prefix}.dlq.quota")  # nor speak for it in dead letters
        js = bus.nc.jetstream(timeout=REFUSED_WITHIN_S)
        with pytest.raises(nats.errors.TimeoutError):  # nor take quota's consumer
            await js.pull_subscribe("", durable="quota", stream=secured.stream)
        with pytest.raises(nats.errors.TimeoutError):  # nor create a stream: only the operator does
            await js.add_stream(StreamConfig(name=f"{secured.stream}X", subjects=[f"{secured.prefix}x.>"]))
    finally:
        await bus.close()
    assert secured.logged_violation("placement", "Publish", log_subject(secured.prefix, QuotaReserved))


async def test_admission_cannot_place_jobs(secured: SecuredNats) -> None:
    bus = await secured.connect("admission")
    try:
        await assert_refused(secured, bus, log_subject(secured.prefix, JobPlaced))
        await assert_refused(secured, bus, f"{secured.prefix}.e.>")  # no wildcard either
        await bus.nc.subscribe(f"{inbox_prefix('quota')}.>")  # nor read another service's replies
        await bus.nc.flush()
    finally:
        await bus.close()
    assert secured.logged_violation("admission", "Subscription", f"{inbox_prefix('quota')}.>")


# --- (d) the auditor reads and never writes -------------------------------------------------------


async def test_auditor_reads_the_log_and_cannot_publish(secured: SecuredNats) -> None:
    writer = await secured.connect("admission")
    try:
        await publish(writer, log_subject(secured.prefix, SubmitJob))
        await publish(writer, f"{secured.prefix}.dlq.admission")
    finally:
        await writer.close()
    bus = await secured.connect(AUDITOR)
    try:
        for subject in (log_subject(secured.prefix, SubmitJob), log_subject(secured.prefix, AuditCheckpoint),
                        f"{secured.prefix}.dlq.auditor", f"{secured.prefix}.hb.{NODE}"):
            await assert_refused(secured, bus, subject)
        raw = await read_log(bus)
        assert raw and [seq for seq, _ in raw] == list(range(1, await bus.last_seq() + 1))
        dead = Bus(bus.nc, dataclasses.replace(bus.config, stream=bus.config.dlq_stream))
        reader = await dead.reader([f"{secured.prefix}.dlq.>"])
        assert await reader.fetch(100, timeout=2.0)
        await reader.close()
    finally:
        await bus.close()


# --- (e) the platform runs under it --------------------------------------------------------------

CLUSTER = "sn,cpu_milli,memory_mib,gpu,model\nsec-a100-0,96000,786432,8,A100\nsec-t4-0,32000,131072,2,T4\n"
POLICY = '[[queues]]\nname = "q"\nteam = "t"\nnominal_gpus = 10\n'
AGENT_NODE = "sec-ag-0"


def nats_setup(server: SecuredNats) -> None:
    """`gpusched nats-setup` as the operator: the streams exist before any service looks them up."""
    env = {**os.environ, "NATS_URL": server.url, "GPUSCHED_STREAM": server.stream,
           "GPUSCHED_SUBJECT_PREFIX": server.prefix, "NATS_USER": OPERATOR,
           "NATS_PASSWORD_FILE": str(server.password_file(OPERATOR))}
    subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "gpusched"), "nats-setup"], env=env, check=True,
                   capture_output=True, timeout=30)


def credentials(server: SecuredNats, user: str) -> dict[str, str]:
    return {"NATS_USER": user, "NATS_PASSWORD_FILE": str(server.password_file(user))}


@contextlib.contextmanager
def secured_platform(tmp_path: Path, redis_url: str, cluster: str,
                     extra: dict[str, str] | None = None) -> Iterator[tuple[SecuredNats, Supervisor, dict[str, str]]]:
    """The six services, each as its own user, on a secured server whose streams the operator made; on
    leaving, not one subject was refused to anyone."""
    (tmp_path / "nats").mkdir()
    server = start_secured_nats(tmp_path / "nats", agent_nodes=[AGENT_NODE])
    try:
        nats_setup(server)
        (tmp_path / "cluster.csv").write_text(cluster)
        (tmp_path / "policy.toml").write_text(POLICY)
        env = {"NATS_URL": server.url, "REDIS_URL": redis_url, "GPUSCHED_STREAM": server.stream,
               "GPUSCHED_SUBJECT_PREFIX": server.prefix, "GPUSCHED_TICK_SECONDS": "1",
               "GPUSCHED_AUDIT_EVERY": "5", **(extra or {})}  # AUDIT_EVERY: signed checkpoints too
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            for name in ("NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE", "NATS_CREDS"):
                mp.delenv(name, raising=False)  # only what each service is given
            sup, servers, _ = start_platform(tmp_path, tmp_path / "cluster.csv", tmp_path / "policy.toml",
                                             api_port=free_port(),
                                             service_env={s: credentials(server, s) for s in SERVICES})
        assert servers == []
        try:
            yield server, sup, env
            assert all(c.restarts == 0 and c.proc is not None and c.proc.poll() is None
                       for c in sup.children.values())
        finally:
            sup.stop()
        assert server.violations() == []  # nothing the platform does is outside its permissions
    finally:
        server.stop()


async def read_as_auditor(server: SecuredNats) -> list[EventBase]:
    bus = await server.connect(AUDITOR)
    try:
        return [decode(data) for _, data in await read_log(bus)]
    finally:
        await bus.close()


async def test_the_platform_runs_with_one_user_per_service(tmp_path: Path, redis_server: EmbeddedServer) -> None:
    attesting = {"admission", "quota", "placement"}
    with secured_platform(tmp_path, redis_server.url, CLUSTER) as (server, sup, _):
        run_jobs(Client(f"http://127.0.0.1:{sup.ports['admission']}"))
        time.sleep(1.5)  # a clock tick or two more
        deadline = time.monotonic() + 30.0
        while True:  # and the checkpoints of the last decisions, however long they take to reach the log
            events = await read_as_auditor(server)
            if attesting <= {e.service for e in events if isinstance(e, AuditCheckpoint)}:
                break
            assert time.monotonic() < deadline, "not every service's decisions were attested"
            await asyncio.sleep(0.5)


def run_jobs(client: Client) -> None:
    """A handful of jobs to completion, a cancel, a queue change and a cordon: every service's subjects."""
    wait_for(lambda: len(client.nodes()) == 2 and client.queues(), "the cluster never registered", timeout=30)
    jobs = [client.submit({"team": "t", "queue": "q", "gpus": g, "duration_s": 0.3})["id"] for g in (1, 2, 1, 4)]
    jobs.append(client.submit({"team": "t", "queue": "q", "gpus": 1, "gpu_milli": 500, "duration_s": 0.3})["id"])
    doomed = client.submit({"team": "t", "queue": "q", "gpus": 8, "duration_s": 60})["id"]
    client.put_queue("q", {"name": "q", "team": "t", "nominal_gpus": 12})
    client.node_action("sec-t4-0", "cordon", reason="maintenance")
    client.node_action("sec-t4-0", "uncordon")
    wait_for(lambda: all(client.job(j)["state"] == "succeeded" for j in jobs),
             lambda: f"jobs not done: {[client.job(j)['state'] for j in jobs]}", timeout=30)
    wait_for(lambda: client.job(doomed)["state"] == "running", "the long job never started", timeout=15)
    client.cancel(doomed)
    wait_for(lambda: client.job(doomed)["state"] == "cancelled", "the cancel never landed", timeout=15)


def test_a_node_agent_runs_jobs_as_its_own_user(tmp_path: Path, redis_server: EmbeddedServer) -> None:
    """The agent builds its settings itself; it still connects as its node's user, heartbeats, runs the
    jobs placed on it, and answers a log request on the reply subject alone."""
    empty = "sn,cpu_milli,memory_mib,gpu,model\n"
    with secured_platform(tmp_path, redis_server.url, empty, {"GPUSCHED_NODE_BACKEND": "agents"}) as (server, sup, env):
        agent_env = {**os.environ, **env, **credentials(server, f"{AGENT}-{AGENT_NODE}"),
                     "PYTHONPATH": str(REPO_ROOT)}
        with open(tmp_path / "agent.log", "ab") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "services.agent", "--node", AGENT_NODE, "--backend", "sim", "--gpus", "2",
                 "--port", str(free_port()), "--workdir", str(tmp_path / "agent"), "--heartbeat-s", "0.5"],
                env=agent_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            client = Client(f"http://127.0.0.1:{sup.ports['admission']}")
            wait_for(lambda: len(client.nodes()) == 1, "the agent's node never registered", timeout=30)
            jobs = [client.submit({"team": "t", "queue": "q", "gpus": 1, "duration_s": 5,
                                   "command": [sys.executable, "-c", f"print('job {i} ran')"]})["id"]
                    for i in range(2)]
            wait_for(lambda: all(client.job(j)["state"] == "succeeded" for j in jobs),
                     lambda: f"jobs not done: {[client.job(j)['state'] for j in jobs]}", timeout=30)
            assert "job 0 ran" in client.logs(jobs[0])["log"]
        finally:
            agent.terminate()
            agent.wait(timeout=10)
