"""API authentication, roles and rate limits: the tokens file, the token buckets, and the real API handlers
behind the middleware (with an in-memory bus and read model, so every rule is checked without servers)."""

from __future__ import annotations

import json
import logging
import stat
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from nats.errors import NoRespondersError

from contracts import CancelJob, CordonNode, EventBase
from contracts.views import JobView, NodeView, QueueView, TeamUsage
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.cli.main import main as gpusched
from libs.core.admission.decider import AdmissionDecider
from libs.runtime.api_tokens import TokenEntry, TokenFileError, hash_token, read_tokens, write_tokens
from libs.runtime.http import base_app
from libs.views.store import ViewStore
from services.admission import auth
from services.admission.api import JobsApi
from services.admission.auth import RateLimiter, TokenFile, auth_middleware
from services.admission.nodes_api import NodesApi
from services.admission.queues_api import QueuesApi
from tests.unit.builders import EventFeed, job, node, queue

# name: (team, role)
PEOPLE = {"alice": ("ml", "submitter"), "carol": ("cv", "submitter"), "olga": ("ops", "operator"),
          "audrey": ("audit", "auditor")}
TOKENS = {name: f"gst_test-token-of-{name}" for name in PEOPLE}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entries() -> list[TokenEntry]:
    return [TokenEntry(name=n, team=t, role=r, hash=hash_token(TOKENS[n])) for n, (t, r) in PEOPLE.items()]


# --- the tokens file -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_tokens_file_round_trips_and_is_private_to_its_owner(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"tokens{suffix}"
    write_tokens(path, entries())
    assert read_tokens(path) == entries()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not any(t in path.read_text() for t in TOKENS.values())  # digests only


@pytest.mark.parametrize(("row", "problem"), [
    ({"name": "x", "team": "t", "role": "admin", "hash": hash_token("x")}, "role must be one of"),
    ({"name": "x", "team": "t", "role": "operator", "hash": "md5:abc"}, "hash must be"),
    ({"name": "x", "team": "t", "role": "operator", "hash": "sha256:" + "G" * 64}, "hash must be"),
    ({"name": "x", "role": "operator", "hash": hash_token("x")}, "'team' must be"),
    ({"name": "x\n", "team": "t", "role": "operator", "hash": hash_token("x")}, "'name' must be"),
    ("x", "must be a table"),
])
def test_a_bad_entry_refuses_the_whole_file(tmp_path: Path, row: Any, problem: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [row]}))
    with pytest.raises(TokenFileError, match=problem):
        read_tokens(path)


@pytest.mark.parametrize("text", ['{"tokens": {}}', "[]", "{not json"])
def test_a_file_of_the_wrong_shape_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "tokens.json").write_text(text)
    with pytest.raises(TokenFileError):
        read_tokens(tmp_path / "tokens.json")


def test_token_names_are_unique(tmp_path: Path) -> None:
    write_tokens(tmp_path / "tokens.json", [*entries(), entries()[0]])
    with pytest.raises(TokenFileError, match="unique: alice"):
        read_tokens(tmp_path / "tokens.json")


