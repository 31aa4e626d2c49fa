"""Placement's fold: how each input, and each of its own decisions, changes what it knows. One small handler per
event type, found in one table; none decides anything (libs/core/placement/cycle.py does, after the fold)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.kernel.flavors import charged_flavor, flavor_name
from libs.core.kernel.policy import declared_runtime
from libs.core.placement.nomination import end_nomination, lapse, left_for_good, nominate
from libs.core.placement.order import wait_key
from libs.core.placement.state import PlacementState


def fold(state: PlacementState, event: EventBase) -> None:
    handler = FOLDS.get(type(event))
    if handler is not None:
        handler(state, event)
    elif state.policy.apply(event):  # queue, priority class and settings changes
        state.generation += 1


def submitted(state: PlacementState, event: JobSubmitted) -> None:
    state.specs[event.job_id] = event.spec
    if state.shapes.add(event.spec):
        state.placer.set_typical(state.shapes.typical)
        state.generation += 1


def reserved(state: PlacementState, event: QuotaReserved) -> None:
    spec = reserved_spec(state, event.job_id, event.flavor)
    if spec is not None and event.job_id not in state.placed:
        state.reservations += 1
        state.waiting[event.job_id] = wait_key(state.policy.priority_of(spec), state.reservations, event.job_id)
        # A job whose quota went back unplaced keeps its wait (see quota_released).
        state.waiting_since.setdefault(event.job_id, event.ts)


def placed(state: PlacementState, event: JobPlaced) -> None:
    job_id = event.job_id
    stop_waiting(state, job_id)
    end_nomination(state, job_id)
    left_for_good(state, job_id)
    state.placed[job_id] = event.placements
    if state.allocated_here != job_id:  # else: the cycle's own decision, allocated when it was taken
        state.cluster.allocate(event.placements)
    state.generation += 1
    spec = state.specs.get(job_id)
    runtime = None if spec is None else declared_runtime(spec)
    if runtime is not None:
        state.ends[job_id] = event.ts + runtime
    if spec is not None and spec.service:
        state.service_nodes.setdefault(spec.service, {})[job_id] = tuple(p.node for p in event.placements)
    if state.starving is not None and state.starving.job_id == job_id:
        state.starving = None


def run_over(state: PlacementState, event: JobFinished | JobFailed | JobEvicted) -> None:
    job_id = event.job_id
    placements = state.placed.pop(job_id, None)
    state.ends.pop(job_id, None)
    spec = state.specs.get(job_id)
    if spec is not None and spec.service in state.service_nodes:
        state.service_nodes[spec.service].pop(job_id, None)
    if placements is not None:
        state.cluster.release(placements)
        state.generation += 1
    again = state.retries.runs_again(event, spec, state.policy)
    if not again or job_id in state.cancelled:
        # Over for good, even if a report came while its quota was reserved again (an executor's late word on
        # an earlier run): nothing of it waits any more.
        forget(state, job_id)
        state.cancelled.pop(job_id, None)
        end_nomination(state, job_id)
        stop_waiting(state, job_id)


def tick(state: PlacementState, event: ClockTick) -> None:
    lapse(state, event.ts)


def deferred(state: PlacementState, event: PlacementDeferred) -> None:
    state.deferred[event.job_id] = event.code


def quota_released(state: PlacementState, event: QuotaReleased) -> None:
    if event.job_id in state.waiting:
        let_go(state, event.job_id)


def quota_recalled(state: PlacementState, event: QuotaRecalled) -> None:
    """Quota asks the job's reservation back (its placement timeout): a job still waiting is let go, and the
    cycle answers quota, which then releases it; one placed already keeps its quota (quota reads the placement)."""
    if event.job_id in state.waiting:
        let_go(state, event.job_id)
        state.let_go = event.job_id


def let_go(state: PlacementState, job_id: str) -> None:
    """Its quota goes back before it was placed: it is placed only once quota reserves it again, its wait for
    capacity going on."""
    state.waiting.pop(job_id)
    state.deferred.pop(job_id, None)
    end_nomination(state, job_id)
    if state.starving is not None and state.starving.job_id == job_id:
        # Its hold ends with it: what it held back is tried on the next tick, as after a nomination's end.
        state.starving = None
        state.held_back_free = True


def preemption_decided(state: PlacementState, event: PreemptionDecided) -> None:
    if event.preemptor_id in state.specs:
        nominate(state, event)


def cancelled(state: PlacementState, event: JobCancelled) -> None:
    stop_waiting(state, event.job_id)
    end_nomination(state, event.job_id)
    if event.job_id in state.placed:
        state.cancelled[event.job_id] = None  # its executor will report it gone
    else:
        forget(state, event.job_id)


def node_event(state: PlacementState, event: EventBase) -> None:
    state.cluster.apply_node_event(event)
    state.inventory.fold(event)
    state.generation += 1


def stop_waiting(state: PlacementState, job_id: str) -> None:
    state.waiting.pop(job_id, None)
    state.waiting_since.pop(job_id, None)
    state.deferred.pop(job_id, None)


def forget(state: PlacementState, job_id: str) -> None:
    state.specs.pop(job_id, None)
    state.submitted.pop(job_id, None)


def reserved_spec(state: PlacementState, job_id: str, flavor: str) -> JobSpec | None:
    """The spec the job is placed by under a reservation of `flavor` ("" for any model): quota from one GPU
    model's flavor runs the job on that model; always from the submitted spec, so that a reservation of
    another flavor, or of any model once the queue's flavors are gone, does not keep an earlier one's model."""
    spec = state.specs.get(job_id)
    if spec is None:
        return None
    original = state.submitted.get(job_id, spec)
    if not flavor or original.gpu_models == (flavor,):
        state.submitted.pop(job_id, None)
        state.specs[job_id] = original
        return original
    state.submitted[job_id] = original
    narrowed = state.specs[job_id] = msgspec.structs.replace(original, gpu_models=(flavor,))
    return narrowed


def priority_classes(state: PlacementState, event: PriorityClassesChanged) -> None:
    """A job's priority is its class's value now, everywhere: the waiting jobs' order and the nominated
    preemptors' holds take the new values (as quota's order and holds do), not those they were decided with."""
    state.policy.apply(event)
    state.generation += 1
    for job_id, (_, reservation, _) in state.waiting.items():
        spec = state.specs.get(job_id)
        if spec is not None:
            state.waiting[job_id] = wait_key(state.policy.priority_of(spec), reservation, job_id)
    for job_id, nomination in state.nominated.items():
        spec = state.specs.get(job_id)
        if spec is not None:
            nomination.priority = state.policy.priority_of(spec)


def queue_policy(state: PlacementState, event: QueuePolicyChanged) -> None:
    """A waiting job's reservation follows its queue's current flavors, as quota's does (QuotaBook.recharge):
    one narrowed to a flavor the queue no longer has is placed by the flavor that covers it now (any model, or
    none narrower than the job's own models), and is tried again (cycle.decide): else it would wait for a model
    its quota no longer names, beside free GPUs it may use."""
    state.policy.apply(event)
    state.generation += 1
    state.recharged.clear()
    limits = state.policy.quotas.limits.get(event.queue.name, {})
    for job_id in state.waiting:
        spec = state.specs.get(job_id)
        if job_id not in state.submitted or spec is None or spec.queue != event.queue.name:
            continue  # (only a reservation narrowed to a flavor's model can move: see reserved_spec)
        flavor = spec.gpu_models[0]
        target = charged_flavor(limits, flavor, "")
        if target != flavor:
            reserved_spec(state, job_id, flavor_name(target))
            state.recharged.append(job_id)


FOLDS: dict[type[EventBase], Callable[[PlacementState, Any], None]] = {
    PriorityClassesChanged: priority_classes,
    QueuePolicyChanged: queue_policy,
    JobSubmitted: submitted,
    QuotaReserved: reserved,
    JobPlaced: placed,
    JobFinished: run_over,
    JobFailed: run_over,
    JobEvicted: run_over,
    ClockTick: tick,
    PlacementDeferred: deferred,
    QuotaReleased: quota_released,
    QuotaRecalled: quota_recalled,
    PreemptionDecided: preemption_decided,
    JobCancelled: cancelled,
    NodeRegistered: node_event,
    NodeLost: node_event,
    NodeCordoned: node_event,
    NodeUncordoned: node_event,
    GpuHealthChanged: node_event,
}
