"""Admission: validate, de-duplicate and accept or reject each submission; accept cancellations.

The same `validate` answers the HTTP request at once and decides the logged outcome, so the API and the
log never disagree about what is acceptable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from contracts import (
    CancelJob,
    DeleteService,
    DeployService,
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobRejected,
    JobSpec,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PriorityClassesChanged,
    QueuePolicyChanged,
    ReportServiceLoad,
    ServiceDeleted,
    ServiceDeployed,
    ServiceRejected,
    ServiceScaled,
    ServiceSpec,
    SubmitJob,
)
from libs.core.admission.capacity import Inventory, Rejection, capacity_rejection, spec_problem
from libs.core.admission.idempotency_keys import KEY_REUSED, KeyBook, Resubmission, key_reused, refused_id
from libs.core.admission.inference_services import ServiceBook, replica_spec, service_problem
from libs.core.kernel.decider import Chain, Decisions, Trigger, derived_id
from libs.core.kernel.policy import PolicyBook, demand_milli, replica_milli
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns

SERVICE = "admission"

TERMINAL = frozenset({"rejected", "cancelled", "succeeded", "failed"})


def job_id_for_key(team: str, idempotency_key: str) -> str:
    """Same team and key, same job id: a retried submission is recognised, never duplicated. The team's length
    goes first, so that no other team and key join into the same name ("ml/nlp" + "k" is not "ml" + "nlp/k")."""
    return derived_id("job", len(team), team, idempotency_key)


def validate(spec: JobSpec, policy: PolicyBook, inventory: Inventory) -> Rejection | None:
    """Every reason a job can never be admitted, each with its own code; None when acceptable."""
    queue = policy.queues.get(spec.queue)
    if not policy.has_team(spec.team):
        return Rejection("unknown_team", f"team {spec.team!r} has no queue")
    if queue is None:
        return Rejection("unknown_queue", f"queue {spec.queue!r} does not exist")
    if not policy.quotas.is_leaf(spec.queue):
        children = ", ".join(policy.quotas.children.get(spec.queue, []))
        return Rejection("queue_not_leaf", f"queue {spec.queue!r} groups other queues ({children}); submit to one")
    if queue.team != spec.team:
        return Rejection("queue_not_of_team", f"queue {spec.queue!r} belongs to team {queue.team!r}")
    if spec.priority not in policy.classes:
        known = ", ".join(sorted(policy.classes))
        return Rejection("unknown_priority_class", f"priority class {spec.priority!r} unknown ({known})")
    if spec.replicas < 1:
        return Rejection("invalid_replicas", f"replicas must be >= 1, got {spec.replicas}")
    if spec.gpu_milli < 0 or spec.gpu_milli >= 1000:
        return Rejection("gpu_milli_out_of_range", f"gpu_milli must be 1..999, got {spec.gpu_milli}")
    if spec.gpu_milli == 0 and spec.gpus <= 0:
        return Rejection("invalid_resources", f"a job needs at least one GPU or a GPU fraction, got gpus={spec.gpus}")
    if spec.gpu_milli > 0 and spec.gpus > 1:
        return Rejection("invalid_resources", "a GPU fraction is a share of one GPU: gpus must be 0 or 1")
    for name, value in (("cpu_milli", spec.cpu_milli), ("memory_mib", spec.memory_mib),
                        ("gpu_memory_mib", spec.gpu_memory_mib)):
        if value < 0:
            return Rejection("invalid_resources", f"{name} must be >= 0, got {value}")
    for name, maybe in (("duration_s", spec.duration_s), ("max_runtime_s", spec.max_runtime_s)):
        if maybe is not None and maybe <= 0:
            return Rejection("invalid_duration", f"{name} must be > 0, got {maybe}")
    problem = spec_problem(spec) or capacity_rejection(spec, inventory)
    if problem is not None:
        return problem
    if queue.user_max_gpus is not None and demand_milli(spec) > queue.user_max_gpus * 1000:
        return Rejection("exceeds_user_limit", f"the job needs {demand_milli(spec) / 1000:g} GPUs; a user of queue "
                         f"{spec.queue!r} may hold at most {queue.user_max_gpus}")
    book = policy.quotas
    if book.governed(spec.queue):
        flavors = book.flavors_for(spec.queue, spec)
        if not flavors:
            return Rejection("no_quota_for_models", f"queue {spec.queue!r} has no quota for GPU model(s) "
                             f"{', '.join(spec.gpu_models)}")
        borrows = policy.preemptible(spec)  # a job that cannot be preempted never borrows (see quota)
        most = max(book.ceiling(spec.queue, f, borrows) for f in flavors)
        if demand_milli(spec) > most:
            how = "with borrowing" if borrows else "within its nominal quota, as the job cannot be preempted"
            return Rejection("exceeds_queue_quota",
                             f"the job needs {demand_milli(spec) / 1000:g} GPUs; queue {spec.queue!r} can hold at "
                             f"most {most / 1000:g} {how} ({replica_milli(spec) / 1000:g} per replica)")
    return None


class AdmissionDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.policy = PolicyBook()
        self.inventory = Inventory()
        self.jobs: dict[str, str] = {}
        self.job_team: dict[str, str] = {}
        self.specs: dict[str, JobSpec] = {}  # jobs not yet final
        self.keys = KeyBook()  # which job holds each idempotency key, and with which spec
        self.retries = RetryBook()
        self.services = ServiceBook()
        # The service whose replica ended for good with the event being folded (react replaces it).
        self._ended_replica_of: str | None = None

    def input_types(self) -> Iterable[type[EventBase]]:
        # JobPlaced only for its book of current runs (self.runs): which run each report is about.
        # NodeLost for the nodes that leave the inventory (removed): what the cluster could ever offer shrinks.
        return (SubmitJob, CancelJob, QueuePolicyChanged, PriorityClassesChanged, NodeRegistered, NodeLost, JobPlaced,
                JobFinished, JobFailed, JobEvicted, JobReady, DeployService, DeleteService, ReportServiceLoad)

    def evolve(self, event: EventBase) -> None:
        self._ended_replica_of = None
        if self.policy.apply(event):
            return
        match event:
            case NodeRegistered():
                self.inventory.register(event)
            case NodeLost() if event.removed:
                self.inventory.unregister(event.node)
            case JobSubmitted():
                self.jobs[event.job_id] = "submitted"
                self.job_team[event.job_id] = event.spec.team
                self.specs[event.job_id] = event.spec
                self.keys.decided(event.job_id, event.spec)
                if event.spec.service:
                    self.services.replica_submitted(event.job_id, event.spec)
            case JobAdmitted():
                self.jobs[event.job_id] = "admitted"
            case JobRejected():
                self.jobs[event.job_id] = "rejected"
                if event.spec is not None:
                    self.keys.decided(event.job_id, event.spec, holds=event.code != KEY_REUSED)
            case JobCancelled():
                self.jobs[event.job_id] = "cancelled"
                self.services.replica_gone(event.job_id)
            case JobReady():
                self.services.replica_ready(event.job_id)
            case JobEvicted():
                self.services.replica_ready(event.job_id, False)  # requeued: not ready until it runs again
            case JobFinished() if event.job_id in self.jobs:
                self.jobs[event.job_id] = "succeeded" if event.exit_code == 0 else "failed"
                self.specs.pop(event.job_id, None)
                self._ended_replica_of = self.services.replica_gone(event.job_id)
            case JobFailed() if event.job_id in self.jobs:
                if self.retries.on_failed(event, self.specs.get(event.job_id), self.policy) is None:
                    self.jobs[event.job_id] = "failed"
                    self.specs.pop(event.job_id, None)
                    self._ended_replica_of = self.services.replica_gone(event.job_id)
                else:
                    self.services.replica_ready(event.job_id, False)
            case ServiceDeployed():
                self.services.deployed(event.service, event.id)
            case ServiceScaled() if event.service in self.services.services:
                self.services.scaled(event.service, event.to_replicas, event.ts)
            case ServiceDeleted():
                self.services.deleted(event.name)

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        event = trigger.event
        if isinstance(event, SubmitJob):
            self._submit(event, out)
        elif isinstance(event, CancelJob):
            self._cancel(event, out)
        elif isinstance(event, ReportServiceLoad):
            self._autoscale(event, out)
        elif isinstance(event, DeployService):
            self._deploy(event, out)
        elif isinstance(event, DeleteService):
            self._delete(event, out)
        elif self._ended_replica_of is not None:  # a replica ended for good: run another in its place
            self._reconcile(self._ended_replica_of, out)
        return out.out

    # --- inference services ---------------------------------------------------------------------

    def service_refusal(self, spec: ServiceSpec) -> Rejection | None:
        """Why a deployment is refused (answered by the API at once, and decided the same on the log)."""
        problem = service_problem(spec)
        if problem is not None:
            return Rejection(*problem)
        rejection = validate(replica_spec(spec, 0), self.policy, self.inventory)
        if rejection is not None:
            return rejection
        # Every replica at once must fit the cluster's GPUs of the allowed models, as a gang's would.
        rejection = validate(replica_spec(spec, 0, replicas=spec.max_replicas), self.policy, self.inventory)
        if rejection is not None and rejection.code == "exceeds_cluster_capacity":
            return Rejection(rejection.code, f"max_replicas {spec.max_replicas}: {rejection.message}")
        existing = self.services.services.get(spec.name)
        if existing is None:
            return None
        if existing.spec.replica.team != spec.replica.team:
            return Rejection("service_exists", f"service {spec.name!r} belongs to team {existing.spec.replica.team!r}")
        if existing.spec.replica != spec.replica or existing.spec.spread != spec.spread:
            return Rejection("replica_spec_changed", f"service {spec.name!r} runs another replica spec; an update "
                             "may change replica bounds and autoscaling only (delete and deploy it again)")
        return None

    def _deploy(self, cmd: DeployService, out: Decisions) -> None:
        spec = cmd.service
        rejection = self.service_refusal(spec)
        if rejection is not None:
            out.emit(ServiceRejected, correlation_id=spec.name, name=spec.name, code=rejection.code,
                     message=rejection.message)
            return
        out.emit(ServiceDeployed, correlation_id=spec.name, service=spec)
        state = self.services.services[spec.name]
        target = state.bounded(state.desired)
        if target != state.desired:
            reason = "deployed" if state.next_ordinal == 0 else "replica bounds changed"
            out.emit(ServiceScaled, correlation_id=spec.name, service=spec.name, from_replicas=state.desired,
                     to_replicas=target, reason=reason)
        self._reconcile(spec.name, out)

    def _delete(self, cmd: DeleteService, out: Decisions) -> None:
        state = self.services.services.get(cmd.name)
        if state is None or (cmd.team and state.spec.replica.team != cmd.team):
            return
        for job_id in sorted(state.replicas):
            out.emit(JobCancelled, correlation_id=job_id, job_id=job_id, reason="service_deleted")
        out.emit(ServiceDeleted, correlation_id=cmd.name, name=cmd.name, reason=cmd.reason)

    def _autoscale(self, report: ReportServiceLoad, out: Decisions) -> None:
        state = self.services.services.get(report.service)
        if state is None or state.spec.autoscaling is None or state.spec.autoscaling.metric != report.metric:
            return
        if not (math.isfinite(report.value) and report.value >= 0):
            return  # not a load: the API refuses it; over the bus it changes nothing
        target = state.next_desired(report.ts, report.value)
        if target != state.desired:
            scaling = state.spec.autoscaling
            reason = (f"{report.metric} {report.value:g} at {scaling.target_per_replica:g} per replica: "
                      f"{state.desired} -> {target} replicas")
            out.emit(ServiceScaled, correlation_id=report.service, service=report.service,
                     from_replicas=state.desired, to_replicas=target, reason=reason, metric=report.metric,
                     value=report.value)
        self._reconcile(report.service, out)

    def _reconcile(self, name: str, out: Decisions) -> None:
        """Submit or stop replica jobs until the live ones match the desired count."""
        state = self.services.services[name]
        missing = state.desired - len(state.replicas)
        for _ in range(missing):
            job_id = state.next_replica_id()
            spec = replica_spec(state.spec, state.next_ordinal)
            out.emit(JobSubmitted, correlation_id=job_id, job_id=job_id, spec=spec)
            out.emit(JobAdmitted, correlation_id=job_id, job_id=job_id, queue=spec.queue)
        if missing < 0:
            for job_id in state.to_cancel(-missing):
                out.emit(JobCancelled, correlation_id=job_id, job_id=job_id, reason="scaled_down")

    def resubmission(self, job_id: str, spec: JobSpec) -> Resubmission | None:
        """A keyed submission whose job id or key is taken (see admission/idempotency_keys.py); None otherwise."""
        return self.keys.resubmission(job_id, spec, self.jobs)

    def _submit(self, cmd: SubmitJob, out: Decisions) -> None:
        again = self.resubmission(cmd.job_id, cmd.spec)
        if again is not None:
            self._refuse_resubmission(cmd, again, out)
            return
        if cmd.job_id in self.jobs:
            return  # the same submission again (no key): the first one's outcome stands
        rejection = validate(cmd.spec, self.policy, self.inventory)
        if rejection is not None:
            out.emit(JobRejected, correlation_id=cmd.job_id, job_id=cmd.job_id, code=rejection.code,
                     message=rejection.message, spec=cmd.spec)
            return
        out.emit(JobSubmitted, correlation_id=cmd.job_id, job_id=cmd.job_id, spec=cmd.spec)
        out.emit(JobAdmitted, correlation_id=cmd.job_id, job_id=cmd.job_id, queue=cmd.spec.queue)

    def _refuse_resubmission(self, cmd: SubmitJob, again: Resubmission, out: Decisions) -> None:
        """The same key and spec again under the same id: nothing to decide (the first outcome stands). Anything
        else is refused with a reason: a new job id is rejected itself; a taken one is left alone and the refusal
        is recorded under an id of its own (`refused_id`), so that the log says why the spec never ran."""
        if again.same and again.job_id == cmd.job_id:
            return
        job_id = cmd.job_id if cmd.job_id not in self.jobs else refused_id(cmd.job_id, cmd.spec)
        if job_id in self.jobs:
            return  # this very spec was refused before
        rejection = key_reused(again, self.specs.get(again.job_id), cmd.spec)
        out.emit(JobRejected, correlation_id=job_id, job_id=job_id, code=rejection.code, message=rejection.message,
                 spec=cmd.spec)

    def cancel_refusal(self, job_id: str, team: str) -> Rejection | None:
        state = self.jobs.get(job_id)
        if state is None or (team and self.job_team.get(job_id) != team):
            return Rejection("unknown_job", f"job {job_id} not found")
        if state in TERMINAL:
            return Rejection("job_final", f"job {job_id} is already {state}")
        return None

    def _cancel(self, cmd: CancelJob, out: Decisions) -> None:
        if self.cancel_refusal(cmd.job_id, cmd.team) is None:
            service = self.services.replica_of.get(cmd.job_id)
            out.emit(JobCancelled, correlation_id=cmd.job_id, job_id=cmd.job_id, reason=cmd.reason)
            if service is not None and service in self.services.services:
                self._reconcile(service, out)  # a service keeps its count: a stopped replica is replaced

    def snapshot(self) -> bytes:
        return msgspec.json.encode({"jobs": self.jobs, "teams": self.job_team})
