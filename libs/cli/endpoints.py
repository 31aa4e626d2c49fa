"""Where the CLI finds the platform: the environment first, else the endpoints a local `gpusched up` wrote,
else the well-known local defaults. Every answer says where it came from, so that an error can name the
address it tried and why it tried that one."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.paths import REPO_ROOT

ENDPOINTS_FILE = "endpoints.json"
DEFAULT_NATS = "nats://127.0.0.1:4222"
DEFAULT_API = "http://127.0.0.1:8080"


@dataclass(frozen=True, slots=True)
class Endpoint:
    value: str
    source: str  # "NATS_URL", "/path/.data/endpoints.json", "the default" ...

    def describe(self) -> str:
        return f"{self.value} (from {self.source})"


def endpoints_files() -> list[Path]:
    """Candidates, nearest first: GPUSCHED_DATA's, this folder's `.data`, then the checkout's `.data` (the
    folder `gpusched up` uses by default), each once."""
    candidates = []
    if os.environ.get("GPUSCHED_DATA"):
        candidates.append(Path(os.environ["GPUSCHED_DATA"]) / ENDPOINTS_FILE)
    candidates += [Path.cwd() / ".data" / ENDPOINTS_FILE, REPO_ROOT / ".data" / ENDPOINTS_FILE]
    seen: list[Path] = []
    for path in candidates:
        resolved = path.resolve()
        if resolved not in seen:
            seen.append(resolved)
    return seen


def local_platform() -> tuple[dict[str, Any], Path] | None:
    """The endpoints of a running local platform (the file `gpusched up` writes while it runs), or None."""
    for path in endpoints_files():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data, path
    return None


def _resolve(env_name: str, key: str, default: str) -> Endpoint:
    value = os.environ.get(env_name, "").strip()
    if value:
        return Endpoint(value, env_name)
    found = local_platform()
    if found is not None and isinstance(found[0].get(key), str):
        return Endpoint(found[0][key], str(found[1]))
    return Endpoint(default, "the default")


def api_endpoint() -> Endpoint:
    return _resolve("GPUSCHED_API", "api", DEFAULT_API)


def nats_endpoint() -> Endpoint:
    return _resolve("NATS_URL", "NATS_URL", DEFAULT_NATS)


def audit_key_file() -> Path | None:
    """The key that signs the local platform's checkpoints, when one runs here (GPUSCHED_AUDIT_KEY_FILE first)."""
    named = _resolve("GPUSCHED_AUDIT_KEY_FILE", "GPUSCHED_AUDIT_KEY_FILE", "").value
    return Path(named) if named else None
