"""The README's promise, as a user runs it: `gpusched up` brings the platform up, `gpusched submit` then
`gpusched jobs` show a job go from submitted to succeeded, Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.runtime.embedded import EmbeddedServer, free_port, port_open

pytestmark = pytest.mark.e2e
GPUSCHED = [sys.executable, "-m", "libs.cli.main"]


def run(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([*GPUSCHED, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_up_submit_jobs_and_ctrl_c(tmp_path: Path, nats_server: EmbeddedServer, redis_server: EmbeddedServer,
                                   stream_name: str) -> None:
    port = free_port()
    env = {**os.environ, "NATS_URL": nats_server.url, "REDIS_URL": redis_server.url,
           "GPUSCHED_STREAM": stream_name, "GPUSCHED_SUBJECT_PREFIX": stream_name.lower()}
    up = subprocess.Popen([*GPUSCHED, "up", "--data", str(tmp_path), "--port", str(port)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150  # generous: CI machines are shared and slow to start processes
        endpoints = tmp_path / "endpoints.json"
        while not endpoints.exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "gpusched up did not come up"
            time.sleep(0.2)
        api = json.loads(endpoints.read_text())["api"]
        cli_env = {**env, "GPUSCHED_API": api}
        created = json.loads(run("submit", "--team", "demo", "--queue", "demo", "--gpus", "2", "--duration", "2",
                                 "--json", env=cli_env))
        job_id = created["id"]
        deadline = time.monotonic() + 90
        seen = []
        while time.monotonic() < deadline:
            state = json.loads(run("job", job_id, "--json", env=cli_env))["state"]
            if not seen or seen[-1] != state:
                seen.append(state)
            if state == "succeeded":
                break
            time.sleep(0.2)
        assert seen[-1] == "succeeded", seen
        assert set(seen) <= {"pending", "running", "succeeded"}
        shown = json.loads(run("job", job_id, "--json", env=cli_env))
        assert shown["started_at"] is not None and shown["finished_at"] >= shown["started_at"] + 1.9
        table = run("jobs", "-A", env=cli_env)  # finished jobs too (the default table shows active ones)
        assert job_id[:8] in table and "succeeded" in table
        assert job_id[:8] not in run("jobs", env=cli_env)
        listed = json.loads(run("jobs", "--json", env=cli_env))
        assert [j["state"] for j in listed if j["id"] == job_id] == ["succeeded"]
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=30)
    assert up.returncode == 0, output
    assert "stopped." in output
    assert not port_open(port)  # the services went with it


def test_up_with_node_agents_runs_a_command_and_shows_its_log(tmp_path: Path, nats_server: EmbeddedServer,
                                                              redis_server: EmbeddedServer, stream_name: str) -> None:
    env = {**os.environ, "NATS_URL": nats_server.url, "REDIS_URL": redis_server.url,
           "GPUSCHED_STREAM": stream_name, "GPUSCHED_SUBJECT_PREFIX": stream_name.lower()}
    up = subprocess.Popen([*GPUSCHED, "up", "--data", str(tmp_path), "--port", str(free_port()), "--agents", "2",
                           "--agent-gpus", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150
        endpoints = tmp_path / "endpoints.json"
        while not endpoints.exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "gpusched up --agents did not come up"
            time.sleep(0.2)
        cli_env = {**env, "GPUSCHED_API": json.loads(endpoints.read_text())["api"]}
        nodes = json.loads(run("nodes", "--json", env=cli_env))
        assert sorted(n["name"] for n in nodes) == ["agent-0", "agent-1"]
        created = json.loads(run("submit", "--team", "demo", "--queue", "demo", "--gpus", "2", "--json", "--",
                                 sys.executable, "-c", "import os; print('GPUs', os.environ['CUDA_VISIBLE_DEVICES'])",
                                 env=cli_env))
        deadline = time.monotonic() + 60
        while json.loads(run("job", created["id"], "--json", env=cli_env))["state"] != "succeeded":
            assert time.monotonic() < deadline, "the command never succeeded"
            time.sleep(0.2)
        assert "GPUs SIM-agent-" in run("logs", created["id"], env=cli_env)
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=30)
    assert up.returncode == 0, output
