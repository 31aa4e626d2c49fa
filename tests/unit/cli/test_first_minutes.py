"""What a new user meets first: servers that start from a relative data folder, a failure that names the
server and its own words and leaves nothing running, a CLI that finds the local platform by itself and that
fails within seconds naming the address it tried, and an API that is still starting asked again."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.cli.endpoints import api_endpoint, nats_endpoint
from libs.runtime import embedded, platform
from libs.runtime.embedded import StartError, free_port, port_open, start_redis
from libs.runtime.settings import DEFAULT_CLUSTER, DEFAULT_POLICY

FAILING_REDIS = """#!/bin/sh
echo "*** FATAL CONFIG FILE ERROR ***"
echo "Can't open the log file: No such file or directory"
exit 1
"""


@pytest.fixture
def failing_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "redis-server"
    script.write_text(FAILING_REDIS)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("NATS_URL", "REDIS_URL", "GPUSCHED_API", "GPUSCHED_DATA", "GPUSCHED_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_redis_starts_from_a_relative_data_folder(clean_env: Path) -> None:
    server = start_redis(Path(".data") / "redis")
    try:
        assert port_open(server.port)
        assert server.log_path is not None and server.log_path.is_absolute()
        assert (clean_env / ".data" / "redis" / "redis.log").exists()
    finally:
        server.stop()


def test_a_server_that_fails_is_named_with_what_it_said(clean_env: Path, failing_redis: None) -> None:
    with pytest.raises(StartError) as caught:
        start_redis(Path(".data") / "redis")
    message = str(caught.value)
    assert "redis" in message and "exited with code 1" in message
    assert "Can't open the log file" in message


def test_a_failed_start_stops_what_it_had_started(clean_env: Path, failing_redis: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[embedded.EmbeddedServer] = []
    real_start_nats = platform.start_nats

    def recording_start_nats(data_dir: Path, port: int | None = None) -> embedded.EmbeddedServer:
        started.append(real_start_nats(data_dir, port))
        return started[-1]

    monkeypatch.setattr(platform, "start_nats", recording_start_nats)
    with pytest.raises(StartError, match="redis"):
        platform.start_platform(Path(".data"), DEFAULT_CLUSTER, DEFAULT_POLICY, free_port(), own_servers=True)
    assert len(started) == 1
    assert started[0].proc.poll() is not None, "the NATS server outlived the failed start"
    assert not port_open(started[0].port)


def test_the_cli_finds_the_local_platform_and_says_where_from(clean_env: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (clean_env / ".data").mkdir()
    endpoints = clean_env / ".data" / "endpoints.json"
    endpoints.write_text(json.dumps({"api": "http://127.0.0.1:18080", "NATS_URL": "nats://127.0.0.1:14222"}))
    assert api_endpoint().value == "http://127.0.0.1:18080"
    assert nats_endpoint().value == "nats://127.0.0.1:14222"
    assert nats_endpoint().source == str(endpoints.resolve())
    monkeypatch.setenv("NATS_URL", "nats://10.0.0.1:4222")
    assert nats_endpoint().value == "nats://10.0.0.1:4222" and nats_endpoint().source == "NATS_URL"


def test_an_unreachable_nats_fails_within_seconds_naming_it() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        asyncio.run(Bus.connect_once(BusConfig(url=f"nats://127.0.0.1:{port}"), "NATS_URL", timeout_s=3))
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(caught.value) and "NATS_URL" in str(caught.value)


def test_an_unreachable_api_names_the_address_and_its_source() -> None:
    port = free_port()
    with pytest.raises(Exception) as caught:
        Client(f"http://127.0.0.1:{port}").jobs()
    assert f"127.0.0.1:{port}" in str(caught.value) and "the caller" in str(caught.value)


class _StartingApi(BaseHTTPRequestHandler):
    """503 not_ready for the first two requests, as an API whose inventory is not known yet; then 200."""

    answered = 0

    def do_GET(self) -> None:
        type(self).answered += 1
        if type(self).answered <= 2:
            body, status = {"code": "not_ready", "message": "no node has registered yet"}, 503
        else:
            body, status = [], 200
        data = json.dumps(body).encode()
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        return None


def test_the_client_asks_again_while_the_platform_is_starting() -> None:
    server = HTTPServer(("127.0.0.1", 0), _StartingApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert Client(f"http://127.0.0.1:{server.server_port}").jobs() == []
        assert _StartingApi.answered == 3
    finally:
        server.shutdown()