def test_a_changed_file_is_reloaded_and_a_broken_one_keeps_the_previous_tokens(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, clock = tmp_path / "tokens.json", Clock()
    write_tokens(path, entries()[:1])
    tokens = TokenFile(path, check_every_s=1.0, clock=clock)
    assert tokens.authenticate(TOKENS["alice"]) == auth.Principal("alice", "ml", "submitter")
    assert tokens.authenticate(TOKENS["olga"]) is None

    write_tokens(path, entries())
    assert tokens.authenticate(TOKENS["olga"]) is None  # not looked at again within the second
    clock.now += 1.0
    assert tokens.authenticate(TOKENS["olga"]) is not None

    path.write_text('{"tokens": [{"name": "half-edited"')
    clock.now += 1.0
    assert tokens.authenticate(TOKENS["olga"]) is not None
    assert "keeping the previous tokens" in caplog.text

    write_tokens(path, [e for e in entries() if e.name != "olga"])  # revoked
    clock.now += 1.0
    assert tokens.authenticate(TOKENS["olga"]) is None


def test_a_named_tokens_file_that_is_missing_stops_the_service_instead_of_opening_the_api(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        auth.install(web.Application(), {auth.TOKENS_ENV: str(tmp_path / "nope.json")})


def test_without_a_tokens_file_the_api_is_open_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    app = web.Application()
    with caplog.at_level(logging.WARNING):
        auth.install(app, {})
    assert [r.getMessage() for r in caplog.records if "development mode" in r.getMessage()] != []
    assert len(caplog.records) == 1
    assert len(app.middlewares) == 1


# --- token buckets -------------------------------------------------------------------------------------


def test_a_bucket_allows_its_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(per_s=2.0, burst=3, clock=clock)
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == pytest.approx(0.5)
    assert limiter.take("b") == 0.0  # buckets are per key
    clock.now += 0.5
    assert limiter.take("a") == 0.0
    clock.now += 100
    assert [limiter.take("a") for _ in range(4)][-1] > 0  # refilled to the burst, not beyond


def test_many_keys_do_not_grow_the_buckets_without_bound() -> None:
    clock = Clock()
    limiter = RateLimiter(per_s=1.0, burst=1, clock=clock, max_keys=100)
    for i in range(1000):
        limiter.take(f"addr:{i}")
        clock.now += 0.001
    assert len(limiter._buckets) <= 100


@pytest.mark.parametrize(("env", "expected"), [
    ({}, (200.0, 1000.0)),
    ({auth.RATE_ENV: "5", auth.BURST_ENV: "10"}, (5.0, 10.0)),
    ({auth.RATE_ENV: "0"}, None),
])
def test_the_limiter_comes_from_the_environment(env: dict[str, str], expected: tuple[float, float] | None) -> None:
    limiter = auth.limiter_from_env(env)
    assert (limiter and (limiter.per_s, limiter.burst)) == expected


@pytest.mark.parametrize("env", [{auth.RATE_ENV: "fast"}, {auth.RATE_ENV: "-1"}, {auth.RATE_ENV: "nan"},
                                 {auth.BURST_ENV: "0.5"}, {auth.BURST_ENV: "inf"}])
def test_a_bad_rate_limit_setting_stops_the_service(env: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        auth.limiter_from_env(env)


# --- the API behind the middleware ---------------------------------------------------------------------


@dataclass
class FakeNats:
    async def request(self, *_: Any, **__: Any) -> Any:
        raise NoRespondersError


@dataclass
class FakeBus:
    config: BusConfig = field(default_factory=lambda: BusConfig(subject_prefix="t"))
    nc: FakeNats = field(default_factory=FakeNats)
    published: list[EventBase] = field(default_factory=list)

    async def publish(self, events: Sequence[EventBase], headers: Any = None) -> None:
        self.published.extend(events)

    async def last_seq(self) -> int:
        return len(self.published)


class FakeStore:
    def __init__(self, views: list[JobView]) -> None:
        self.views = {v.id: v for v in views}

    async def job(self, job_id: str) -> JobView | None:
        return self.views.get(job_id)

    async def jobs(self, queue: str = "", state: str = "", team: str = "", limit: int = 1000,
                   offset: int = 0) -> list[JobView]:
        return [v for v in self.views.values() if (not team or v.team == team) and (not state or v.state == state)]

    async def queues(self) -> list[QueueView]:
        return [QueueView(name="ml-train", team="ml")]

    async def nodes(self) -> list[NodeView]:
        return []

    async def usage(self) -> list[TeamUsage]:
        return [TeamUsage(team="cv"), TeamUsage(team="ml")]


@dataclass
class Api:
    client: TestClient
    bus: FakeBus
    clock: Clock

    async def call(self, who: str | None, method: str, path: str, body: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        sent = dict(headers or {})
        if who is not None:
            sent["Authorization"] = f"Bearer {TOKENS.get(who, who)}"
        data = None if body is None else json.dumps(body).encode()
        resp = await self.client.request(method, path, data=data, headers=sent)
        return resp.status, await resp.json(), resp.headers


def decider() -> AdmissionDecider:
    """Two teams with a queue each, one node, and one job of each team."""
    d = AdmissionDecider()
    feed = EventFeed(d)
    feed.queues(queue("ml-train", "ml", 8), queue("cv-train", "cv", 8))
    feed.nodes(node("a", 8))
    feed.submit("ml-1", job(team="ml", queue="ml-train"))
    feed.submit("cv-1", job(team="cv", queue="cv-train"))
    return d


async def start_api(tokens: TokenFile | None, limiter: RateLimiter | None, clock: Clock) -> Api:
    bus, store, d = FakeBus(), FakeStore([JobView(id="ml-1", state="pending", team="ml", queue="ml-train"),
                                          JobView(id="cv-1", state="pending", team="cv", queue="cv-train")]), decider()
    app = base_app("admission", lambda: True)
    app.middlewares.append(auth_middleware(tokens, limiter))
    JobsApi(cast(Bus, bus), d, cast(ViewStore, store)).routes(app)
    QueuesApi(cast(Bus, bus), d, cast(ViewStore, store)).routes(app)
    NodesApi(cast(Bus, bus), d).routes(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    return Api(client, bus, clock)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    write_tokens(tmp_path / "tokens.json", entries())
    clock = Clock()
    started = await start_api(TokenFile(tmp_path / "tokens.json"), RateLimiter(1000, 1000, clock=clock), clock)
    yield started
    await started.client.close()


ML_JOB = {"team": "ml", "queue": "ml-train", "gpus": 1}
CV_JOB = {"team": "cv", "queue": "cv-train", "gpus": 1}


@pytest.mark.parametrize(("who", "method", "path", "body", "status"), [
    # submitters: their own team's jobs only; another team's job does not exist for them
    ("alice", "POST", "/v1/jobs", ML_JOB, 201),
    ("alice", "POST", "/v1/jobs", CV_JOB, 403),
    ("alice", "GET", "/v1/jobs/ml-1", None, 200),
    ("alice", "GET", "/v1/jobs/cv-1", None, 404),
    ("alice", "GET", "/v1/jobs/ml-1/explain", None, 200),
    ("alice", "GET", "/v1/jobs/cv-1/explain", None, 404),
    ("alice", "DELETE", "/v1/jobs/cv-1", None, 404),
    ("alice", "DELETE", "/v1/jobs/ml-1", None, 202),
    ("alice", "GET", "/v1/jobs/cv-1/logs", None, 404),
    ("alice", "GET", "/v1/queues", None, 403),
    ("alice", "GET", "/v1/queues/ml-train", None, 403),
    ("alice", "PUT", "/v1/queues/ml-train", {"name": "ml-train", "team": "ml"}, 403),
    ("alice", "GET", "/v1/nodes", None, 403),
    ("alice", "POST", "/v1/nodes/a/cordon", None, 403),
    # operators: everything, for every team
    ("olga", "POST", "/v1/jobs", CV_JOB, 201),
    ("olga", "GET", "/v1/jobs/cv-1", None, 200),
    ("olga", "DELETE", "/v1/jobs/cv-1", None, 202),
    ("olga", "GET", "/v1/queues", None, 200),
    ("olga", "PUT", "/v1/queues/ml-train", {"name": "ml-train", "team": "ml", "nominal_gpus": 4}, 200),
    ("olga", "POST", "/v1/nodes/a/drain", {"reason": "maintenance"}, 202),
    ("olga", "POST", "/v1/nodes/a/uncordon", None, 202),
    ("olga", "GET", "/v1/nodes", None, 200),
    # auditors: every read, no write
    ("audrey", "GET", "/v1/jobs/cv-1", None, 200),
    ("audrey", "GET", "/v1/jobs/ml-1/explain", None, 200),
    ("audrey", "GET", "/v1/queues/ml-train", None, 200),
    ("audrey", "GET", "/v1/nodes", None, 200),
    ("audrey", "POST", "/v1/jobs", ML_JOB, 403),
    ("audrey", "DELETE", "/v1/jobs/ml-1", None, 403),
    ("audrey", "PUT", "/v1/queues/ml-train", {"name": "ml-train", "team": "ml"}, 403),
    ("audrey", "POST", "/v1/nodes/a/cordon", None, 403),
])
async def test_each_role_may_do_what_it_may_and_nothing_else(
        api: Api, who: str, method: str, path: str, body: Any, status: int) -> None:
    got, payload, _ = await api.call(who, method, path, body)
    assert got == status, payload
    if status == 403:
        assert payload["code"] == "forbidden"
        assert "needs the role" in payload["message"] or "only for team" in payload["message"]
    if status == 404:
        assert payload["code"] == "unknown_job"
    if status >= 400 and method != "GET":
        assert api.bus.published == []  # a refused write reaches nothing


async def test_a_forbidden_answer_says_which_role_is_needed(api: Api) -> None:
    _, payload, _ = await api.call("audrey", "PUT", "/v1/queues/ml-train", {"name": "ml-train", "team": "ml"})
    assert payload == {"code": "forbidden",
                       "message": "changing a queue needs the role operator; token 'audrey' is auditor"}
    _, payload, _ = await api.call("alice", "POST", "/v1/jobs", CV_JOB)
    assert "may submit jobs only for team 'ml', not 'cv'" in payload["message"]


async def test_lists_and_usage_are_filtered_to_a_submitters_team(api: Api) -> None:
    assert [j["id"] for j in (await api.call("alice", "GET", "/v1/jobs"))[1]] == ["ml-1"]
    assert (await api.call("alice", "GET", "/v1/jobs?team=cv"))[1] == []
    assert [j["id"] for j in (await api.call("alice", "GET", "/v1/jobs?team=ml"))[1]] == ["ml-1"]
    assert [j["id"] for j in (await api.call("audrey", "GET", "/v1/jobs"))[1]] == ["ml-1", "cv-1"]
    assert [u["team"] for u in (await api.call("alice", "GET", "/v1/usage"))[1]] == ["ml"]
    assert [u["team"] for u in (await api.call("audrey", "GET", "/v1/usage"))[1]] == ["cv", "ml"]


async def test_a_submitters_cancel_names_its_team_and_a_cordon_the_token_that_asked(api: Api) -> None:
    await api.call("alice", "DELETE", "/v1/jobs/ml-1")
    await api.call("olga", "POST", "/v1/nodes/a/cordon", {"reason": "fan", "operator": "mallory"})
    cancel, cordon = api.bus.published
    assert isinstance(cancel, CancelJob) and cancel.team == "ml"
    assert isinstance(cordon, CordonNode) and (cordon.operator, cordon.reason) == ("olga", "fan")


async def test_a_submitter_reads_logs_of_its_own_jobs(api: Api) -> None:
    status, payload, _ = await api.call("alice", "GET", "/v1/jobs/ml-1/logs")
    assert (status, payload["code"]) == (404, "no_logs")  # past the team check: no agent holds them here


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer  ", "Basic YWxpY2U6c2VjcmV0",
                                    "gst_test-token-of-alice"])
async def test_a_request_without_a_bearer_token_is_401_with_a_challenge(api: Api, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    status, payload, sent = await api.call(None, "GET", "/v1/jobs", headers=headers)
    assert (status, payload["code"]) == (401, "unauthenticated")
    assert sent["WWW-Authenticate"] == 'Bearer realm="gpusched"'


@pytest.mark.parametrize("token", ["gst_nope", "gst_test-token-of-alicE", "\u00e9t\u00e9", "x" * 5000])
async def test_an_unknown_token_is_401_invalid_token(api: Api, token: str) -> None:
    status, payload, sent = await api.call(None, "POST", "/v1/jobs", ML_JOB,
                                           headers={"Authorization": f"Bearer {token}".encode().decode("latin-1")})
    assert (status, payload["code"]) == (401, "unauthenticated")
    assert 'error="invalid_token"' in sent["WWW-Authenticate"]
    assert api.bus.published == []


async def test_a_bearer_scheme_in_any_case_is_accepted(api: Api) -> None:
    status, _, _ = await api.call(None, "GET", "/v1/jobs", headers={"Authorization": f"bearer {TOKENS['alice']}"})
    assert status == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
async def test_probes_metrics_and_the_api_description_need_no_token(api: Api, path: str) -> None:
    resp = await api.client.get(path)
    assert resp.status == 200


async def test_an_unknown_path_is_401_before_404_so_that_paths_cannot_be_probed(api: Api) -> None:
    assert (await api.call(None, "GET", "/v2/secret"))[0] == 401
    assert (await api.call("alice", "GET", "/v2/secret"))[0] == 404


async def test_tokens_never_reach_the_logs(api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        for who in (*TOKENS, "gst_a-wrong-token"):
            await api.call(who, "POST", "/v1/jobs", {"team": "ml", "queue": "nope"})
            await api.call(who, "GET", "/v1/jobs/ml-1")
        (tmp_path / "tokens.json").write_text("{broken")
        api.clock.now += 10
        await api.call("alice", "GET", "/v1/jobs")
    assert caplog.records
    for token in (*TOKENS.values(), "gst_a-wrong-token"):
        assert token not in caplog.text
    assert repr(Client("http://x", token=TOKENS["alice"])) == "Client('http://x', token=set)"


async def test_writes_over_the_teams_rate_are_429_with_retry_after(tmp_path: Path) -> None:
    write_tokens(tmp_path / "tokens.json", entries())
    clock = Clock()
    api = await start_api(TokenFile(tmp_path / "tokens.json"), RateLimiter(0.5, 2, clock=clock), clock)
    try:
        assert [(await api.call("alice", "DELETE", "/v1/jobs/none"))[0] for _ in range(2)] == [404, 404]
        status, payload, headers = await api.call("alice", "POST", "/v1/jobs", ML_JOB)
        assert (status, payload["code"], headers["Retry-After"]) == (429, "rate_limited", "2")
        assert (await api.call("alice", "GET", "/v1/jobs"))[0] == 200  # reads are not limited
        assert (await api.call("carol", "DELETE", "/v1/jobs/none"))[0] == 404  # another team has its own
        clock.now += 2.0
        assert (await api.call("alice", "POST", "/v1/jobs", ML_JOB))[0] == 201
    finally:
        await api.client.close()


async def test_an_open_api_lets_anyone_do_anything_and_limits_writes_per_address() -> None:
    clock = Clock()
    api = await start_api(None, RateLimiter(1, 1, clock=clock), clock)
    try:
        assert (await api.call(None, "GET", "/v1/jobs/cv-1"))[0] == 200
        assert (await api.call(None, "PUT", "/v1/queues/ml-train", {"name": "ml-train", "team": "ml"}))[0] == 200
        status, payload, headers = await api.call(None, "POST", "/v1/nodes/a/cordon", {"operator": "me"})
        assert (status, payload["code"], headers["Retry-After"]) == (429, "rate_limited", "1")
        clock.now += 1
        assert (await api.call(None, "POST", "/v1/nodes/a/cordon", {"operator": "me"}))[0] == 202
        assert cast(CordonNode, api.bus.published[-1]).operator == "me"  # nobody authenticated: the body says
    finally:
        await api.client.close()


# --- the CLI and the client ----------------------------------------------------------------------------


def test_token_create_prints_the_token_once_and_stores_only_its_hash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sub" / "tokens.json"
    gpusched(["token", "create", "--name", "ci", "--team", "ml", "--role", "submitter", "--file", str(path)])
    token = capsys.readouterr().out.strip()
    assert token.startswith("gst_") and len(token) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in path.read_text()
    assert read_tokens(path) == [TokenEntry(name="ci", team="ml", role="submitter", hash=hash_token(token))]

    with pytest.raises(SystemExit):
        gpusched(["token", "create", "--name", "ci", "--team", "ml", "--role", "operator", "--file", str(path)])
    assert "exists" in capsys.readouterr().err
    gpusched(["token", "create", "--name", "bot", "--team", "cv", "--role", "auditor", "--file", str(path), "--json"])
    created = json.loads(capsys.readouterr().out)
    assert TokenFile(path).authenticate(created["token"]) == auth.Principal("bot", "cv", "auditor")
    gpusched(["token", "revoke", "--name", "ci", "--file", str(path)])
    assert [e.name for e in read_tokens(path)] == ["bot"]


def test_token_commands_need_a_file(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(auth.TOKENS_ENV, raising=False)
    with pytest.raises(SystemExit):
        gpusched(["token", "list"])
    assert auth.TOKENS_ENV in capsys.readouterr().err


def test_the_client_sends_the_token_from_the_environment_or_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCHED_TOKEN", raising=False)
    monkeypatch.delenv("GPUSCHED_TOKEN_FILE", raising=False)
    assert "Authorization" not in Client("http://x")._headers()
    (tmp_path / "token").write_text(TOKENS["alice"] + "\n")
    monkeypatch.setenv("GPUSCHED_TOKEN_FILE", str(tmp_path / "token"))
    assert Client("http://x")._headers()["Authorization"] == f"Bearer {TOKENS['alice']}"
    monkeypatch.setenv("GPUSCHED_TOKEN", TOKENS["olga"])  # the variable wins over the file
    assert Client("http://x")._headers()["Authorization"] == f"Bearer {TOKENS['olga']}"
    assert Client("http://x", token="explicit")._headers()["Authorization"] == "Bearer explicit"
