"""What a node backend saw go wrong with a GPU, and which of those observations take the GPU out of service.

Backends report observations; deciding what to do with them (drain the GPU, announce it unhealthy, alert)
is the node agent's business. `is_fatal` is the one shared rule for "this GPU must not take work".
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = frozenset({"xid", "ecc", "thermal", "power"})

# XIDs after which the GPU cannot be trusted until it is reset or replaced: 48 double-bit ECC error,
# 63/64 row remapping pending / failed, 74 NVLink error, 79 fallen off the bus, 94/95 contained /
# uncontained ECC error. Other XIDs (13, 31, 43, ...) are usually one application's fault.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})


@dataclass(frozen=True, slots=True)
class HealthObservation:
    """One thing a backend noticed on one GPU.

    kind "xid": code is the XID. "ecc": code is the GPU's new uncorrectable (volatile) ECC error count,
    reported only when it grew. "thermal" / "power": code 1 while the GPU's clocks are held back for that
    reason (reported at every poll while it lasts).
    """

    node: str
    index: int
    kind: str
    code: int
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown health observation kind {self.kind!r} (one of {sorted(KINDS)})")


def is_fatal(obs: HealthObservation) -> bool:
    """Whether the GPU must stop taking work: a fatal XID, or any new uncorrectable ECC error.
    Throttling slows a GPU down but leaves its results correct, so it never is."""
    if obs.kind == "xid":
        return obs.code in FATAL_XIDS
    return obs.kind == "ecc"
