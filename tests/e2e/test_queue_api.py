"""The operator's queue API and CLI against the whole platform (real NATS and Redis, the demo policy): read the
queue tree, change a queue, create one, refuse bad changes without touching the log, and show borrowing.

One platform serves the whole module; the tests run in file order and each leaves the tree as the next
expects (demo's nominal changed to 12, queue "vision" added, demo's jobs cancelled)."""

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

from contracts import QueuePolicyChanged
from contracts.codec import decode
from libs.audit.log_reader import read_log
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import ApiError, Client
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY, REPO_ROOT
from libs.runtime.supervisor import Supervisor
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

GPUSCHED = str(REPO_ROOT / ".venv" / "bin" / "gpusched")
LEAVES = ("demo", "platform", "product", "research")


@dataclass
class Platform:
    sup: Supervisor
    client: Client
    nats_url: str
    stream: str

    @property
    def api(self) -> str:
        return self.client.base

    def bus_config(self) -> BusConfig:
        return BusConfig(url=self.nats_url, stream=self.stream, subject_prefix=self.stream.lower())


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, nats_server: EmbeddedServer,
             redis_server: EmbeddedServer) -> Iterator[Platform]:
    data = Path(tmp_path_factory.mktemp("queue-api"))
    stream = f"T{uuid.uuid4().hex[:12].upper()}"
    env = {"GPUSCHED_STREAM": stream, "GPUSCHED_SUBJECT_PREFIX": stream.lower(), "GPUSCHED_TICK_SECONDS": "1"}
    with pytest.MonkeyPatch.context() as mp:  # start_platform uses the session's servers when these are set
        mp.setenv("NATS_URL", nats_server.url)
        mp.setenv("REDIS_URL", redis_server.url)
        sup, servers, _ = start_platform(data, DEFAULT_CLUSTER, DEFAULT_POLICY, api_port=free_port(), extra_env=env)
    assert servers == []
    try:
        client = Client(f"http://127.0.0.1:{sup.ports['admission']}")
        wait_for(lambda: len(client.nodes()) == 9 and len(client.queues()) == 5, "the demo cluster never registered")
        yield Platform(sup=sup, client=client, nats_url=nats_server.url, stream=stream)
    finally:
        sup.stop()


def queues_by_name(client: Client) -> dict[str, dict[str, Any]]:
    return {q["name"]: q for q in client.queues()}


