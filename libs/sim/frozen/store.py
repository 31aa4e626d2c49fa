"""The frozen files: tests/golden/frozen/<set>.json, one per set, with sorted keys so that recording the same
decisions again writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from libs.paths import REPO_ROOT
from libs.sim.frozen.digest import CHECKPOINT_HEX, RunRecord

FROZEN_DIR = REPO_ROOT / "tests" / "golden" / "frozen"
FORMAT = (f"per run: events, the log's length; inputs, SHA-256 over the world's inputs; decisions, per deciding "
          f"service: count, sha256 over contracts.codec.encode(decision) + newline in log order, and checkpoints, "
          f"the first {CHECKPOINT_HEX} hex digits of that running digest after every checkpoint_every decisions")


class FrozenFile(TypedDict):
    set: str
    format: str
    checkpoint_every: int
    runs: dict[str, RunRecord]


def frozen_path(name: str) -> Path:
    return FROZEN_DIR / f"{name}.json"


def rerecord_hint(name: str) -> str:
    return (f"if the change is deliberate, re-record with `.venv/bin/python scripts/freeze_decisions.py --set {name}` "
            f"and state the difference in the commit message")


def encode_file(name: str, every: int, runs: dict[str, RunRecord]) -> str:
    document: FrozenFile = {"set": name, "format": FORMAT, "checkpoint_every": every, "runs": runs}
    return json.dumps(document, sort_keys=True, indent=1) + "\n"


def write_frozen(name: str, every: int, runs: dict[str, RunRecord]) -> Path:
    path = frozen_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(encode_file(name, every, runs))
    return path


def read_frozen(name: str) -> FrozenFile | None:
    """The set's frozen file, or None when it was never recorded."""
    path = frozen_path(name)
    if not path.exists():
        return None
    document: FrozenFile = json.loads(path.read_text())
    return document
