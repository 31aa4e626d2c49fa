"""What a node backend saw go wrong with a GPU, and which of those observations take the GPU out of service.

Backends report observations; the agent sends XID and ECC ones to the log as `GpuFault`, and
node-telemetry's core (libs/core/node_health/decider.py) decides there which quarantine a GPU, by the same XID list.
`is_fatal` applies that rule to an observation for the backend's own view of its GPUs' health.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.node_health.gpu_faults import FATAL_XIDS, NPU_UNHEALTHY_LEVEL

KINDS = frozenset({"xid", "ecc", "thermal", "power", "npu"})
__all__ = ["FATAL_XIDS", "KINDS", "HealthObservation", "is_fatal"]


@dataclass(frozen=True, slots=True)
class HealthObservation:
    """One thing a backend noticed on one GPU.

    kind "xid": code is the XID. "ecc": code is the GPU's new uncorrectable (volatile) ECC error count,
    reported only when it grew. "thermal" / "power": code 1 while the GPU's clocks are held back for that
    reason (reported at every poll while it lasts). "npu": code is an Ascend NPU's new health level, reported
    when it got worse (1 warning, 2 alarm, 3 critical).
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
    if obs.kind == "npu":
        return obs.code >= NPU_UNHEALTHY_LEVEL
    return obs.kind == "ecc"
