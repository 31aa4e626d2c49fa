"""Runs the six services as child processes, restarts one that dies, stops them all cleanly. The services off
the path to a placement run at a lower CPU priority (GPUSCHED_OFF_PATH_NICE, libs/runtime/settings.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.embedded import StartError
from libs.runtime.settings import MAX_NICE, SERVICES, service_nice

MODULES = {name: f"services.{name.replace('-', '_')}" for name in SERVICES}


@dataclass
class Child:
    name: str
    port: int
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    # How much lower than the supervisor's the child's CPU priority is (a nice increment; 0: the same).
    nice: int = 0

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen([sys.executable, "-m", MODULES[self.name]], env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT)
        if self.nice:
            lower_priority(self.proc.pid, self.nice)

    def ready(self) -> bool:
        """Ready, and really this child answering (not another platform's process on the same port)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                body = json.loads(r.read())
                return bool(r.status == 200 and self.proc is not None and body.get("pid") == self.proc.pid)
        except (OSError, ValueError):
            return False


def lower_priority(pid: int, increment: int) -> None:
    """Run process `pid` at this process's nice level plus `increment` (at most 19), as `nice -n` would. Set
    right after the spawn, while the child's interpreter starts, and again at every restart (a new process).
    A child gone already is no error: the supervisor sees it dead and starts it again."""
    level = min(os.getpriority(os.PRIO_PROCESS, 0) + increment, MAX_NICE)
    with contextlib.suppress(ProcessLookupError):
        os.setpriority(os.PRIO_PROCESS, pid, level)


@dataclass
class Supervisor:
    env: dict[str, str]
    ports: dict[str, int]
    log_dir: Path
    children: dict[str, Child] = field(default_factory=dict)
    # Per service, variables only it gets (on top of `env`): its own NATS user and password, for one.
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)

    def start(self, services: tuple[str, ...] = SERVICES) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        children = []
        for name in services:  # every child's settings read (a wrong one raises) before any starts
            env = {**os.environ, **self.env, **self.service_env.get(name, {}),
                   f"GPUSCHED_{name.upper().replace('-', '_')}_PORT": str(self.ports[name])}
            children.append(Child(name, self.ports[name], self.log_dir / f"{name}.log", env,
                                  nice=service_nice(name, env)))
        for child in children:
            child.start()
            self.children[child.name] = child

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        waiting = dict(self.children)
        while waiting and time.monotonic() < deadline:
            for name, child in list(waiting.items()):
                if child.proc is not None and child.proc.poll() is not None:
                    raise StartError(f"service {name}", f"exited with code {child.proc.returncode} while starting",
                                     child.log_path)
                if child.ready():
                    del waiting[name]
            time.sleep(0.1)
        if waiting:
            name, child = next(iter(waiting.items()))
            others = f" (also not ready: {', '.join(list(waiting)[1:])})" if len(waiting) > 1 else ""
            raise StartError(f"service {name}", f"was not ready on port {child.port} after {timeout:g}s{others}",
                             child.log_path)

    def restart_dead(self) -> list[str]:
        """Crash-only: a service that died is started again and catches up from the log."""
        restarted = []
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is not None:
                child.restarts += 1
                child.start()
                restarted.append(child.name)
        return restarted

    def kill(self, name: str) -> None:
        child = self.children[name]
        if child.proc is not None:
            child.proc.kill()
            child.proc.wait()

    def stop(self) -> None:
        for child in self.children.values():
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        for child in self.children.values():
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
