"""Which device faults quarantine a GPU or an NPU. Node agents report what they observe (`GpuFault`); this decides
what it means. A fatal XID class, an uncorrectable ECC error or an NPU health of a major or critical alarm
quarantines the device (`GpuHealthChanged(healthy=False)`): placement stops using it and the executor running a
job there stops and requeues that job. Throttling, other XIDs and minor NPU alarms are only recorded."""

from __future__ import annotations

from contracts import GpuFault, GpuHealthChanged
from libs.core.kernel.decider import Decisions
from libs.core.node_health.state import NodeHealthState

# XIDs after which the GPU cannot be trusted until it is reset or replaced: 48 double-bit ECC error,
# 63/64 row remapping pending / failed, 74 NVLink error, 79 fallen off the bus, 94/95 contained /
# uncontained ECC error. Other XIDs (13, 31, 43, ...) are usually one application's fault.
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})
# An Ascend NPU's health level (DCMI's: 0 normal, 1 minor, 2 major, 3 critical alarm) from which it stops
# taking work, as Ascend's device plugin takes every level past a minor alarm out of service.
NPU_UNHEALTHY_LEVEL = 2
NPU_LEVEL_NAMES = {1: "warning", 2: "alarm", 3: "critical"}


def fault_reason(fault: GpuFault) -> str | None:
    """Why the fault quarantines its GPU; None when it does not."""
    if fault.kind == "xid" and fault.code in FATAL_XIDS:
        return f"xid_{fault.code}"
    if fault.kind == "ecc" and fault.code > 0:
        return "ecc_uncorrectable"
    if fault.kind == "npu" and fault.code >= NPU_UNHEALTHY_LEVEL:
        return f"npu_{NPU_LEVEL_NAMES.get(fault.code, 'critical')}"
    return None


def quarantine(state: NodeHealthState, fault: GpuFault, out: Decisions) -> None:
    """A fault that quarantines a GPU the node lists as healthy marks it unhealthy; any other changes nothing."""
    reason = fault_reason(fault)
    if reason is not None and state.healthy.get(fault.node, {}).get(fault.index, False):
        out.emit(GpuHealthChanged, correlation_id=fault.node, node=fault.node, index=fault.index, healthy=False,
                 reason=reason, xid=fault.code if fault.kind == "xid" else 0)
