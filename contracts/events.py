"""Every message in the log: commands (subjects `gs.c.<Type>`) and events (subjects `gs.e.<Type>`).

Each carries the same envelope fields: a derived `id` (also the `Nats-Msg-Id`, so a redelivered trigger
cannot produce a duplicate), `ts` (the time the decision is about, taken from the trigger, never from the
decider's wall clock), the producing `source`, the `trigger_seq` stream sequence of the trigger, and
causation / correlation ids.
"""

from __future__ import annotations

from typing import Final

import msgspec

from contracts.model import (
    JobSpec,
    NodeSpec,
    PriorityClass,
    QueueSpec,
    ReplicaPlacement,
    SchedulingSettings,
    ServiceSpec,
    Victim,
)

SUBJECT_PREFIX: Final = "gs"


class EventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True, omit_defaults=True):
    id: str
    ts: float
    source: str
    trigger_seq: int = 0
    causation_id: str = ""
    correlation_id: str = ""
    # Decisions only: hash of the previous decision of the same service and of this one (tamper evidence).
    chain: str = ""


# --- commands (inputs from producers and operators) ---------------------------------------------


class SubmitJob(EventBase, frozen=True, kw_only=True):
    job_id: str
    spec: JobSpec


class CancelJob(EventBase, frozen=True, kw_only=True):
    job_id: str
    team: str = ""
    reason: str = "user_request"


class CordonNode(EventBase, frozen=True, kw_only=True):
    """An operator takes a node out of placement; with `drain`, its jobs are also stopped (checkpointing
    first, as for a preemption) and requeued elsewhere."""

    node: str
    drain: bool = False
    reason: str = ""
    operator: str = ""


class UncordonNode(EventBase, frozen=True, kw_only=True):
    node: str
    reason: str = ""
    operator: str = ""


class RemoveNode(EventBase, frozen=True, kw_only=True):
    """An operator takes a node out of the inventory for good (decommissioned, or a node nobody serves any
    more); its jobs are requeued. A node that registers again is back."""

    node: str
    reason: str = ""
    operator: str = ""


class DeployService(EventBase, frozen=True, kw_only=True):
    """Create an inference service, or change its replica bounds and autoscaling (same name and team)."""

    service: ServiceSpec


class DeleteService(EventBase, frozen=True, kw_only=True):
    name: str
    team: str = ""
    reason: str = "user_request"


class ReportServiceLoad(EventBase, frozen=True, kw_only=True):
    """A load signal for a service's autoscaling (from its gateway, load balancer or telemetry)."""

    service: str
    metric: str
    value: float


# --- admission ----------------------------------------------------------------------------------


class JobSubmitted(EventBase, frozen=True, kw_only=True):
    job_id: str
    spec: JobSpec


class JobAdmitted(EventBase, frozen=True, kw_only=True):
    job_id: str
    queue: str


class JobRejected(EventBase, frozen=True, kw_only=True):
    job_id: str
    code: str
    message: str
    spec: JobSpec | None = None


class JobCancelled(EventBase, frozen=True, kw_only=True):
    job_id: str
    reason: str


class ServiceDeployed(EventBase, frozen=True, kw_only=True):
    service: ServiceSpec


class ServiceRejected(EventBase, frozen=True, kw_only=True):
    name: str
    code: str
    message: str


class ServiceScaled(EventBase, frozen=True, kw_only=True):
    """The service's desired replica count changed; `reason` says why (deploy, load, bounds)."""

    service: str
    from_replicas: int
    to_replicas: int
    reason: str
    metric: str = ""
    value: float = 0.0


class ServiceDeleted(EventBase, frozen=True, kw_only=True):
    name: str
    reason: str


# --- quota --------------------------------------------------------------------------------------


class QueuePolicyChanged(EventBase, frozen=True, kw_only=True):
    queue: QueueSpec
    version: int


class PriorityClassesChanged(EventBase, frozen=True, kw_only=True):
    classes: tuple[PriorityClass, ...]
    version: int


class SchedulingSettingsChanged(EventBase, frozen=True, kw_only=True):
    settings: SchedulingSettings
    version: int


class QuotaReserved(EventBase, frozen=True, kw_only=True):
    job_id: str
    queue: str
    gpu_milli: int
    # The flavor (GPU model) the quota was taken from; "" for the "*" flavor (any model).
    flavor: str = ""
    # Thousandths of a GPU above the queue's nominal, i.e. borrowed from its cohort.
    borrowed_milli: int = 0
    # Admitted after the queue's GPU-hour budget was spent: preemptible whatever its class.
    over_budget: bool = False


class QuotaReleased(EventBase, frozen=True, kw_only=True):
    job_id: str
    queue: str
    gpu_milli: int
    reason: str


# Quota asks an unplaced reservation back (placement timeout); it goes back once placement lets the job go
# (PlacementDeferred `reservation_returned`): a job placed first keeps it. No placement runs on quota given back.
class QuotaRecalled(EventBase, frozen=True, kw_only=True):
    job_id: str
    queue: str
    reason: str


class QuotaDeferred(EventBase, frozen=True, kw_only=True):
    job_id: str
    queue: str
    code: str
    message: str
    shortfall_milli: int = 0


# --- placement ----------------------------------------------------------------------------------


class JobPlaced(EventBase, frozen=True, kw_only=True):
    job_id: str
    placements: tuple[ReplicaPlacement, ...]
    policy: str = "best-fit"


class PlacementDeferred(EventBase, frozen=True, kw_only=True):
    job_id: str
    code: str
    message: str
    # GPUs (in thousandths) the best candidate lacked.
    shortfall_milli: int = 0


