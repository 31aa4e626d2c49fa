"""What a broken guarantee looks like, and the stable ids of the guarantees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Safety: true at every stream sequence.
GPU_CAPACITY: Final = "gpu_capacity"  # GPU share, GPU memory, host CPU, host memory, RDMA NICs
MIG_SLICES: Final = "mig_slices"
DOUBLE_PLACEMENT: Final = "double_placement"
GANG_ALL_OR_NOTHING: Final = "gang_all_or_nothing"
QUOTA_CEILING: Final = "quota_ceiling"
LENDING_LIMIT: Final = "lending_limit"
PARENT_QUOTA: Final = "parent_quota"
RECLAIM_ONLY_WHILE_BORROWING: Final = "reclaim_only_while_borrowing"
QUEUE_POLICY: Final = "queue_policy"  # a queue's preemption and flavor settings (kernel/queue_policies.py)
DEVICE_GROUPS: Final = "device_groups"  # NPUs of a replica inside their HCCS groups (kernel/accelerators.py)
# Liveness: true once the log has been quiet for a while (and, for reclaim, within a bound).
JOB_FINAL_OR_EXPLAINED: Final = "job_final_or_explained"
WAITING_REASON_TRUE: Final = "waiting_reason_true"
NO_IDLE_WHILE_FITTING_WAITS: Final = "no_idle_while_fitting_waits"
RECLAIM_WITHIN_BOUND: Final = "reclaim_within_bound"
# Judged at each reservation, on the world the liveness pass folds (the quota decider's own state: its holds).
FLAVOR_FUNGIBILITY: Final = "flavor_fungibility"  # the first flavor with room, in the queue's order (when_can_borrow)
# Replay reproduces every recorded decision.
DETERMINISM: Final = "determinism"

SAFETY: Final = (GPU_CAPACITY, MIG_SLICES, DOUBLE_PLACEMENT, GANG_ALL_OR_NOTHING, QUOTA_CEILING, LENDING_LIMIT,
                 PARENT_QUOTA, RECLAIM_ONLY_WHILE_BORROWING, QUEUE_POLICY, DEVICE_GROUPS)
LIVENESS: Final = (JOB_FINAL_OR_EXPLAINED, WAITING_REASON_TRUE, NO_IDLE_WHILE_FITTING_WAITS, RECLAIM_WITHIN_BOUND,
                   FLAVOR_FUNGIBILITY)
ALL: Final = (*SAFETY, *LIVENESS, DETERMINISM)


def gpus(milli: int, flavor: str = "*") -> str:
    """An amount of quota as a detail says it: "3 GPUs", "1.5 A100 GPUs" ("*" is the any-model flavor)."""
    return f"{milli / 1000:g} {'' if flavor == '*' else flavor + ' '}GPUs"


@dataclass(frozen=True)
class Violation:
    guarantee: str  # one of ALL
    seq: int  # the stream sequence where it broke (or was observed)
    jobs: tuple[str, ...]  # the jobs involved
    detail: str  # a sentence with the numbers

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.guarantee}: {self.detail}"
