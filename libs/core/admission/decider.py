"""Admission: validate, de-duplicate and accept or reject each submission; accept cancellations; run inference
services' replicas.

The decider is its state (admission/state.py) with the decider protocol over it: `evolve` is the fold
(admission/fold.py); `react` hands each command to its handler (admission/submissions.py for jobs,
admission/service_decisions.py for services). The API asks the same questions the handlers ask (`validate`,
`service_refusal`, `cancel_refusal`, `resubmission`), so that the API and the log never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from contracts import (
    CancelJob,
    DeleteService,
    DeployService,
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobSpec,
    NodeLost,
    NodeRegistered,
    PriorityClassesChanged,
    QueuePolicyChanged,
    ReportServiceLoad,
    ServiceSpec,
    SubmitJob,
)
from libs.core.admission import service_decisions, submissions
from libs.core.admission.capacity import Rejection
from libs.core.admission.fold import fold
from libs.core.admission.idempotency_keys import Resubmission
from libs.core.admission.state import AdmissionState
from libs.core.kernel.decider import Decisions, Trigger

SERVICE = "admission"

# (the state, the command, the decisions so far)
Handler = Callable[[AdmissionState, Any, Decisions], None]
COMMANDS: dict[type[EventBase], Handler] = {
    SubmitJob: submissions.submit,
    CancelJob: submissions.cancel,
    ReportServiceLoad: service_decisions.autoscale,
    DeployService: service_decisions.deploy,
    DeleteService: service_decisions.delete,
}


class AdmissionDecider(AdmissionState):
    __slots__ = ()  # the state is all there is
    name = SERVICE

    def input_types(self) -> Iterable[type[EventBase]]:
        # JobPlaced only for its book of current runs (self.runs): which run each report is about.
        # NodeLost for the nodes that leave the inventory (removed): what the cluster could ever offer shrinks.
        return (SubmitJob, CancelJob, QueuePolicyChanged, PriorityClassesChanged, NodeRegistered, NodeLost, JobPlaced,
                JobFinished, JobFailed, JobEvicted, JobReady, DeployService, DeleteService, ReportServiceLoad)

    def evolve(self, event: EventBase) -> None:
        fold(self, event)

    def react(self, trigger: Trigger) -> list[EventBase]:
        """1. A command goes to its handler, which decides.
        2. Any other input decides something only when a service's replica ended for good with it: another
           replica takes its place."""
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        handler = COMMANDS.get(type(trigger.event))
        if handler is not None:
            handler(self, trigger.event, out)
        elif self.ended_replica_of is not None:
            service_decisions.reconcile(self, self.ended_replica_of, out)
        return out.out

    def service_refusal(self, spec: ServiceSpec) -> Rejection | None:
        """Why a deployment is refused (answered by the API at once, and decided the same on the log)."""
        return service_decisions.service_refusal(self, spec)

    def resubmission(self, job_id: str, spec: JobSpec) -> Resubmission | None:
        """A keyed submission whose job id or key is taken (see admission/idempotency_keys.py); None otherwise."""
        return submissions.resubmission(self, job_id, spec)

    def cancel_refusal(self, job_id: str, team: str) -> Rejection | None:
        return submissions.cancel_refusal(self, job_id, team)

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"jobs": self.jobs, "teams": self.job_team})
