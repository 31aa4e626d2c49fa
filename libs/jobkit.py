"""What a job running under the gpusched node agent calls: report a checkpoint, read where to resume.

The agent gives each run a checkpoint file (`GPUSCHED_CHECKPOINT_FILE`) and, after an eviction, the
progress it resumes from (`GPUSCHED_RESUME_PROGRESS_S`, `GPUSCHED_RESUME_CHECKPOINT`). A job that calls
`checkpoint()` after saving its state loses only the work since then when it is preempted. An inference
service replica with `ready_signal` calls `ready()` once it serves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from libs.files import write_whole

CHECKPOINT_FILE = "GPUSCHED_CHECKPOINT_FILE"
# Set for an inference service replica that signals its readiness (`ready_signal`): `ready()` creates it.
READY_FILE = "GPUSCHED_READY_FILE"
RESUME_PROGRESS = "GPUSCHED_RESUME_PROGRESS_S"
RESUME_CHECKPOINT = "GPUSCHED_RESUME_CHECKPOINT"


def checkpoint(progress_s: float, ref: str = "") -> None:
    """Record that the job's state is saved with `progress_s` seconds of its work done (atomically: the agent
    never reads half a file)."""
    target = os.environ.get(CHECKPOINT_FILE)
    if not target:
        raise RuntimeError(f"{CHECKPOINT_FILE} is not set: not running under a gpusched node agent")
    if progress_s < 0:
        raise ValueError("progress_s must not be negative")
    write_whole(Path(target), json.dumps({"progress_s": progress_s, "checkpoint": ref}))


def ready() -> None:
    """Say that this service replica serves (e.g. its model is loaded): its executor reports it ready, and
    the service counts it from then on."""
    target = os.environ.get(READY_FILE)
    if not target:
        raise RuntimeError(f"{READY_FILE} is not set: not a service replica with ready_signal under a node agent")
    Path(target).touch()


def resume_progress() -> float:
    """Seconds of work an earlier run saved (0 on a first run)."""
    return float(os.environ.get(RESUME_PROGRESS, "0") or 0)


def read_checkpoint(path: Path) -> tuple[float, str] | None:
    """(progress_s, ref) from a checkpoint file; None if there is none or it is unreadable."""
    try:
        data = json.loads(path.read_text())
        return float(data["progress_s"]), str(data.get("checkpoint", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