def http(platform: Platform, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(platform.api + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def put_queue(platform: Platform, name: str, spec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return http(platform, "PUT", f"/v1/queues/{name}", json.dumps(spec).encode())


def queue_changes(platform: Platform) -> list[tuple[int, QueuePolicyChanged]]:
    """Every QueuePolicyChanged in the platform's log, with its sequence."""
    async def read() -> list[tuple[int, bytes]]:
        bus = await Bus.connect(platform.bus_config())
        try:
            return await read_log(bus)
        finally:
            await bus.close()

    raw = asyncio.run(read())
    events = [(seq, decode(data)) for seq, data in raw]
    return [(seq, e) for seq, e in events if isinstance(e, QueuePolicyChanged)]


def cli(platform: Platform, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUSCHED_API": platform.api, "COLUMNS": "200"}  # wide enough for the table
    return subprocess.run([GPUSCHED, *args], env=env, capture_output=True, text=True, timeout=30)


def test_the_demo_tree_is_listed_with_figures_per_flavor(platform: Platform) -> None:
    queues = queues_by_name(platform.client)
    assert sorted(queues) == ["acme", *LEAVES]
    acme = queues["acme"]
    assert (acme["parent"], acme["flavors"]) == ("", [])
    assert acme["nominal_gpus"] == sum(queues[n]["nominal_gpus"] for n in LEAVES) == 16 + 16 + 12 + 8
    for name in LEAVES:
        q = queues[name]
        assert (q["parent"], q["cohort"], q["team"]) == ("acme", "acme", name)
        assert [f["flavor"] for f in q["flavors"]] == ["*"]
        assert q["spec"]["name"] == name and q["spec"]["parent"] == "acme"
        f = q["flavors"][0]
        assert f["nominal_gpus"] == q["nominal_gpus"]
        assert (f["in_use_gpus"], f["borrowed_gpus"], f["lent_gpus"]) == (0.0, 0.0, 0.0)
    flavor = {n: queues[n]["flavors"][0] for n in LEAVES}
    assert (flavor["demo"]["nominal_gpus"], flavor["demo"]["borrowing_limit_gpus"]) == (16.0, 16.0)
    assert flavor["research"]["borrowing_limit_gpus"] is None
    assert flavor["product"]["lending_limit_gpus"] == 4.0  # only 4 of its 12 are lent
    assert flavor["demo"]["lending_limit_gpus"] is None  # all of its nominal
    assert queues["research"]["spec"]["user_max_gpus"] == 8
    assert queues["platform"]["budget_gpu_hours"] == 500.0
    assert queues["platform"]["budget_left_gpu_hours"] == 500.0
    assert queues["demo"]["budget_left_gpu_hours"] is None
    assert http(platform, "GET", "/v1/queues/demo") == (200, queues["demo"])
    assert http(platform, "GET", "/v1/queues/nosuch")[0] == 404


def test_a_changed_nominal_is_served_after_projection_and_logged_as_the_operators(platform: Platform) -> None:
    before = platform.client.queue("demo")["spec"]
    status, written = put_queue(platform, "demo", {**before, "nominal_gpus": 12})
    assert status == 200
    assert written == {**before, "nominal_gpus": 12}
    view = wait_for(lambda: (q := platform.client.queue("demo"))["nominal_gpus"] == 12 and q,
                    "GET /v1/queues/demo never showed the new nominal")
    assert view["spec"] == written and view["flavors"][0]["nominal_gpus"] == 12.0
    assert view["flavors"][0]["borrowing_limit_gpus"] == 16.0  # the other fields are as before
    assert platform.client.queue("acme")["nominal_gpus"] == 12 + 16 + 12 + 8
    changes = [e for _, e in queue_changes(platform) if e.queue.name == "demo"]
    assert len(changes) == 2  # the policy file's, then the operator's
    assert changes[-1].source == "operator" and changes[-1].queue.nominal_gpus == 12
    # The same spec again changes nothing, and logs nothing.
    assert put_queue(platform, "demo", written) == (200, written)
    assert len([e for _, e in queue_changes(platform) if e.queue.name == "demo"]) == 2


def test_a_new_queue_under_acme_admits_jobs_and_the_parent_takes_none(platform: Platform) -> None:
    spec = {"name": "vision", "team": "vision", "parent": "acme",
            "flavors": [{"model": "A100", "nominal_gpus": 4, "borrowing_limit_gpus": 0}]}
    status, written = put_queue(platform, "vision", spec)
    assert (status, written) == (201, spec)
    # Until accounting has projected it, the API answers with what it knows of the queue (no cohort yet).
    view = wait_for(lambda: (q := platform.client.queue("vision")) and q["cohort"] and q,
                    "the new queue was never projected")
    assert (view["cohort"], view["nominal_gpus"], view["spec"]) == ("acme", 4, spec)
    assert [(f["flavor"], f["nominal_gpus"], f["borrowing_limit_gpus"]) for f in view["flavors"]] == [
        ("A100", 4.0, 0.0)]
    job = {"team": "vision", "queue": "vision", "gpus": 2, "duration_s": 2.0, "priority": "training"}
    # Admission learns of the queue from the log too: until it has, the team is unknown.
    created = wait_for(lambda: platform.client.submit(job), "admission never learned of queue vision")
    placed = wait_for(lambda: (j := platform.client.job(created["id"]))["placements"] and j,
                      "the job on the new queue was never admitted and placed")
    models = {n["name"]: n["models"] for n in platform.client.nodes()}
    assert placed["admitted_at"] is not None
    assert all(models[p["node"]] == ["A100"] for p in placed["placements"])  # the queue's only flavor
    wait_for(lambda: platform.client.job(created["id"])["state"] == "succeeded", "the job never completed")
    assert wait_for(lambda: platform.client.queue("acme")["nominal_gpus"] == 12 + 16 + 12 + 8 + 4, "acme's sum")
    with pytest.raises(ApiError) as err:
        platform.client.submit({"team": "acme", "queue": "acme", "gpus": 1})
    assert (err.value.status, err.value.code) == (422, "queue_not_leaf")


def test_bad_changes_are_refused_with_a_code_and_never_logged(platform: Platform) -> None:
    logged = queue_changes(platform)
    demo = platform.client.queue("demo")["spec"]
    acme = platform.client.queue("acme")["spec"]
    for path, body, status, code in (
        ("demo", b"{not json", 400, "malformed_json"),
        ("demo", json.dumps({**demo, "nominal_gpus": "lots"}).encode(), 400, "invalid_request"),
        ("demo", json.dumps({**demo, "colour": "blue"}).encode(), 400, "invalid_request"),
        ("demo", json.dumps({"team": "demo"}).encode(), 400, "invalid_request"),
        ("demo", json.dumps({**demo, "name": "research"}).encode(), 422, "name_mismatch"),
        ("ghost", json.dumps({"name": "ghost", "team": "ghost", "parent": "nobody"}).encode(), 422, "invalid_queue"),
        ("acme", json.dumps({**acme, "parent": "demo"}).encode(), 422, "invalid_queue"),
        ("demo", json.dumps({**demo, "nominal_gpus": -4}).encode(), 422, "invalid_queue"),
        ("ghost", json.dumps({"name": "ghost", "team": "ghost", "parent": "acme",
                              "flavors": [{"model": "A100", "nominal_gpus": -1}]}).encode(), 422, "invalid_queue"),
    ):
        answer = http(platform, "PUT", f"/v1/queues/{path}", body)
        assert (answer[0], answer[1]["code"]) == (status, code), (path, body)
        assert answer[1]["message"]
    time.sleep(0.3)  # anything published would be in the log by now
    assert queue_changes(platform) == logged
    assert platform.client.queue("demo")["spec"] == demo
    assert http(platform, "GET", "/v1/queues/ghost")[0] == 404


def test_borrowing_shows_as_borrowed_by_demo_and_lent_by_its_cohort(platform: Platform) -> None:
    nominal = platform.client.queue("demo")["nominal_gpus"]
    assert nominal == 12
    ids = [platform.client.submit({"team": "demo", "queue": "demo", "gpus": 8, "duration_s": 30.0,
                                   "priority": "training", "name": f"borrow-{i}"})["id"] for i in range(3)]
    try:
        demo = wait_for(lambda: (q := queues_by_name(platform.client)["demo"])["flavors"][0]["in_use_gpus"] == 24
                        and q, "demo never got its three jobs' quota")
        assert demo["flavors"][0]["borrowed_gpus"] == 24 - nominal
        done = cli(platform, "queues", "--json")
        assert done.returncode == 0, done.stderr
        queues = {q["name"]: q for q in json.loads(done.stdout)}
        flavors = [f for q in queues.values() for f in q["flavors"]]
        lent = {n: sum(f["lent_gpus"] for f in q["flavors"]) for n, q in queues.items()}
        assert queues["demo"]["flavors"][0]["borrowed_gpus"] == 24 - nominal
        assert lent["demo"] == 0 and any(lent[n] > 0 for n in LEAVES if n != "demo")
        assert sum(f["lent_gpus"] for f in flavors) == sum(f["borrowed_gpus"] for f in flavors) == 24 - nominal
        # Borrowing is attributed to idle lenders in name order: platform's 8, then product's lendable 4.
        assert {n: lent[n] for n in LEAVES} == {"demo": 0, "platform": 8, "product": 4, "research": 0}
        table = cli(platform, "queues")
        assert table.returncode == 0, table.stderr
        assert "demo" in table.stdout and "vision" in table.stdout and "A100" in table.stdout
    finally:
        for job_id in ids:
            try:
                platform.client.cancel(job_id)
            except ApiError as err:
                assert err.code in {"job_final", "unknown_job"}
    wait_for(lambda: queues_by_name(platform.client)["demo"]["flavors"][0]["in_use_gpus"] == 0,
             "demo's quota was never released after the cancellations")
    queues = queues_by_name(platform.client)
    assert all(f["lent_gpus"] == 0 for q in queues.values() for f in q["flavors"])


def test_queue_set_changes_only_the_given_fields_and_creates_queues(platform: Platform) -> None:
    before = platform.client.queue("demo")["spec"]
    done = cli(platform, "queue", "set", "demo", "--borrowing-limit", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {**before, "borrowing_limit_gpus": 2}
    # The spec is admission's own; the flavors' figures are accounting's projection, a batch behind: wait for both.
    view = wait_for(lambda: (q := platform.client.queue("demo"))["spec"].get("borrowing_limit_gpus") == 2
                    and q["flavors"][0]["borrowing_limit_gpus"] == 2.0 and q,
                    "the borrowing limit never reached the view")
    assert view["spec"] == {**before, "borrowing_limit_gpus": 2}
    assert view["flavors"][0]["borrowing_limit_gpus"] == 2.0 and view["nominal_gpus"] == before["nominal_gpus"]

    done = cli(platform, "queue", "set", "newq", "--team", "x", "--parent", "acme", "--flavor", "A100=4:2")
    assert done.returncode == 0, done.stderr
    assert "created" in done.stdout
    # (Admission answers with the spec it logged at once; the flavors come with accounting's projection.)
    view = wait_for(lambda: (q := platform.client.queue("newq"))["flavors"] and q, "queue newq was never projected")
    assert view["spec"] == {"name": "newq", "team": "x", "parent": "acme",
                            "flavors": [{"model": "A100", "nominal_gpus": 4, "borrowing_limit_gpus": 2}]}
    assert [(f["flavor"], f["nominal_gpus"], f["borrowing_limit_gpus"]) for f in view["flavors"]] == [
        ("A100", 4.0, 2.0)]

    logged = queue_changes(platform)
    for bad in ("bad", "A100=", "=4", "A100=four"):
        done = cli(platform, "queue", "set", "demo", "--flavor", bad)
        assert done.returncode != 0, bad
        assert "error" in done.stderr and "--flavor" in done.stderr, done.stderr
    done = cli(platform, "queue", "set", "demo", "--weight", "-1")
    assert done.returncode != 0 and "invalid_queue" in done.stderr
    assert queue_changes(platform) == logged
