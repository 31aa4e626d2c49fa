"""`gpusched nats-config`: the NATS server's users and permissions for one platform (one user per service,
each publishing only its own subjects), optionally with a fresh password per user; `gpusched nats-setup`:
create the log's streams once, as the operator user (services may only look them up)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import sys
from pathlib import Path

from contracts.events import SUBJECT_PREFIX
from libs.bus.fencing import ensure_fence_subjects
from libs.bus.jetstream import DEFAULT_STREAM, Bus, BusConfig
from libs.bus.lease import lease_store
from libs.bus.permissions import password_env, render_config, users
from libs.bus.snapshot_store import ensure_snapshot_stream
from libs.runtime.settings import nats_auth_from_env
from libs.runtime.standby import ReplicaSettings

SERVER_ENV = "nats-server.env"
# nats-server parses a variable's value as config, so a password must read as a plain string: one starting
# with a digit becomes a number or a date (or stops the server), `true` a boolean. A letter, then letters
# and digits, is always a string.
PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9]{15,}")


def new_password() -> str:
    return "p" + secrets.token_hex(32)


def _private(path: Path, text: str) -> None:
    """Write a secret readable by its owner only, from the first byte on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through O_CREAT


def write_secrets(folder: Path, names: list[str]) -> Path:
    """One password file per user (`<user>.password`, made once, for NATS_PASSWORD_FILE) and the server's
    environment file with all of them (`nats-server.env`, rewritten from those files). Returns the latter."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    lines = []
    for name in names:
        path = folder / f"{name}.password"
        if not path.exists():
            _private(path, new_password() + "\n")
        password = path.read_text().strip()
        if not PASSWORD.fullmatch(password):
            raise ValueError(f"{path}: a password here must be a letter then 15 or more letters and digits "
                             "(nats-server reads other values as numbers, dates or booleans)")
        lines.append(f"{password_env(name)}={password}")
    env_file = folder / SERVER_ENV
    _private(env_file, "\n".join(lines) + "\n")
    return env_file


def cmd_nats_config(args: argparse.Namespace) -> None:
    text = render_config(args.prefix, args.stream, args.agent_node)
    if args.secrets_dir:
        env_file = write_secrets(Path(args.secrets_dir), [u.name for u in users(args.prefix, args.stream,
                                                                                 args.agent_node)])
        print(f"passwords: {args.secrets_dir}/<user>.password; the server's environment: {env_file}",
              file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)


async def _create_streams(config: BusConfig) -> None:
    bus = await Bus.connect(config, name="gpusched-setup")  # connecting creates what is missing
    try:
        # What the services may only look up: the snapshot stream, the replicas' lease bucket (its entries
        # expire after GPUSCHED_LEASE_TTL_S) and their epoch subjects (docs/reliability.md).
        await ensure_snapshot_stream(bus)
        await lease_store(bus, ReplicaSettings.from_env().lease_ttl_s)
        await ensure_fence_subjects(bus)
    finally:
        await bus.close()


def cmd_nats_setup(args: argparse.Namespace) -> None:
    env = os.environ
    config = BusConfig(url=env.get("NATS_URL", BusConfig().url), stream=env.get("GPUSCHED_STREAM", DEFAULT_STREAM),
                       subject_prefix=env.get("GPUSCHED_SUBJECT_PREFIX", SUBJECT_PREFIX),
                       auth=nats_auth_from_env(env))
    asyncio.run(_create_streams(config))
    print(f"streams {config.stream}, {config.dlq_stream}, {config.stream}_SNAPSHOTS and the lease bucket "
          f"{config.stream}_LEASES are ready on {config.url}", file=sys.stderr)


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nats-config", help="NATS users and permissions: one user per service (infra/nats/)")
    p.add_argument("--prefix", default=SUBJECT_PREFIX, help="subject prefix (GPUSCHED_SUBJECT_PREFIX)")
    p.add_argument("--stream", default=DEFAULT_STREAM, help="stream name (GPUSCHED_STREAM)")
    p.add_argument("--agent-node", action="append", default=[], metavar="NODE",
                   help="a user of its own for this node's agent (repeatable); default: one user for all agents")
    p.add_argument("--secrets-dir", help="make a password per user here (kept if present) and the server's "
                                         "environment file")
    p.add_argument("--out", help="write the config here (default: standard output)")
    p.set_defaults(func=cmd_nats_config)
    p = sub.add_parser("nats-setup", help="create the log's streams, as the operator user (NATS_USER, "
                                          "NATS_PASSWORD[_FILE] or NATS_CREDS)")
    p.set_defaults(func=cmd_nats_setup)
