"""The operator's policy file (TOML): queues and priority classes, published to the log as input events."""

from __future__ import annotations

from pathlib import Path

import msgspec

from contracts import (
    EventBase,
    PriorityClass,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    SchedulingSettings,
    SchedulingSettingsChanged,
)
from libs.core.kernel.decider import derived_id
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES, PolicyBook
from libs.core.kernel.queue_limits import check_tree

OPERATOR = "operator"


class PolicyFile(msgspec.Struct, forbid_unknown_fields=True):
    queues: list[QueueSpec] = []
    priority_classes: list[PriorityClass] = msgspec.field(default_factory=lambda: list(DEFAULT_PRIORITY_CLASSES))
    settings: SchedulingSettings = msgspec.field(default_factory=SchedulingSettings)


class PolicyFileError(ValueError):
    pass


def load_policy(path: Path) -> PolicyFile:
    try:
        text = path.read_bytes()
    except FileNotFoundError as err:
        raise PolicyFileError(f"policy file {path} not found") from err
    return parse_policy(text, str(path))


def parse_policy(text: str | bytes, origin: str = "policy") -> PolicyFile:
    """A policy file's text, checked (the queue tree included); `origin` names it in errors."""
    path = origin
    try:
        policy = msgspec.toml.decode(text, type=PolicyFile)
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise PolicyFileError(f"policy file {path}: {err}") from err
    queues: dict[str, QueueSpec] = {}
    for q in tree_order(policy.queues):
        if q.name in queues:
            raise PolicyFileError(f"policy file {path}: queue {q.name!r} is defined twice")
        problem = check_tree(queues, q)
        if problem is not None:
            raise PolicyFileError(f"policy file {path}: queue {q.name!r}: {problem}")
        queues[q.name] = q
    return policy


def tree_order(queues: list[QueueSpec]) -> list[QueueSpec]:
    """Parents before their children (then by name), so every queue's parent exists when it arrives."""
    by_name = {q.name: q for q in queues}

    def depth(q: QueueSpec) -> int:
        seen, n = set(), 0
        while q.parent in by_name and q.parent not in seen:
            seen.add(q.parent)
            q, n = by_name[q.parent], n + 1
        return n

    return sorted(queues, key=lambda q: (depth(q), q.name))


def policy_changes(current: PolicyBook, wanted: PolicyFile, version: int, now: float) -> list[EventBase]:
    """The events that bring the log's policy to the file's: nothing when they already agree."""
    out: list[EventBase] = []
    classes = tuple(sorted(wanted.priority_classes, key=lambda c: (-c.value, c.name)))
    have = tuple(sorted(current.classes.values(), key=lambda c: (-c.value, c.name)))
    if classes != have:
        out.append(PriorityClassesChanged(id=derived_id(OPERATOR, "classes", version), ts=now, source=OPERATOR,
                                          classes=classes, version=version))
    if wanted.settings != current.settings:
        out.append(SchedulingSettingsChanged(id=derived_id(OPERATOR, "settings", version), ts=now, source=OPERATOR,
                                             settings=wanted.settings, version=version))
    for q in tree_order(wanted.queues):
        if current.queues.get(q.name) != q:
            out.append(QueuePolicyChanged(id=derived_id(OPERATOR, "queue", q.name, version), ts=now,
                                          source=OPERATOR, correlation_id=q.name, queue=q, version=version))
    return out