# --- preemption ---------------------------------------------------------------------------------


class PreemptionDecided(EventBase, frozen=True, kw_only=True):
    preemptor_id: str
    victims: tuple[Victim, ...]
    code: str


# --- executors ----------------------------------------------------------------------------------
#
# Every executor report names the run it is about: `run`, the id of the JobPlaced event that started it. A job
# may be placed, evicted and placed again; a report of an earlier run read late (a slow agent, an executor
# restarted) is about a run that is over and changes nothing. "" (logs written before reports named their run):
# about the job's current run, whichever it is.


class JobStarted(EventBase, frozen=True, kw_only=True):
    job_id: str
    run: str = ""
    executor: str = "sim"


class JobReady(EventBase, frozen=True, kw_only=True):
    """A running service replica serves: at once when started, or when its process says so (`ready_signal`)."""

    job_id: str
    run: str = ""


class JobFinished(EventBase, frozen=True, kw_only=True):
    job_id: str
    run: str = ""
    exit_code: int = 0


# JobFailed's reason and exit code when the executor stopped the run at its spec's `max_runtime_s`, as Slurm
# ends a job at its time limit (state TIMEOUT): the job ran out of the time it declared, not into a broken
# machine, so the failure is final and never retried. 124 is the exit status of `timeout(1)` for the same
# thing; being below 128 it does not read as "killed by a signal" (which retries).
RUNTIME_LIMIT: Final = "runtime_limit"
RUNTIME_LIMIT_EXIT_CODE: Final = 124


class JobFailed(EventBase, frozen=True, kw_only=True):
    job_id: str
    run: str = ""
    exit_code: int
    reason: str


class JobEvicted(EventBase, frozen=True, kw_only=True):
    job_id: str
    run: str = ""
    reason: str
    # The checkpoint the job resumes from, and how many seconds of its work it holds.
    checkpoint: str = ""
    progress_s: float = 0.0


class JobCheckpointed(EventBase, frozen=True, kw_only=True):
    """A running job saved its state: a later run resumes from `checkpoint` with `progress_s` of its work
    done, so an eviction loses only what came after."""

    job_id: str
    run: str = ""
    checkpoint: str
    progress_s: float = 0.0


# --- node telemetry -----------------------------------------------------------------------------


class NodeRegistered(EventBase, frozen=True, kw_only=True):
    node: NodeSpec


class NodeLost(EventBase, frozen=True, kw_only=True):
    """The node stopped serving (its executor went silent, Kubernetes says NotReady); its jobs stop and go
    back to their queues. With `removed`, it also left the inventory (an operator removed it, or the cluster
    source no longer lists it): it comes back only by registering again."""

    node: str
    reason: str
    removed: bool = False


class GpuHealthChanged(EventBase, frozen=True, kw_only=True):
    node: str
    index: int
    healthy: bool
    reason: str
    xid: int = 0


class GpuFault(EventBase, frozen=True, kw_only=True):
    """What a node agent observed on one GPU: an XID error, an uncorrectable ECC error count, thermal or
    power throttling. Node-telemetry decides what it means (a fatal one quarantines the GPU)."""

    node: str
    index: int
    kind: str  # "xid", "ecc", "thermal", "power" or "npu" (an Ascend NPU's health level)
    code: int = 0  # the XID, the new uncorrectable ECC count, or the NPU's new health level
    detail: str = ""


class NodeCordoned(EventBase, frozen=True, kw_only=True):
    node: str
    drain: bool = False
    reason: str = ""
    operator: str = ""


class NodeUncordoned(EventBase, frozen=True, kw_only=True):
    node: str
    reason: str = ""
    operator: str = ""


class ClockTick(EventBase, frozen=True, kw_only=True):
    pass


# --- audit --------------------------------------------------------------------------------------


class AuditCheckpoint(EventBase, frozen=True, kw_only=True):
    """A keyed attestation of a service's decision chain: HMAC-SHA256 over service, head and count with a
    key only the platform holds, so a forger who rewrites the chain cannot re-sign it."""

    service: str
    head: str
    decisions: int
    mac: str


Event = (
    SubmitJob
    | CancelJob
    | JobSubmitted
    | JobAdmitted
    | JobRejected
    | JobCancelled
    | QueuePolicyChanged
    | PriorityClassesChanged
    | SchedulingSettingsChanged
    | QuotaReserved
    | QuotaReleased
    | QuotaRecalled
    | QuotaDeferred
    | JobPlaced
    | PlacementDeferred
    | PreemptionDecided
    | JobStarted
    | JobReady
    | JobFinished
    | JobFailed
    | JobEvicted
    | JobCheckpointed
    | NodeRegistered
    | NodeLost
    | GpuHealthChanged
    | GpuFault
    | CordonNode
    | UncordonNode
    | RemoveNode
    | NodeCordoned
    | NodeUncordoned
    | ClockTick
    | AuditCheckpoint
    | DeployService
    | DeleteService
    | ReportServiceLoad
    | ServiceDeployed
    | ServiceRejected
    | ServiceScaled
    | ServiceDeleted
)

ALL_EVENT_TYPES: Final[tuple[type[EventBase], ...]] = Event.__args__
COMMAND_TYPES: Final[frozenset[type[EventBase]]] = frozenset({SubmitJob, CancelJob, CordonNode, UncordonNode,
                                                                   RemoveNode,
                                                                   DeployService, DeleteService, ReportServiceLoad})


def subject_for_type(event_type: type[EventBase]) -> str:
    kind = "c" if event_type in COMMAND_TYPES else "e"
    return f"{SUBJECT_PREFIX}.{kind}.{event_type.__name__}"

