"""`gpusched submit -f` and `gpusched logs -f` against a platform whose node agent runs jobs as processes: the
job file reaches the agent (command, enforced --time), `logs --tail` shows the last lines and says so on stderr,
`logs -f` prints the output as it comes until the job is final, and Ctrl-C stops following with exit code 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.runtime.embedded import EmbeddedServer, free_port

pytestmark = pytest.mark.e2e
GPUSCHED = [sys.executable, "-m", "libs.cli.main"]
# Prints a line, waits a little, five times: following it sees the output arrive.
TICKER = "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n"


def run(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUSCHED, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory, nats_server: EmbeddedServer,
            redis_server: EmbeddedServer) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("logs")
    stream = f"L{os.getpid()}{int(time.time())}"
    env = {**os.environ, "NATS_URL": nats_server.url, "REDIS_URL": redis_server.url, "GPUSCHED_STREAM": stream,
           "GPUSCHED_SUBJECT_PREFIX": stream.lower()}
    up = subprocess.Popen([*GPUSCHED, "up", "--data", str(data), "--port", str(free_port()), "--agents", "1",
                           "--agent-gpus", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoints, deadline = Path(data) / "endpoints.json", time.monotonic() + 150
        while not endpoints.exists():
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            assert time.monotonic() < deadline, "gpusched up --agents did not come up"
            time.sleep(0.2)
        yield {**env, "GPUSCHED_API": json.loads(endpoints.read_text())["api"]}
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)


def output(text: str) -> list[str]:
    """The job's own lines (the agent opens each run's log with a `== run ... ==` line)."""
    return [line for line in text.splitlines() if not line.startswith("== run ")]


def submit_file(env: dict[str, str], spec: dict[str, object], *flags: str) -> str:
    done = run("submit", "-f", "-", *flags, "--json", env=env, stdin=json.dumps(spec))
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def test_follow_prints_the_output_as_it_comes_until_the_job_is_final(cli_env: dict[str, str]) -> None:
    job = submit_file(cli_env, {"team": "demo", "queue": "demo", "command": [sys.executable, "-c", TICKER]},
                      "--time", "5m")
    followed = run("logs", job, "-f", env=cli_env)
    assert followed.returncode == 0, followed.stderr
    assert output(followed.stdout) == [f"tick {i}" for i in range(5)]
    assert followed.stderr.strip().splitlines()[-1] == f"-- job {job} succeeded, exit code 0 --"
    tail = run("logs", job, "--tail", "2", env=cli_env)
    assert tail.stdout == "tick 3\ntick 4\n"
    assert tail.stderr.startswith("-- 2 lines (whole log, ") and tail.stderr.endswith(" B, node agent-0) --\n")


def test_ctrl_c_stops_following_with_130_and_time_is_enforced(cli_env: dict[str, str]) -> None:
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    job = submit_file(cli_env, {"team": "demo", "queue": "demo", "command": sleeper}, "--time", "3s")
    follower = subprocess.Popen([*GPUSCHED, "logs", job, "--follow"], env=cli_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=10)
    assert follower.returncode == 130, err
    assert "Traceback" not in err
    # --time is a limit the agent enforces: the run is stopped and fails, never retried.
    ended = run("logs", job, "-f", env=cli_env)
    assert output(ended.stdout) == ["up"]
    assert f"-- job {job} failed (runtime_limit)" in ended.stderr
