"""A newcomer's first two steps, on the real platform as processes, with and without API tokens: the simulated
demo, then `gpusched up --agents 2` in the same folder. The demo's nodes leave (nobody serves them now) and
their job runs no more on them; jobs run as real processes on the agents; a cancel and a drain end; then
`up --fresh` starts afresh with the old log archived, not deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from libs.runtime.embedded import free_port

pytestmark = pytest.mark.e2e
GPUSCHED = [sys.executable, "-m", "libs.cli.main"]
DEMO_NODES = 9  # the simulated demo cluster (libs/runtime/settings.py DEFAULT_CLUSTER)


class Cli:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str) -> Any:
        # --json right after the command: before any `--` and the job's own command line.
        done = subprocess.run([*GPUSCHED, args[0], "--json", *args[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"gpusched {' '.join(args)}: {done.stderr}"
        return json.loads(done.stdout)

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self("job", job_id))

    def until(self, what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            assert time.monotonic() < deadline, f"not within {timeout:g}s: {what}"
            time.sleep(0.3)


@contextmanager
def platform(data: Path, env: dict[str, str], *args: str) -> Iterator[tuple[str, str]]:
    """`gpusched up ARGS` on `data` until the block ends (then Ctrl-C); yields the API and up's output so far."""
    up = subprocess.Popen([*GPUSCHED, "up", "--data", str(data), "--port", str(free_port()), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150  # generous: shared CI machines start processes slowly
        endpoints = data / "endpoints.json"
        while not endpoints.exists():
            if up.poll() is not None:
                pytest.fail(f"gpusched up {' '.join(args)} exited: {up.stdout.read() if up.stdout else ''}")
            assert time.monotonic() < deadline, "gpusched up did not come up"
            time.sleep(0.2)
        yield json.loads(endpoints.read_text())["api"], ""
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=60)
    assert up.returncode == 0, output
    assert "stopped." in output


def nodes_of(job: dict[str, Any]) -> set[str]:
    return {p["node"] for p in job.get("placements", [])}


@pytest.mark.parametrize("auth", [False, True], ids=["open-api", "api-tokens"])
def test_demo_then_agents_then_fresh(tmp_path: Path, auth: bool) -> None:
    data = tmp_path / "data"
    # The platform's own NATS and Redis under `data`, as a newcomer's `gpusched up` has them.
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "REDIS_URL", "GPUSCHED_API",
                                                           "GPUSCHED_TOKEN", "GPUSCHED_TOKEN_FILE")}
    env["GPUSCHED_NODE_LOST_AFTER_S"] = "4"
    cli_env = dict(env)
    if auth:
        tokens = tmp_path / "tokens.json"
        made = subprocess.run([*GPUSCHED, "token", "create", "--file", str(tokens), "--name", "ops", "--team", "demo",
                               "--role", "operator", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        env["GPUSCHED_API_TOKENS_FILE"] = str(tokens)  # `up` itself is given no token
        cli_env = {**env, "GPUSCHED_TOKEN": json.loads(made.stdout)["token"]}

    # 1. The simulated demo: a long job runs on one of its nodes.
    with platform(data, env) as (api, _):
        cli = Cli({**cli_env, "GPUSCHED_API": api})
        long_job = cli("submit", "--team", "demo", "--queue", "demo", "--gpus", "1", "--duration", "3600")["id"]
        cli.until("the long job runs", lambda: cli.job(long_job)["state"] == "running")
        demo_nodes = {n["name"] for n in cli("nodes")}
        assert len(demo_nodes) == DEMO_NODES and nodes_of(cli.job(long_job)) <= demo_nodes

    # 2. The README's next step in the same folder: node agents. Nobody serves the demo's nodes any more.
    with platform(data, env, "--agents", "2", "--agent-gpus", "2") as (api, _):
        cli = Cli({**cli_env, "GPUSCHED_API": api})
        cli.until("only the agents' nodes are listed",
                  lambda: sorted(n["name"] for n in cli("nodes")) == ["agent-0", "agent-1"])
        # The demo's job is off the ghost node: requeued, then refused by the agents (it has no command to run).
        ended = cli.until("the demo's job leaves its node", lambda: (j := cli.job(long_job))["state"] in (
            "failed", "pending", "succeeded") and not (nodes_of(j) & demo_nodes) and j)
        assert not nodes_of(ended) & demo_nodes
        timeline = subprocess.run([*GPUSCHED, "audit", "timeline", long_job, "--json"],
                                  env={**cli.env, **_nats_env(data)}, capture_output=True, text=True, timeout=60)
        assert timeline.returncode == 0, timeline.stderr
        assert any(e["type"] == "JobEvicted" and "node_lost" in json.dumps(e) for e in json.loads(timeline.stdout))

        # A real process runs to the end on an agent.
        done = cli("submit", "--team", "demo", "--queue", "demo", "--gpus", "1", "--",
                   sys.executable, "-c", "print('hello from an agent')")["id"]
        cli.until("the process job succeeds", lambda: cli.job(done)["state"] == "succeeded")

        # A cancel ends.
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        cancelled = cli("submit", "--team", "demo", "--queue", "demo", "--gpus", "1", "--", *sleeper)["id"]
        cli.until("the sleeper runs", lambda: cli.job(cancelled)["state"] == "running")
        cli("cancel", cancelled)
        cli.until("the cancel ends", lambda: cli.job(cancelled)["state"] == "cancelled", timeout=60)

        # A drain ends: the node's job stops there, and nothing runs on it afterwards.
        moved = cli("submit", "--team", "demo", "--queue", "demo", "--gpus", "2", "--", *sleeper)["id"]
        node = cli.until("the job to drain runs", lambda: cli.job(moved)["state"] == "running"
                         and sorted(nodes_of(cli.job(moved)))[0])
        cli("node", "drain", node, "--reason", "newcomer's drain")
        cli.until("the drained node holds no job", lambda: all(
            n["allocated_gpus"] == 0 for n in cli("nodes") if n["name"] == node), timeout=60)
        cli.until("the drained job runs elsewhere or waits", lambda: node not in nodes_of(cli.job(moved)))
        cli("cancel", moved)

        # An operator removes the drained node: it leaves the inventory (audited), the other one stays.
        cli("node", "remove", node, "--reason", "decommissioned")
        cli.until("the removed node is gone", lambda: [n["name"] for n in cli("nodes")] == sorted(
            {"agent-0", "agent-1"} - {node}))
        # A job still running on an agent when the platform goes back to the demo.
        left = cli("submit", "--team", "demo", "--queue", "demo", "--gpus", "1", "--duration", "2", "--",
                   *sleeper)["id"]
        agent_nodes = {"agent-0", "agent-1"}
        cli.until("the job left behind runs on an agent", lambda: cli.job(left)["state"] == "running"
                  and nodes_of(cli.job(left)) <= agent_nodes)

    # 3. Back to the demo in the same folder: the agents' nodes leave, and the job left on one runs on the demo's.
    with platform(data, env) as (api, _):
        cli = Cli({**cli_env, "GPUSCHED_API": api})
        cli.until("only the demo's nodes are listed", lambda: {n["name"] for n in cli("nodes")} == demo_nodes)
        cli.until("the job left on an agent ends on the demo's nodes", lambda: cli.job(left)["state"] == "succeeded",
                  timeout=120)
        runs = cli.job(left)["runs"]
        assert {p["node"] for p in runs[-1]["placements"]} <= demo_nodes

    # 4. The demo again, afresh: the old log is archived, not deleted; nothing of it is left in the platform.
    with platform(data, env, "--fresh") as (api, _):
        cli = Cli({**cli_env, "GPUSCHED_API": api})
        archives = list((data / "archive").iterdir())
        assert len(archives) == 1 and (archives[0] / "nats").is_dir() and (archives[0] / "audit.key").exists()
        cli.until("the demo's nodes, and only them", lambda: len(cli("nodes")) == DEMO_NODES)
        assert cli("jobs", "-A") == []


def _nats_env(data: Path) -> dict[str, str]:
    """Where the running platform's NATS is (for the commands that read the log itself)."""
    endpoints = json.loads((data / "endpoints.json").read_text())
    return {"NATS_URL": endpoints["NATS_URL"]}

