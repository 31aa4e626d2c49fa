"""What admission decides about inference services: a deployment accepted or refused, a service deleted, its
replica count scaled on load reports, and its replica jobs kept at the desired count (the rules themselves, HPA's,
are admission/inference_services.py)."""

from __future__ import annotations

import math

from contracts import (
    DeleteService,
    DeployService,
    JobAdmitted,
    JobCancelled,
    JobSubmitted,
    ReportServiceLoad,
    ServiceDeleted,
    ServiceDeployed,
    ServiceRejected,
    ServiceScaled,
    ServiceSpec,
)
from libs.core.admission.inference_services import replica_spec, service_problem
from libs.core.admission.rejection import Rejection
from libs.core.admission.state import AdmissionState
from libs.core.admission.validation import validate
from libs.core.kernel.decider import Decisions


def service_refusal(state: AdmissionState, spec: ServiceSpec) -> Rejection | None:
    """Why a deployment is refused (answered by the API at once, and decided the same on the log)."""
    problem = service_problem(spec)
    if problem is not None:
        return Rejection(*problem)
    rejection = validate(replica_spec(spec, 0), state.policy, state.inventory)
    if rejection is not None:
        return rejection
    # Every replica at once must fit the cluster's GPUs of the allowed models, as a gang's would.
    rejection = validate(replica_spec(spec, 0, replicas=spec.max_replicas), state.policy, state.inventory)
    if rejection is not None and rejection.code == "exceeds_cluster_capacity":
        return Rejection(rejection.code, f"max_replicas {spec.max_replicas}: {rejection.message}")
    existing = state.services.services.get(spec.name)
    if existing is None:
        return None
    if existing.spec.replica.team != spec.replica.team:
        return Rejection("service_exists", f"service {spec.name!r} belongs to team {existing.spec.replica.team!r}")
    if existing.spec.replica != spec.replica or existing.spec.spread != spec.spread:
        return Rejection("replica_spec_changed", f"service {spec.name!r} runs another replica spec; an update "
                         "may change replica bounds and autoscaling only (delete and deploy it again)")
    return None


def deploy(state: AdmissionState, cmd: DeployService, out: Decisions) -> None:
    spec = cmd.service
    rejection = service_refusal(state, spec)
    if rejection is not None:
        out.emit(ServiceRejected, correlation_id=spec.name, name=spec.name, code=rejection.code,
                 message=rejection.message)
        return
    out.emit(ServiceDeployed, correlation_id=spec.name, service=spec)
    service = state.services.services[spec.name]
    target = service.bounded(service.desired)
    if target != service.desired:
        reason = "deployed" if service.next_ordinal == 0 else "replica bounds changed"
        out.emit(ServiceScaled, correlation_id=spec.name, service=spec.name, from_replicas=service.desired,
                 to_replicas=target, reason=reason)
    reconcile(state, spec.name, out)


def delete(state: AdmissionState, cmd: DeleteService, out: Decisions) -> None:
    service = state.services.services.get(cmd.name)
    if service is None or (cmd.team and service.spec.replica.team != cmd.team):
        return
    for job_id in sorted(service.replicas):
        out.emit(JobCancelled, correlation_id=job_id, job_id=job_id, reason="service_deleted")
    out.emit(ServiceDeleted, correlation_id=cmd.name, name=cmd.name, reason=cmd.reason)


def autoscale(state: AdmissionState, report: ReportServiceLoad, out: Decisions) -> None:
    service = state.services.services.get(report.service)
    if service is None or service.spec.autoscaling is None or service.spec.autoscaling.metric != report.metric:
        return
    if not (math.isfinite(report.value) and report.value >= 0):
        return  # not a load: the API refuses it; over the bus it changes nothing
    target = service.next_desired(report.ts, report.value)
    if target != service.desired:
        scaling = service.spec.autoscaling
        reason = (f"{report.metric} {report.value:g} at {scaling.target_per_replica:g} per replica: "
                  f"{service.desired} -> {target} replicas")
        out.emit(ServiceScaled, correlation_id=report.service, service=report.service,
                 from_replicas=service.desired, to_replicas=target, reason=reason, metric=report.metric,
                 value=report.value)
    reconcile(state, report.service, out)


def reconcile(state: AdmissionState, name: str, out: Decisions) -> None:
    """Submit or stop replica jobs until the live ones match the desired count."""
    service = state.services.services[name]
    missing = service.desired - len(service.replicas)
    for _ in range(missing):
        job_id = service.next_replica_id()
        spec = replica_spec(service.spec, service.next_ordinal)
        out.emit(JobSubmitted, correlation_id=job_id, job_id=job_id, spec=spec)
        out.emit(JobAdmitted, correlation_id=job_id, job_id=job_id, queue=spec.queue)
    if missing < 0:
        for job_id in service.to_cancel(-missing):
            out.emit(JobCancelled, correlation_id=job_id, job_id=job_id, reason="scaled_down")
