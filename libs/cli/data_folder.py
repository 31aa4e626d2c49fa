"""The local platform's data folder (`.data` by default): what lives there, and starting afresh without
losing the old log.

- `nats/`: the event log (JetStream's file store): every decision, the truth everything else is rebuilt from.
- `redis/`: the query views (rebuilt from the log at any time).
- `logs/`: each service's, agent's and server's output.
- `agents/`: the node agents' work folders (jobs' output).
- `audit.key`: the key that signs the decision chains' checkpoints.
- `endpoints.json`: where a running platform's API and servers are (gone when it stops).

`archive` moves the log and what goes with it into `archive/<UTC time>/`, keeping the audit key beside it, so
`gpusched up --data <that folder>` serves the old log again (to export, verify or replay it).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

# What belongs to one log's life; the audit key is copied (the new log keeps signing with it).
ARCHIVED = ("nats", "redis", "logs", "agents")
KEY = "audit.key"


def running_api(data: Path) -> str | None:
    """The API of a platform running on this folder, if one answers."""
    try:
        api = str(json.loads((data / "endpoints.json").read_text())["api"])
        with urllib.request.urlopen(f"{api}/healthz", timeout=1):
            return api
    except (OSError, ValueError, KeyError):
        return None


def archive(data: Path) -> Path | None:
    """Move the folder's log, views, logs and agent folders to `archive/<UTC time>/`; None when there was
    nothing to archive. Refused while a platform runs on the folder."""
    api = running_api(data)
    if api is not None:
        raise RuntimeError(f"a platform is running on {data} (API {api}): stop it (Ctrl-C) before --fresh")
    present = [name for name in ARCHIVED if (data / name).exists()]
    if not present:
        return None
    stamp = datetime.fromtimestamp(time.time(), tz=UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
    target = data / "archive" / stamp
    target.mkdir(parents=True, exist_ok=False)
    for name in present:
        shutil.move(str(data / name), str(target / name))
    if (data / KEY).exists():
        shutil.copy2(data / KEY, target / KEY)
    return target
