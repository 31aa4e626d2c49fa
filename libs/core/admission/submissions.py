"""What admission decides about a job: a submission admitted or rejected (once per job id, and once per
idempotency key), and a cancellation accepted. Each decision is made on admission's state as folded so far."""

from __future__ import annotations

from contracts import CancelJob, JobAdmitted, JobCancelled, JobRejected, JobSpec, JobSubmitted, SubmitJob
from libs.core.admission.idempotency_keys import Resubmission, key_reused, refused_id
from libs.core.admission.rejection import Rejection
from libs.core.admission.service_decisions import reconcile
from libs.core.admission.state import TERMINAL, AdmissionState
from libs.core.admission.validation import validate
from libs.core.kernel.decider import Decisions


def resubmission(state: AdmissionState, job_id: str, spec: JobSpec) -> Resubmission | None:
    """A keyed submission whose job id or key is taken (see admission/idempotency_keys.py); None otherwise."""
    return state.keys.resubmission(job_id, spec, state.jobs)


def submit(state: AdmissionState, cmd: SubmitJob, out: Decisions) -> None:
    again = resubmission(state, cmd.job_id, cmd.spec)
    if again is not None:
        _refuse_resubmission(state, cmd, again, out)
        return
    if cmd.job_id in state.jobs:
        return  # the same submission again (no key): the first one's outcome stands
    rejection = validate(cmd.spec, state.policy, state.inventory)
    if rejection is not None:
        out.emit(JobRejected, correlation_id=cmd.job_id, job_id=cmd.job_id, code=rejection.code,
                 message=rejection.message, spec=cmd.spec)
        return
    out.emit(JobSubmitted, correlation_id=cmd.job_id, job_id=cmd.job_id, spec=cmd.spec)
    out.emit(JobAdmitted, correlation_id=cmd.job_id, job_id=cmd.job_id, queue=cmd.spec.queue)


def _refuse_resubmission(state: AdmissionState, cmd: SubmitJob, again: Resubmission, out: Decisions) -> None:
    """The same key and spec again under the same id: nothing to decide (the first outcome stands). Anything
    else is refused with a reason: a new job id is rejected itself; a taken one is left alone and the refusal
    is recorded under an id of its own (`refused_id`), so that the log says why the spec never ran."""
    if again.same and again.job_id == cmd.job_id:
        return
    job_id = cmd.job_id if cmd.job_id not in state.jobs else refused_id(cmd.job_id, cmd.spec)
    if job_id in state.jobs:
        return  # this very spec was refused before
    rejection = key_reused(again, state.specs.get(again.job_id), cmd.spec)
    out.emit(JobRejected, correlation_id=job_id, job_id=job_id, code=rejection.code, message=rejection.message,
             spec=cmd.spec)


def cancel_refusal(state: AdmissionState, job_id: str, team: str) -> Rejection | None:
    """Why the job cannot be cancelled (by `team`, when named): unknown to it, or over already; None when it can."""
    job_state = state.jobs.get(job_id)
    if job_state is None or (team and state.job_team.get(job_id) != team):
        return Rejection("unknown_job", f"job {job_id} not found")
    if job_state in TERMINAL:
        return Rejection("job_final", f"job {job_id} is already {job_state}")
    return None


def cancel(state: AdmissionState, cmd: CancelJob, out: Decisions) -> None:
    if cancel_refusal(state, cmd.job_id, cmd.team) is None:
        service = state.services.replica_of.get(cmd.job_id)
        out.emit(JobCancelled, correlation_id=cmd.job_id, job_id=cmd.job_id, reason=cmd.reason)
        if service is not None and service in state.services.services:
            reconcile(state, service, out)  # a service keeps its count: a stopped replica is replaced
