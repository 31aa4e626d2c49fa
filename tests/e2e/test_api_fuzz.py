"""Fuzzing the public API from its own OpenAPI document: schemathesis's engine (what `schemathesis run` drives)
generates requests for every operation -- boundary values first (its coverage phase), then random schema-valid
and schema-violating ones -- against the whole platform with authentication on. At least 1,000 requests in
all; no answer may be a 5xx, and every error carries a JSON body with a `code` and a `message` (a check of
ours). The built-in checks also hold every answer to the documented status codes, content types, headers
and schemas, want an unknown method answered 405 with `Allow`, and a request without a token refused.

The random part differs from run to run; a failure prints its seed: GPUSCHED_FUZZ_SEED=<seed> replays it.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.engine import events, from_schema

from libs.cli.client import Client
from libs.runtime.api_tokens import TOKENS_ENV, TokenEntry, hash_token, new_token, write_tokens
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e

MIN_REQUESTS = 1000
OPERATIONS = 20


@schemathesis.check
def error_bodies_carry_a_code_and_a_message(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every error answer is JSON with a string `code` and a string `message`."""
    if response.status_code < 400:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} without a JSON body: {response.content[:200]!r}") from None
    if not (isinstance(body, dict) and isinstance(body.get("code"), str) and isinstance(body.get("message"), str)):
        raise AssertionError(f"{response.status_code} without a code and a message: {body!r}")
    return True


@dataclass
class Api:
    base: str
    tokens: dict[str, str]


@dataclass
class Run:
    """What one engine run did: requests per operation, answers per status, failures found."""

    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def scenario(self, recorder: Any) -> None:
        for interaction in recorder.interactions.values():
            self.requests[recorder.label] += 1
            if interaction.response is not None:
                self.statuses[interaction.response.status_code] += 1
        for checks in recorder.checks.values():
            self.failures += [f"{recorder.label}: {c.name}: {c.failure_info.failure.title}\n  "
                              f"{c.failure_info.code_sample}" for c in checks if c.failure_info is not None]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, nats_server: EmbeddedServer,
        redis_server: EmbeddedServer) -> Iterator[Api]:
    data = Path(tmp_path_factory.mktemp("api-fuzz"))
    tokens = {"operator": new_token(), "submitter": new_token()}
    write_tokens(data / "tokens.json", [
        TokenEntry(name="fuzz-operator", team="platform", role="operator", hash=hash_token(tokens["operator"])),
        TokenEntry(name="fuzz-submitter", team="demo", role="submitter", hash=hash_token(tokens["submitter"])),
    ])
    stream = f"T{uuid.uuid4().hex[:12].upper()}"
    env = {"GPUSCHED_STREAM": stream, "GPUSCHED_SUBJECT_PREFIX": stream.lower(), "GPUSCHED_TICK_SECONDS": "1",
           TOKENS_ENV: str(data / "tokens.json")}
    with pytest.MonkeyPatch.context() as mp:  # start_platform uses the session's servers when these are set
        mp.setenv("NATS_URL", nats_server.url)
        mp.setenv("REDIS_URL", redis_server.url)
        sup, servers, _ = start_platform(data, DEFAULT_CLUSTER, DEFAULT_POLICY, api_port=free_port(), extra_env=env)
    assert servers == []
    try:
        base = f"http://127.0.0.1:{sup.ports['admission']}"
        client = Client(base, token=tokens["operator"])
        wait_for(lambda: len(client.nodes()) == 9 and len(client.queues()) == 5, "the demo cluster never registered")
        yield Api(base, tokens)
    finally:
        sup.stop()


def engine_run(api: Api, token: str, seed: int, examples: int, mode: str, coverage: bool) -> Run:
    config = schemathesis.Config.from_dict({
        "base-url": api.base, "headers": {"Authorization": f"Bearer {token}"}, "workers": 1, "seed": seed,
        "generation": {"max-examples": examples, "mode": mode},
        "phases": {"coverage": {"enabled": coverage}, "stateful": {"enabled": False}},
        # It wants 2xx for any schema-valid request; but a valid job may name a team without a queue (422)
        # or a job that does not exist (404): the right answer, just not a success.
        "checks": {"positive_data_acceptance": {"enabled": False}},
    })
    schema = schemathesis.openapi.from_url(f"{api.base}/openapi.json", config=config)
    assert len(list(schema.get_all_operations())) == OPERATIONS
    run = Run()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
            run.scenario(event.recorder)
        elif isinstance(event, events.NonFatalError | events.FatalError):
            run.failures.append(f"engine error: {event.__class__.__name__}: "
                                f"{getattr(event, 'value', getattr(event, 'exception', ''))}")
    return run


def test_a_thousand_generated_requests_get_no_server_error_and_only_documented_answers(api: Api) -> None:
    seed = int(os.environ.get("GPUSCHED_FUZZ_SEED") or random.getrandbits(64))
    started = time.monotonic()
    # The operator reaches every handler's depths; a submitter meets the role and team checks on the way.
    operator = engine_run(api, api.tokens["operator"], seed, examples=60, mode="all", coverage=True)
    submitter = engine_run(api, api.tokens["submitter"], seed, examples=15, mode="positive", coverage=False)
    requests = operator.requests + submitter.requests
    statuses = operator.statuses + submitter.statuses
    print(f"\n{requests.total()} requests in {time.monotonic() - started:.1f}s (seed {seed}); by operation: "
          f"{dict(requests)}; by status: {dict(sorted(statuses.items()))}")

    failures = operator.failures + submitter.failures
    assert not failures, f"GPUSCHED_FUZZ_SEED={seed}\n" + "\n".join(failures)
    assert requests.total() >= MIN_REQUESTS
    assert set(requests) == set(operator.requests) and len(requests) == OPERATIONS  # every operation was tried
    assert not [s for s in statuses if s >= 500]
    assert submitter.statuses[403] > 0  # the role checks were met


def get(api: Api, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(api.base + path, headers={"Authorization": f"Bearer {api.tokens['operator']}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_what_fuzzing_found_stays_fixed(api: Api) -> None:
    # An offset past what Redis can index was a 500; it is a page past the end.
    assert get(api, f"/v1/jobs?offset={10**22}&limit=3") == (200, [])
    # An unknown parameter was ignored, so a typo listed everything; it is refused.
    status, body = get(api, "/v1/jobs?stat=running")
    assert (status, body["code"]) == (400, "unknown_parameter") and "'stat'" in body["message"]
    assert get(api, "/v1/jobs/x/logs?tial=5")[1]["code"] == "unknown_parameter"
