"""The API with authentication on, against the whole platform (real NATS and Redis, the demo policy): tokens made
with `gpusched token create`, what each role may do, team isolation, the operator's name in the log, rate
limits on writes, tokens created and revoked while the API runs, and no token in any service's log.

One platform serves the module; its writes are limited to 0.5 a second per team in bursts of 10, which the
tests stay within except where they mean to go over."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts import CordonNode
from contracts.codec import decode
from libs.audit.log_reader import read_log
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.runtime.api_tokens import TOKENS_ENV
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY, REPO_ROOT
from libs.runtime.supervisor import Supervisor
from services.admission.auth import BURST_ENV, RATE_ENV
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

GPUSCHED = str(REPO_ROOT / ".venv" / "bin" / "gpusched")
# name: (team, role)
PEOPLE = {"dana": ("demo", "submitter"), "rick": ("research", "submitter"), "olga": ("platform", "operator"),
          "audrey": ("audit", "auditor"), "flood": ("flood", "submitter")}
RATE, BURST = 0.5, 10  # writes a second per team, and in a burst


@dataclass
class Platform:
    sup: Supervisor
    base: str
    tokens: dict[str, str]
    tokens_file: Path
    logs: Path
    nats_url: str
    stream: str

    def client(self, who: str) -> Client:
        return Client(self.base, token=self.tokens[who])

    def http(self, who: str | None, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"Content-Type": "application/json"}
        if who is not None:
            headers["Authorization"] = f"Bearer {self.tokens.get(who, who)}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read()), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), dict(err.headers)


def token_cli(tokens_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUSCHED, "token", *args, "--file", str(tokens_file)], capture_output=True, text=True,
                          timeout=30, check=True)


def create_token(tokens_file: Path, name: str, team: str, role: str) -> str:
    return token_cli(tokens_file, "create", "--name", name, "--team", team, "--role", role).stdout.strip()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, nats_server: EmbeddedServer,
             redis_server: EmbeddedServer) -> Iterator[Platform]:
    data = Path(tmp_path_factory.mktemp("api-auth"))
    tokens_file = data / "secrets" / "api-tokens.json"
    tokens = {name: create_token(tokens_file, name, team, role) for name, (team, role) in PEOPLE.items()}
    stream = f"T{uuid.uuid4().hex[:12].upper()}"
    env = {"GPUSCHED_STREAM": stream, "GPUSCHED_SUBJECT_PREFIX": stream.lower(), "GPUSCHED_TICK_SECONDS": "1",
           TOKENS_ENV: str(tokens_file), RATE_ENV: str(RATE), BURST_ENV: str(BURST)}
    with pytest.MonkeyPatch.context() as mp:  # start_platform uses the session's servers when these are set
        mp.setenv("NATS_URL", nats_server.url)
        mp.setenv("REDIS_URL", redis_server.url)
        sup, servers, _ = start_platform(data, DEFAULT_CLUSTER, DEFAULT_POLICY, api_port=free_port(), extra_env=env)
    assert servers == []
    try:
        p = Platform(sup, f"http://127.0.0.1:{sup.ports['admission']}", tokens, tokens_file, data / "logs",
                     nats_server.url, stream)
        auditor = p.client("audrey")
        wait_for(lambda: len(auditor.nodes()) == 9 and len(auditor.queues()) == 5, "the demo cluster never registered")
        yield p
    finally:
        sup.stop()


def job(team: str) -> dict[str, Any]:
    return {"team": team, "queue": team, "gpus": 1, "duration_s": 600.0, "priority": "training"}


def test_the_tokens_file_holds_hashes_only_and_is_private(platform: Platform) -> None:
    text = platform.tokens_file.read_text()
    assert platform.tokens_file.stat().st_mode & 0o077 == 0
    assert all(t.startswith("gst_") and t not in text for t in platform.tokens.values())
    listed = json.loads(token_cli(platform.tokens_file, "list", "--json").stdout)
    assert {e["name"]: (e["team"], e["role"]) for e in listed} == PEOPLE


def test_without_a_valid_token_only_probes_and_the_api_description_answer(platform: Platform) -> None:
    for who in (None, "gst_not-a-token"):
        status, body, headers = platform.http(who, "GET", "/v1/jobs")
        assert (status, body["code"]) == (401, "unauthenticated")
        assert headers["WWW-Authenticate"].startswith("Bearer")
    assert platform.http(None, "POST", "/v1/jobs", job("demo"))[0] == 401
    for path in ("/healthz", "/readyz", "/openapi.json"):
        with urllib.request.urlopen(platform.base + path, timeout=5) as resp:
            assert resp.status == 200
    with urllib.request.urlopen(platform.base + "/openapi.json", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert {"401", "403", "429"} <= set(doc["paths"]["/v1/jobs"]["post"]["responses"])


def test_a_submitter_sees_and_touches_its_own_teams_jobs_only(platform: Platform) -> None:
    dana, rick = platform.client("dana"), platform.client("rick")
    mine = dana.submit(job("demo"))["id"]
    theirs = rick.submit(job("research"))["id"]
    status, body, _ = platform.http("dana", "POST", "/v1/jobs", job("research"))
    assert (status, body["code"]) == (403, "forbidden") and "only for team 'demo'" in body["message"]

    wait_for(lambda: dana.job(mine)["team"] == "demo" and rick.job(theirs)["team"] == "research", "never decided")
    # Explaining needs the projected view (accounting's, which may trail admission's answer by a batch wait).
    wait_for(lambda: platform.http("dana", "GET", f"/v1/jobs/{mine}/explain")[0] == 200, "never projected")
    for path in (f"/v1/jobs/{theirs}", f"/v1/jobs/{theirs}/explain", f"/v1/jobs/{theirs}/logs"):
        status, body, _ = platform.http("dana", "GET", path)
        assert (status, body["code"]) == (404, "unknown_job"), path
    assert platform.http("dana", "DELETE", f"/v1/jobs/{theirs}")[:2] == (
        404, {"code": "unknown_job", "message": f"job {theirs} not found"})
    assert dana.explain(mine)["job_id"] == mine
    assert {j["team"] for j in dana.jobs()} == {"demo"} and mine in {j["id"] for j in dana.jobs()}
    assert dana.jobs(team="research") == []
    assert [u["team"] for u in dana.usage()] in ([], ["demo"])
    for path in ("/v1/queues", "/v1/queues/demo", "/v1/nodes"):
        status, body, _ = platform.http("dana", "GET", path)
        assert (status, body["code"]) == (403, "forbidden") and "operator or auditor" in body["message"]

    assert dana.cancel(mine)["state"] == "cancelling"
    assert rick.cancel(theirs)["state"] == "cancelling"
    wait_for(lambda: dana.job(mine)["state"] == "cancelled", "the submitter's cancel never took effect")


def test_an_auditor_reads_every_team_and_writes_nothing(platform: Platform) -> None:
    audrey = platform.client("audrey")
    assert {"demo", "research"} <= {j["team"] for j in audrey.jobs()}
    assert len(audrey.queues()) == 5 and audrey.queue("demo")["name"] == "demo" and len(audrey.nodes()) == 9
    some_job = audrey.jobs()[0]["id"]
    assert audrey.job(some_job)["id"] == some_job
    node = audrey.nodes()[0]["name"]
    for method, path, body in (("POST", "/v1/jobs", job("demo")), ("DELETE", f"/v1/jobs/{some_job}", None),
                               ("PUT", "/v1/queues/demo", audrey.queue("demo")["spec"]),
                               ("POST", f"/v1/nodes/{node}/cordon", {"reason": "audit"})):
        status, answer, _ = platform.http("audrey", method, path, body)
        assert (status, answer["code"]) == (403, "forbidden"), path
        assert "token 'audrey' is auditor" in answer["message"]


def cordons(platform: Platform) -> list[CordonNode]:
    async def read() -> list[tuple[int, bytes]]:
        bus = await Bus.connect(BusConfig(url=platform.nats_url, stream=platform.stream,
                                          subject_prefix=platform.stream.lower()))
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    return [e for _, data in asyncio.run(read()) if isinstance(e := decode(data), CordonNode)]


def test_an_operator_changes_queues_and_nodes_and_the_log_names_its_token(platform: Platform) -> None:
    olga = platform.client("olga")
    spec = olga.queue("platform")["spec"]
    assert olga.put_queue("platform", {**spec, "nominal_gpus": 6})["nominal_gpus"] == 6
    node = olga.nodes()[0]["name"]
    olga.node_action(node, "cordon", reason="fan noise", operator="someone-else")
    wait_for(lambda: {n["name"]: n["cordon"] for n in olga.nodes()}[node] == "cordoned", "the node never cordoned")
    assert [(c.node, c.operator, c.reason) for c in cordons(platform)] == [(node, "olga", "fan noise")]
    olga.node_action(node, "uncordon", reason="fixed")
    wait_for(lambda: {n["name"]: n["cordon"] for n in olga.nodes()}[node] == "", "the node never uncordoned")
    # Any team's job, as a submitter of that team could.
    created = olga.submit(job("research"))["id"]
    # Admission must have decided the submission before it takes the cancel (404 until then).
    assert wait_for(lambda: olga.cancel(created), "the operator's cancel was never accepted")["state"] == "cancelling"


def test_the_cli_authenticates_with_a_token_file(platform: Platform, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(platform.tokens["dana"] + "\n")
    env = {**os.environ, "GPUSCHED_API": platform.base, "GPUSCHED_TOKEN_FILE": str(tmp_path / "token")}
    env.pop("GPUSCHED_TOKEN", None)
    listed = subprocess.run([GPUSCHED, "jobs", "--json"], env=env, capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert {j["team"] for j in json.loads(listed.stdout)} == {"demo"}
    refused = subprocess.run([GPUSCHED, "queues"], env=env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "403 forbidden" in refused.stderr
    assert platform.tokens["dana"] not in refused.stderr + listed.stderr
    env.pop("GPUSCHED_TOKEN_FILE")
    anonymous = subprocess.run([GPUSCHED, "jobs"], env=env, capture_output=True, text=True, timeout=30)
    assert anonymous.returncode == 2 and "401 unauthenticated" in anonymous.stderr


def test_writes_over_the_teams_rate_are_429_with_retry_after(platform: Platform) -> None:
    # Writes until one is refused: the burst, plus whatever refilled while they went (more on a slow machine).
    answers: list[tuple[int, Any, dict[str, str]]] = []
    started = time.monotonic()
    while len(answers) < BURST + 40 and not (answers and answers[-1][0] == 429):
        answers.append(platform.http("flood", "DELETE", f"/v1/jobs/none-{len(answers)}"))
    elapsed = time.monotonic() - started
    statuses = [a[0] for a in answers]
    assert statuses[:BURST - 1] == [404] * (BURST - 1)  # the bucket may have refilled one while we went
    assert statuses[-1] == 429 and set(statuses[:-1]) == {404}, statuses
    assert len(statuses) - 1 <= BURST + RATE * elapsed + 1, (statuses, elapsed)  # no more than that went through
    _, body, headers = answers[-1]
    assert body["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1
    assert platform.http("flood", "GET", "/v1/jobs")[0] == 200  # reads are not limited
    assert platform.http("dana", "DELETE", "/v1/jobs/none")[0] == 404  # nor are other teams' writes
    time.sleep(int(headers["Retry-After"]))
    assert platform.http("flood", "DELETE", "/v1/jobs/none")[0] == 404


def test_a_token_created_or_revoked_while_the_api_runs_takes_effect(platform: Platform) -> None:
    token = create_token(platform.tokens_file, "late", "demo", "auditor")
    wait_for(lambda: platform.http(token, "GET", "/v1/queues")[0] == 200, "the new token never worked", timeout=10)
    token_cli(platform.tokens_file, "revoke", "--name", "late")
    wait_for(lambda: platform.http(token, "GET", "/v1/queues")[0] == 401, "the revoked token kept working", timeout=10)
    platform.tokens["late"] = token


def test_no_token_reaches_any_service_log(platform: Platform) -> None:
    logs = [p.read_text(errors="replace") for p in platform.logs.rglob("*") if p.is_file()]
    assert logs
    for name, token in platform.tokens.items():
        assert not any(token in text for text in logs), name
    assert not any("development mode" in text for text in logs)  # the admission service saw its tokens file
