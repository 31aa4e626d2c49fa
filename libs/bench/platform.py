"""The platform a benchmark runs on: its own NATS and Redis (a NATS_URL / REDIS_URL in the environment would
mix the run with another's log), the six services as processes, a policy and a cluster of the benchmark's
own, all stopped whatever happens, and the run's folder removed unless the caller named it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.supervisor import Supervisor


@dataclass(frozen=True, slots=True)
class BenchPlatform:
    data: Path
    sup: Supervisor
    servers: list[EmbeddedServer]
    env: dict[str, str]  # NATS_URL, REDIS_URL and the services' settings


@contextmanager
def bench_platform(data: Path | None, name: str, policy_toml: str, cluster_csv: str,
                   service_env: dict[str, str]) -> Iterator[BenchPlatform]:
    folder = data or Path(tempfile.mkdtemp(prefix=f"gpusched-{name}-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.toml").write_text(policy_toml)
    (folder / "cluster.csv").write_text(cluster_csv)
    sup: Supervisor | None = None
    servers: list[EmbeddedServer] = []
    try:
        sup, servers, env = start_platform(folder, folder / "cluster.csv", folder / "policy.toml",
                                           api_port=free_port(), extra_env=service_env, own_servers=True)
        yield BenchPlatform(folder, sup, servers, env)
    finally:
        if sup is not None:
            sup.stop()
        for s in reversed(servers):
            s.stop()
        if data is None:
            shutil.rmtree(folder, ignore_errors=True)
