"""The operator's policy file (TOML): queues and priority classes, published to the log as input events."""

from __future__ import annotations

from pathlib import Path

import msgspec

from contracts import EventBase, PriorityClass, PriorityClassesChanged, QueuePolicyChanged, QueueSpec
from libs.core.decider import derived_id
from libs.core.policy import DEFAULT_PRIORITY_CLASSES, PolicyBook

OPERATOR = "operator"


class PolicyFile(msgspec.Struct, forbid_unknown_fields=True):
    queues: list[QueueSpec] = []
    priority_classes: list[PriorityClass] = msgspec.field(default_factory=lambda: list(DEFAULT_PRIORITY_CLASSES))


class PolicyFileError(ValueError):
    pass


def load_policy(path: Path) -> PolicyFile:
    try:
        return msgspec.toml.decode(path.read_bytes(), type=PolicyFile)
    except FileNotFoundError as err:
        raise PolicyFileError(f"policy file {path} not found") from err
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise PolicyFileError(f"policy file {path}: {err}") from err


def policy_changes(current: PolicyBook, wanted: PolicyFile, version: int, now: float) -> list[EventBase]:
    """The events that bring the log's policy to the file's: nothing when they already agree."""
    out: list[EventBase] = []
    classes = tuple(sorted(wanted.priority_classes, key=lambda c: (-c.value, c.name)))
    have = tuple(sorted(current.classes.values(), key=lambda c: (-c.value, c.name)))
    if classes != have:
        out.append(PriorityClassesChanged(id=derived_id(OPERATOR, "classes", version), ts=now, source=OPERATOR,
                                          classes=classes, version=version))
    for q in sorted(wanted.queues, key=lambda q: q.name):
        if current.queues.get(q.name) != q:
            out.append(QueuePolicyChanged(id=derived_id(OPERATOR, "queue", q.name, version), ts=now,
                                          source=OPERATOR, correlation_id=q.name, queue=q, version=version))
    return out
