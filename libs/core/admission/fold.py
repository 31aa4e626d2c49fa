"""Admission's fold: one event into its state (admission/state.py), by one small handler per event type. It
decides nothing: what was submitted, admitted, rejected, cancelled or ended, and the services' replicas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobReady,
    JobRejected,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    ServiceDeleted,
    ServiceDeployed,
    ServiceScaled,
)
from libs.core.admission.idempotency_keys import KEY_REUSED
from libs.core.admission.state import AdmissionState

Fold = Callable[[AdmissionState, Any], None]


def fold(state: AdmissionState, event: EventBase) -> None:
    """Fold one event: queue and priority-class changes go to the policy book; every other event to its handler."""
    state.ended_replica_of = None
    if state.policy.apply(event):
        return
    handler = FOLDS.get(type(event))
    if handler is not None:
        handler(state, event)


def _node_registered(state: AdmissionState, event: NodeRegistered) -> None:
    state.inventory.register(event)


def _node_lost(state: AdmissionState, event: NodeLost) -> None:
    if event.removed:  # out of the inventory: what the cluster could ever offer shrinks (a lost node may return)
        state.inventory.unregister(event.node)


def _submitted(state: AdmissionState, event: JobSubmitted) -> None:
    state.jobs[event.job_id] = "submitted"
    state.job_team[event.job_id] = event.spec.team
    state.specs[event.job_id] = event.spec
    state.keys.decided(event.job_id, event.spec)
    if event.spec.service:
        state.services.replica_submitted(event.job_id, event.spec)


def _admitted(state: AdmissionState, event: JobAdmitted) -> None:
    state.jobs[event.job_id] = "admitted"


def _rejected(state: AdmissionState, event: JobRejected) -> None:
    state.jobs[event.job_id] = "rejected"
    if event.spec is not None:
        state.keys.decided(event.job_id, event.spec, holds=event.code != KEY_REUSED)


def _cancelled(state: AdmissionState, event: JobCancelled) -> None:
    state.jobs[event.job_id] = "cancelled"
    state.services.replica_gone(event.job_id)


def _ready(state: AdmissionState, event: JobReady) -> None:
    state.services.replica_ready(event.job_id)


def _evicted(state: AdmissionState, event: JobEvicted) -> None:
    state.services.replica_ready(event.job_id, False)  # requeued: not ready until it runs again


def _finished(state: AdmissionState, event: JobFinished) -> None:
    if event.job_id in state.jobs:
        _over(state, event.job_id, "succeeded" if event.exit_code == 0 else "failed")


def _failed(state: AdmissionState, event: JobFailed) -> None:
    if event.job_id not in state.jobs:
        return
    if state.retries.runs_again(event, state.specs.get(event.job_id), state.policy):
        state.services.replica_ready(event.job_id, False)
    else:
        _over(state, event.job_id, "failed")


def _over(state: AdmissionState, job_id: str, outcome: str) -> None:
    """The job is over: its spec is forgotten, and a service's replica is to be replaced."""
    state.jobs[job_id] = outcome
    state.specs.pop(job_id, None)
    state.ended_replica_of = state.services.replica_gone(job_id)


def _service_deployed(state: AdmissionState, event: ServiceDeployed) -> None:
    state.services.deployed(event.service, event.id)


def _service_scaled(state: AdmissionState, event: ServiceScaled) -> None:
    if event.service in state.services.services:
        state.services.scaled(event.service, event.to_replicas, event.ts)


def _service_deleted(state: AdmissionState, event: ServiceDeleted) -> None:
    state.services.deleted(event.name)


FOLDS: dict[type[EventBase], Fold] = {
    NodeRegistered: _node_registered,
    NodeLost: _node_lost,
    JobSubmitted: _submitted,
    JobAdmitted: _admitted,
    JobRejected: _rejected,
    JobCancelled: _cancelled,
    JobReady: _ready,
    JobEvicted: _evicted,
    JobFinished: _finished,
    JobFailed: _failed,
    ServiceDeployed: _service_deployed,
    ServiceScaled: _service_scaled,
    ServiceDeleted: _service_deleted,
}
