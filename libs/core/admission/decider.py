"""Admission: validate, de-duplicate and accept or reject each submission; accept cancellations; run inference
services' replicas.

The decider holds its state (admission/state.py, `state`) with the decider protocol over it: `fold` applies the fold
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
from libs.core.admission.fold import fold
from libs.core.admission.idempotency_keys import Resubmission
from libs.core.admission.rejection import Rejection
from libs.core.admission.state import AdmissionState
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.runs import CurrentRuns

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


class AdmissionDecider:
    """Admission's decider: its state (`state`, admission/state.py) with the decider protocol over it."""

    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.state = AdmissionState()

    def input_types(self) -> Iterable[type[EventBase]]:
        # JobPlaced only for its book of current runs (self.runs): which run each report is about.
        # NodeLost for the nodes that leave the inventory (removed): what the cluster could ever offer shrinks.
        return (SubmitJob, CancelJob, QueuePolicyChanged, PriorityClassesChanged, NodeRegistered, NodeLost, JobPlaced,
                JobFinished, JobFailed, JobEvicted, JobReady, DeployService, DeleteService, ReportServiceLoad)

    def fold(self, event: EventBase) -> None:
        fold(self.state, event)

    def react(self, trigger: Trigger) -> list[EventBase]:
        """1. A command goes to its handler, which decides.
        2. Any other input decides something only when a service's replica ended for good with it: another
           replica takes its place."""
        out = Decisions(SERVICE, trigger, self.fold, self.chain)
        handler = COMMANDS.get(type(trigger.event))
        if handler is not None:
            handler(self.state, trigger.event, out)
        elif self.state.ended_replica_of is not None:
            service_decisions.reconcile(self.state, self.state.ended_replica_of, out)
        return out.out

    def service_refusal(self, spec: ServiceSpec) -> Rejection | None:
        """Why a deployment is refused (answered by the API at once, and decided the same on the log)."""
        return service_decisions.service_refusal(self.state, spec)

    def resubmission(self, job_id: str, spec: JobSpec) -> Resubmission | None:
        """A keyed submission whose job id or key is taken (see admission/idempotency_keys.py); None otherwise."""
        return submissions.resubmission(self.state, job_id, spec)

    def cancel_refusal(self, job_id: str, team: str) -> Rejection | None:
        return submissions.cancel_refusal(self.state, job_id, team)

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"jobs": self.state.jobs, "teams": self.state.job_team})
