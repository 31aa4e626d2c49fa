"""Settings from the environment, one place for every process. Secrets never come from code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from libs.bus.jetstream import BusConfig, NatsAuth, stream_replicas_from_env
from libs.paths import REPO_ROOT

# Default HTTP port of each service; admission's is the public API.
DEFAULT_PORTS = {
    "admission": 8080,
    "quota": 8081,
    "placement": 8082,
    "preemption": 8083,
    "accounting": 8084,
    "node-telemetry": 8085,
}

SERVICES = tuple(DEFAULT_PORTS)
# The services no placement waits for: accounting (ledger, views, metrics), preemption (nothing to preempt
# while the cluster has room) and node-telemetry (it starts and finishes jobs once they are placed). The
# others, admission -> quota -> placement, are the path to a placement.
OFF_PATH = ("accounting", "preemption", "node-telemetry")

# How much lower the supervisor runs the services off the path (nice levels added to its own, 0 to 19; 0:
# all at one priority), so that on a machine with fewer cores than busy processes the path gets the CPU
# first and the others catch up after a burst (docs/scaling.md).
OFF_PATH_NICE_ENV = "GPUSCHED_OFF_PATH_NICE"
OFF_PATH_NICE = 10
MAX_NICE = 19

# How long a service's batch waits for more once it has a first message, in milliseconds: the latency its
# batching may add to each event. The path to a placement takes what has arrived and goes on (under load
# that is a large batch anyway); the services off it need not react within milliseconds and take bigger
# batches, which cost less per event to fetch and acknowledge.
BATCH_WAIT_ENV = "GPUSCHED_BATCH_WAIT_MS"
PATH_BATCH_WAIT_MS = 0.0
OFF_PATH_BATCH_WAIT_MS = 50.0
MAX_BATCH_WAIT_MS = 1000.0

DEFAULT_POLICY = REPO_ROOT / "infra" / "config" / "demo.toml"
DEFAULT_CLUSTER = REPO_ROOT / "infra" / "config" / "demo-cluster.csv"


def _secret(env: os._Environ[str] | dict[str, str], name: str) -> bytes | None:
    """A secret from NAME, or from the file named by NAME_FILE (so it need not sit in the environment)."""
    if env.get(name):
        return env[name].encode()
    path = env.get(f"{name}_FILE")
    return Path(path).read_bytes().strip() if path else None


def nats_auth_from_env(env: os._Environ[str] | dict[str, str]) -> NatsAuth | None:
    """The process's NATS identity: NATS_CREDS (a credentials file), or NATS_USER with NATS_PASSWORD or
    NATS_PASSWORD_FILE; None without either (a server without authorization)."""
    creds, user = env.get("NATS_CREDS", ""), env.get("NATS_USER", "")
    password = _secret(env, "NATS_PASSWORD")
    if not creds and not user:
        if password is not None:
            raise ValueError("NATS_PASSWORD is set but NATS_USER is not")
        return None
    return NatsAuth(user=user, password=password.decode() if password is not None else "", creds_file=creds)


def _service_key(service: str, setting: str) -> str:
    """A setting for one service only: GPUSCHED_<SERVICE>_<SETTING> (node-telemetry: NODE_TELEMETRY)."""
    return f"GPUSCHED_{service.upper().replace('-', '_')}_{setting}"


def _env_port(service: str) -> int:
    key = _service_key(service, "PORT")
    return int(os.environ.get(key, os.environ.get("GPUSCHED_HTTP_PORT", DEFAULT_PORTS[service])))


def service_nice(service: str, env: Mapping[str, str] | None = None) -> int:
    """How much lower than the supervisor's own the CPU priority of `service` is: GPUSCHED_OFF_PATH_NICE
    (0 to 19, default 10) for a service off the path to a placement, 0 for the others."""
    return off_path_nice(env) if service in OFF_PATH else 0


def off_path_nice(env: Mapping[str, str] | None = None) -> int:
    """GPUSCHED_OFF_PATH_NICE: 0 to 19, default 10."""
    raw = (os.environ if env is None else env).get(OFF_PATH_NICE_ENV, "").strip()
    nice = int(raw) if raw else OFF_PATH_NICE
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"{OFF_PATH_NICE_ENV} must be between 0 and {MAX_NICE}, not {nice}")
    return nice


def batch_wait_s(service: str, env: Mapping[str, str] | None = None) -> float:
    """How long `service`'s batch waits for more once it has a first message, in seconds:
    GPUSCHED_<SERVICE>_BATCH_WAIT_MS, else GPUSCHED_BATCH_WAIT_MS, else 50 ms off the path to a placement
    and 0 on it (what has arrived). From 0 to 1,000 ms."""
    env = os.environ if env is None else env
    key = next((k for k in (_service_key(service, "BATCH_WAIT_MS"), BATCH_WAIT_ENV) if env.get(k, "").strip()), "")
    ms = float(env[key]) if key else OFF_PATH_BATCH_WAIT_MS if service in OFF_PATH else PATH_BATCH_WAIT_MS
    if not 0 <= ms <= MAX_BATCH_WAIT_MS:
        raise ValueError(f"{key} must be from 0 to {MAX_BATCH_WAIT_MS:g} ms, not {ms:g}")
    return ms / 1000


@dataclass(frozen=True)
class Settings:
    service: str
    # One server, or a cluster's servers separated by commas (NATS_URL).
    nats_url: str = "nats://127.0.0.1:4222"
    redis_url: str = "redis://127.0.0.1:6379/0"
    stream: str = "GPUSCHED"
    subject_prefix: str = "gs"
    # Servers that keep a copy of the streams when they are created (GPUSCHED_STREAM_REPLICAS; 3 on a cluster).
    # Read from the environment even when the settings are built field by field, like the credentials below.
    stream_replicas: int = field(default_factory=stream_replicas_from_env)
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    policy_file: Path = DEFAULT_POLICY
    cluster_csv: Path = DEFAULT_CLUSTER
    node_backend: str = "sim"
    tick_seconds: float = 5.0
    # Simulated executor: declared durations are divided by this (benchmarks compress time).
    time_scale: float = 1.0
    batch_size: int = 500
    # How long a fetch waits for more once it has a first message (GPUSCHED_BATCH_WAIT_MS; per service).
    batch_wait_s: float = PATH_BATCH_WAIT_MS / 1000
    # The key that signs the decision chains' checkpoints (never logged); None: no checkpoints.
    audit_key: bytes | None = field(default=None, repr=False)
    audit_every: int = 500
    # Where traces go: "none" (off, no cost), "console" (stdout) or "otlp" (OTLP over HTTP to
    # OTEL_EXPORTER_OTLP_ENDPOINT).
    trace_exporter: str = "none"
    # Who this process is on the bus (never logged). Read from the environment even when the settings are
    # built field by field (the node agent builds its own), so a process always connects as its user.
    nats_auth: NatsAuth | None = field(default_factory=lambda: nats_auth_from_env(os.environ), repr=False)

    @property
    def bus(self) -> BusConfig:
        return BusConfig(url=self.nats_url, stream=self.stream, subject_prefix=self.subject_prefix,
                         replicas=self.stream_replicas, auth=self.nats_auth)

    @classmethod
    def from_env(cls, service: str) -> Settings:
        env = os.environ
        return cls(
            service=service,
            nats_url=env.get("NATS_URL", cls.nats_url),
            redis_url=env.get("REDIS_URL", cls.redis_url),
            stream=env.get("GPUSCHED_STREAM", cls.stream),
            subject_prefix=env.get("GPUSCHED_SUBJECT_PREFIX", cls.subject_prefix),
            stream_replicas=stream_replicas_from_env(env),
            http_host=env.get("GPUSCHED_HTTP_HOST", cls.http_host),
            http_port=_env_port(service),
            policy_file=Path(env.get("GPUSCHED_POLICY", str(DEFAULT_POLICY))),
            cluster_csv=Path(env.get("GPUSCHED_CLUSTER", str(DEFAULT_CLUSTER))),
            node_backend=env.get("GPUSCHED_NODE_BACKEND", cls.node_backend),
            tick_seconds=float(env.get("GPUSCHED_TICK_SECONDS", cls.tick_seconds)),
            time_scale=float(env.get("GPUSCHED_TIME_SCALE", cls.time_scale)),
            batch_size=int(env.get("GPUSCHED_BATCH_SIZE", cls.batch_size)),
            batch_wait_s=batch_wait_s(service, env),
            audit_key=_secret(env, "GPUSCHED_AUDIT_KEY"),
            audit_every=int(env.get("GPUSCHED_AUDIT_EVERY", cls.audit_every)),
            trace_exporter=(env.get("GPUSCHED_TRACE_EXPORTER") or cls.trace_exporter).strip().lower(),
            nats_auth=nats_auth_from_env(env),
        )
