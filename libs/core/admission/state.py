"""Admission's state as plain data, folded from the log (admission/fold.py): every job it decided and how that
job stands, the specs of the jobs not yet over, the idempotency keys, the inference services, the queues and
priority classes, and what the cluster could ever offer."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import JobSpec
from libs.core.admission.capacity import Inventory
from libs.core.admission.idempotency_keys import KeyBook
from libs.core.admission.inference_services import ServiceBook
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.retries import RetryBook

# The states a job is over in: a cancellation is refused, as nothing is left to cancel.
TERMINAL = frozenset({"rejected", "cancelled", "succeeded", "failed"})


@dataclass(slots=True, eq=False)
class AdmissionState:
    policy: PolicyBook = field(default_factory=PolicyBook)
    inventory: Inventory = field(default_factory=Inventory)
    # job -> submitted, admitted, or one of TERMINAL
    jobs: dict[str, str] = field(default_factory=dict)
    job_team: dict[str, str] = field(default_factory=dict)
    specs: dict[str, JobSpec] = field(default_factory=dict)  # jobs not yet final
    keys: KeyBook = field(default_factory=KeyBook)  # which job holds each idempotency key, and with which spec
    retries: RetryBook = field(default_factory=RetryBook)
    services: ServiceBook = field(default_factory=ServiceBook)
    # The service whose replica ended for good with the event just folded (the fold sets it, react replaces the
    # replica): a fact of the last event only, cleared by the next.
    ended_replica_of: str | None = None
