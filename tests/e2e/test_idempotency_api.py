"""Idempotency keys through the whole platform (real NATS, Redis and services, the demo cluster and policy): the
same key and spec answer 200 with the stored spec and the job's true state; the same key with another spec
answers 409 `idempotency_key_reused` naming the fields that differ; `gpusched submit --json` prints what the API
answered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from libs.cli.client import Client
from libs.cli.main import main
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY
from libs.runtime.supervisor import Supervisor
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, nats_server: EmbeddedServer,
        redis_server: EmbeddedServer) -> Iterator[str]:
    data = Path(tmp_path_factory.mktemp("idempotency"))
    stream = f"T{uuid.uuid4().hex[:12].upper()}"
    env = {"GPUSCHED_STREAM": stream, "GPUSCHED_SUBJECT_PREFIX": stream.lower(), "GPUSCHED_TICK_SECONDS": "1"}
    with pytest.MonkeyPatch.context() as mp:  # start_platform uses the session's servers when these are set
        mp.setenv("NATS_URL", nats_server.url)
        mp.setenv("REDIS_URL", redis_server.url)
        sup: Supervisor
        sup, servers, _ = start_platform(data, DEFAULT_CLUSTER, DEFAULT_POLICY, api_port=free_port(), extra_env=env)
    assert servers == []
    try:
        base = f"http://127.0.0.1:{sup.ports['admission']}"
        wait_for(lambda: len(Client(base).nodes()) == 9, "the demo cluster never registered", timeout=60)
        yield base
    finally:
        sup.stop()


def post(base: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(base + "/v1/jobs", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_key_names_one_job_and_another_spec_under_it_is_409(api: str, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = {"team": "demo", "queue": "demo", "duration_s": 1.0, "idempotency_key": "train-7", "name": "first"}
    status, created = post(api, spec)
    assert (status, created["state"], created["spec"]) == (201, "pending", spec)

    status, error = post(api, {**spec, "gpus": 2, "name": "second"})
    assert (status, error["code"]) == (409, "idempotency_key_reused")
    assert "gpus (stored 1, sent 2)" in error["message"] and 'name (stored "first", sent "second")' in error["message"]

    client = Client(api)
    wait_for(lambda: client.job(created["id"])["state"] == "succeeded", "the job never succeeded", timeout=30)
    status, again = post(api, spec)
    assert (status, again) == (200, {"id": created["id"], "state": "succeeded", "duplicate": True, "spec": spec,
                                     "reason": "", "message": ""})
    status, error = post(api, {**spec, "duration_s": 2.0})  # over, its spec still holds the key
    assert (status, error["code"]) == (409, "idempotency_key_reused")
    assert "duration_s (stored 1.0, sent 2.0)" in error["message"]

    # The CLI prints the API's answer: the stored spec and the true state; another spec is an error (exit 2).
    monkeypatch.setenv("GPUSCHED_API", api)
    main(["submit", "--team", "demo", "--queue", "demo", "--duration", "1", "--key", "train-7", "--name", "first",
          "--json"])
    assert json.loads(capsys.readouterr().out) == again
    main(["submit", "--team", "demo", "--queue", "demo", "--duration", "1", "--key", "train-7", "--name", "first"])
    assert f"duplicate of existing job {created['id']} (succeeded)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["submit", "--team", "demo", "--queue", "demo", "--key", "train-7"])
    assert exit_.value.code == 2
    assert "409 idempotency_key_reused" in capsys.readouterr().err


def test_one_key_sent_twice_at_once_with_two_specs_makes_one_job(api: str) -> None:
    """Both requests arrive before the core has decided either: the API still holds the first one's spec."""
    specs = [{"team": "demo", "queue": "demo", "duration_s": 1.0, "idempotency_key": "race", "gpus": n}
             for n in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda s: post(api, s), specs))
    assert sorted(status for status, _ in answers) == [201, 409]
    created = next(body for status, body in answers if status == 201)
    status, again = post(api, created["spec"])
    assert (status, again["id"], again["duplicate"], again["spec"]) == (200, created["id"], True, created["spec"])
