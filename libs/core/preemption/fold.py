"""Preemption's fold: what each input (and each of its own decisions) changes in what the decider knows.

One handler per event type, in a table; none decides anything (the cycle, cycle.py, does). Every event but the
clock tick marks the world changed, so that the next tick looks at the waiting jobs again.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from contracts import (
    RECLAIM,
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.kernel.attained_service import threshold_milli_s
from libs.core.kernel.flavors import reservation_model
from libs.core.kernel.policy import PolicyBook, declared_runtime, demand_milli
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.starvation import CAPACITY_HELD
from libs.core.kernel.wait_reasons import (
    BUDGET_WAITS,
    RESERVATION_RETURNED,
    RETRY_BACKOFF,
    USER_LIMIT,
    WAITING_FOR_QUOTA,
)
from libs.core.preemption.state import PLACEMENT, PreemptionState, Running, World

# Quota deferrals of a job held by its own circumstances, not by others' use of quota or GPUs: its reclaim
# grace starts again once it waits for quota again.
HELD_BY_ITS_OWN = BUDGET_WAITS | {USER_LIMIT, RETRY_BACKOFF}


def fold(world: World, event: EventBase) -> None:
    """Fold one event into the world."""
    if type(event) is not ClockTick:
        world.state.changed = True
    world.state.clock = event.ts
    FOLDS.get(type(event), fold_other)(world, event)


# --- one handler per event type -------------------------------------------------------------------------------

def fold_quota_reserved(world: World, event: QuotaReserved) -> None:
    state = world.state
    flavor = event.flavor or ANY
    state.reserved[event.job_id] = (event.queue, flavor, event.gpu_milli, event.over_budget)
    state.reserved_at[event.job_id] = event.ts
    state.capacity_held.pop(event.job_id, None)
    world.policy.quotas.add(event.queue, flavor, event.gpu_milli, event.over_budget)
    state.unwait(event.job_id)
    state.ended.pop(event.job_id, None)


def fold_quota_released(world: World, event: QuotaReleased) -> None:
    state = world.state
    held_quota = state.reserved.pop(event.job_id, None)
    state.reserved_at.pop(event.job_id, None)
    state.capacity_held.pop(event.job_id, None)
    state.ended.pop(event.job_id, None)
    if held_quota is not None:
        queue, flavor, milli, over_budget = held_quota
        world.policy.quotas.add(queue, flavor, -milli, over_budget)


def fold_job_placed(world: World, event: JobPlaced) -> None:
    state = world.state
    state.unwait(event.job_id)
    state.pending_since.pop(event.job_id, None)
    state.placed_count += 1
    _recharge_placed(world, event)
    run = _run_of(world, event)
    state.run(run)
    state.attained.started(run.job_id, run.started, run.demand)
    _watch_service(state, world.policy, run)
    world.cluster.allocate(event.placements)


def fold_job_submitted(world: World, event: JobSubmitted) -> None:
    state = world.state
    state.submitted.setdefault(event.job_id, event.ts)
    if event.job_id in state.waiting:  # its spec changes under the indexes
        grace = event.job_id in state.grace_of
        state.unindex(event.job_id)
        state.specs[event.job_id] = event.spec
        state.index(event.job_id, event.spec.queue, world.policy.priority_of(event.spec), grace)
    else:
        state.specs[event.job_id] = event.spec


def fold_run_over(world: World, event: JobFinished | JobFailed | JobEvicted) -> None:
    """A run ended; the job is gone for good unless it runs again (evicted, or a failure it retries)."""
    state = world.state
    again = world.retries.runs_again(event, state.specs.get(event.job_id), world.policy)
    state.attained.stopped(event.job_id, event.ts)
    _gone(world, event.job_id, final=not again or event.job_id in state.cancelled)


def fold_placement_deferred(world: World, event: PlacementDeferred) -> None:
    if event.code == RESERVATION_RETURNED:
        # Placement let the job go at its placement timeout, and its reservation goes back on this answer: it
        # waits for no place (and quota tells it how it waits next), so nothing is evicted for it as one.
        world.state.unwait(event.job_id)
        world.state.capacity_held.pop(event.job_id, None)
        return
    _wait(world, event.job_id, PLACEMENT, event.ts)
    if event.code == CAPACITY_HELD:
        world.state.capacity_held[event.job_id] = None
    else:
        world.state.capacity_held.pop(event.job_id, None)


def fold_quota_deferred(world: World, event: QuotaDeferred) -> None:
    if event.code in WAITING_FOR_QUOTA:
        _wait(world, event.job_id, event.code, event.ts)
        return
    world.state.unwait(event.job_id)
    if event.code in HELD_BY_ITS_OWN:  # its user's limit, a budget, a failure's backoff: no reclaim could
        world.state.pending_since.pop(event.job_id, None)  # serve it, so no reclaim grace runs meanwhile


def fold_job_checkpointed(world: World, event: JobCheckpointed) -> None:
    run = world.state.running.get(event.job_id)
    if run is not None:
        run.last_checkpoint = event.ts


def fold_preemption_decided(world: World, event: PreemptionDecided) -> None:
    state = world.state
    state.in_flight[event.preemptor_id] = [victim.job_id for victim in event.victims]
    for victim in event.victims:
        state.victim_of[victim.job_id] = event.preemptor_id
        state.preempted_by.setdefault(victim.job_id, {})[event.preemptor_id] = None
        if victim.reason != RECLAIM:  # a reclaim of lent quota is outside the budget (Simulation.choose)
            state.evicted.setdefault(victim.queue, []).append((event.ts, victim.gpu_milli))


def fold_job_cancelled(world: World, event: JobCancelled) -> None:
    state = world.state
    state.unwait(event.job_id)
    if event.job_id in state.running:
        state.cancelled[event.job_id] = None  # still holds its GPUs until its executor stops it
    else:
        _gone(world, event.job_id, final=True)


def fold_node_event(world: World, event: EventBase) -> None:
    world.cluster.apply_node_event(event)
    world.models.fold(event)


def fold_priority_classes(world: World, event: PriorityClassesChanged) -> None:
    world.policy.apply(event)
    world.state.rerank(world.policy)


def fold_queue_policy(world: World, event: QueuePolicyChanged) -> None:
    world.policy.apply(event)
    _recharge(world, event.queue.name)
    for run in world.state.by_queue.get(event.queue.name, {}).values():
        _watch_service(world.state, world.policy, run)  # (ordering by least attained service, maybe from now on)


def fold_other(world: World, event: EventBase) -> None:
    """The scheduling settings, or any other policy event the policy book knows."""
    world.policy.apply(event)


def fold_clock_tick(world: World, event: ClockTick) -> None:
    """Evictions older than their queue's budget window no longer count: where a budget caps them, the
    queue may lose more again (a tick looks for victims there)."""
    state, now = world.state, event.ts
    for queue in list(state.evicted):
        spec = world.policy.queues.get(queue)
        window = spec.eviction_window_s if spec is not None else 0.0
        entries = state.evicted[queue]
        if entries and now - min(entries)[0] < window:
            continue  # not even the oldest has aged out
        if spec is not None and spec.eviction_budget_gpus is not None:
            state.budget_freed[queue] = None
        kept = [(when, milli) for when, milli in entries if now - when < window]
        if kept:
            state.evicted[queue] = kept
        else:
            del state.evicted[queue]


FOLDS: dict[type[EventBase], Callable[[World, Any], None]] = {
    QuotaDeferred: fold_quota_deferred,
    QuotaReserved: fold_quota_reserved,
    QuotaReleased: fold_quota_released,
    JobPlaced: fold_job_placed,
    JobSubmitted: fold_job_submitted,
    JobFinished: fold_run_over,
    JobFailed: fold_run_over,
    JobEvicted: fold_run_over,
    PlacementDeferred: fold_placement_deferred,
    JobCheckpointed: fold_job_checkpointed,
    PreemptionDecided: fold_preemption_decided,
    JobCancelled: fold_job_cancelled,
    NodeRegistered: fold_node_event,
    NodeLost: fold_node_event,
    NodeCordoned: fold_node_event,
    NodeUncordoned: fold_node_event,
    GpuHealthChanged: fold_node_event,
    PriorityClassesChanged: fold_priority_classes,
    QueuePolicyChanged: fold_queue_policy,
    SchedulingSettingsChanged: fold_other,
    ClockTick: fold_clock_tick,
}


# --- what the handlers share --------------------------------------------------------------------------------

def _wait(world: World, job_id: str, code: str, now: float) -> None:
    state = world.state
    spec = state.specs.get(job_id)
    if spec is None:
        return  # a deferral logged after the job ended (decisions are published after later inputs)
    state.pending_since.setdefault(job_id, now)
    state.wait(job_id, spec.queue, world.policy.priority_of(spec), code, now)


def _gone(world: World, job_id: str, final: bool) -> None:
    """The job no longer runs nor waits (`final`: and never will again: forget it)."""
    state = world.state
    state.unwait(job_id)
    state.capacity_held.pop(job_id, None)
    state.pending_since.pop(job_id, None)
    run = state.running.pop(job_id, None)
    if run is not None:
        state.unindex_running(run)
        world.cluster.release(run.placements)
        if job_id in state.reserved:
            state.ended[job_id] = None
        _released_victims(state, job_id)
    preemptor = state.victim_of.pop(job_id, None)
    if preemptor is not None:
        left = [victim for victim in state.in_flight.get(preemptor, []) if victim != job_id]
        if left:
            state.in_flight[preemptor] = left
        else:
            state.in_flight.pop(preemptor, None)
    if final:
        state.attained.forget(job_id)
        state.specs.pop(job_id, None)
        state.submitted.pop(job_id, None)
        state.in_flight.pop(job_id, None)
        state.cancelled.pop(job_id, None)
        state.preempted_by.pop(job_id, None)


def _released_victims(state: PreemptionState, job_id: str) -> None:
    """The job's run is over: the room its victims gave up is no longer its, so the pair's guard against
    evicting each other back and forth ends (it guards a preemptor's run, and that run is over). Waiting
    again (evicted in turn, or failed and run again), the job may reclaim from a victim that borrows again;
    the victim, running again, may not be spared for a run that is gone."""
    for victim in [v for v, preemptors in state.preempted_by.items() if job_id in preemptors]:
        preemptors = state.preempted_by[victim]
        del preemptors[job_id]
        if not preemptors:
            del state.preempted_by[victim]


def _run_of(world: World, event: JobPlaced) -> Running:
    state, policy = world.state, world.policy
    spec = state.specs.get(event.job_id)
    if spec is None:
        # Placed after it was cancelled: it holds GPUs until its executor reports it gone.
        state.cancelled[event.job_id] = None
        return Running(job_id=event.job_id, queue="", priority=0, preemptible=False, demand=0,
                       started=event.ts, placements=event.placements, placed_order=state.placed_count)
    _, flavor, _, over_budget = state.reserved.get(event.job_id, ("", ANY, 0, False))
    return Running(job_id=event.job_id, queue=spec.queue, priority=policy.priority_of(spec),
                   preemptible=policy.preemptible(spec) or over_budget,
                   demand=demand_milli(spec), started=event.ts, placements=event.placements,
                   flavor=flavor, over_budget=over_budget,
                   min_runtime_s=policy.min_runtime_s(spec), placed_order=state.placed_count,
                   ends_at=None if (runtime := declared_runtime(spec)) is None else event.ts + runtime,
                   checkpoints_on_stop=spec.checkpoint_interval_s is not None)


def _recharge(world: World, queue: str) -> None:
    """The queue's reservations follow its current flavors, as quota's do (QuotaBook.recharge), and so do
    its running jobs' flavors: a reclaim finds borrowed quota where quota charges it."""
    state, book = world.state, world.policy.quotas
    for job_id, (held_queue, flavor, milli, over_budget) in list(state.reserved.items()):
        if held_queue != queue:
            continue
        run = state.running.get(job_id)
        placed = next((r.model for r in run.placements if r.model), "") if run is not None else ""
        target = book.recharge(queue, flavor, reservation_model(flavor, placed, state.specs.get(job_id)),
                               milli, over_budget)
        if target != flavor:
            state.reserved[job_id] = (held_queue, target, milli, over_budget)
            if run is not None:
                run.flavor = target


def _recharge_placed(world: World, event: JobPlaced) -> None:
    """Its model now known, a reservation charged to a flavor its queue no longer has follows it (as quota's
    does, QuotaBook.recharge_placed): its run is then indexed under the flavor a reclaim looks in."""
    held = world.state.reserved.get(event.job_id)
    if held is None:
        return
    queue, flavor, milli, over_budget = held
    model = next((r.model for r in event.placements if r.model), "")
    target = world.policy.quotas.recharge_placed(queue, flavor, model, milli, over_budget)
    if target != flavor:
        world.state.reserved[event.job_id] = (queue, target, milli, over_budget)


def _watch_service(state: PreemptionState, policy: PolicyBook, run: Running) -> None:
    """In a queue of least attained service, a tick looks again once the run passes the threshold: the
    queue's waiting jobs may then preempt it (PreemptionState.unprotected)."""
    threshold = threshold_milli_s(policy.queues.get(run.queue))
    if threshold is None:
        return
    crosses_at = state.attained.crosses_at(run.job_id, threshold)
    if crosses_at is not None:
        heapq.heappush(state.protected_until, (crosses_at, run.job_id))
