"""Placement's cycle: what one trigger decides, in numbered steps.

A reservation tries its own job; capacity coming back (a run over, a node registered or uncordoned, a GPU
healthy again) or the order changing (new priorities) tries every waiting job; a queue's change tries them if it
moved a waiting reservation to another flavor; a tick first settles who holds capacity (nominations lapse, the
starving job is found and told), then tries every waiting job if a hold ended or moved; a reservation quota asks
back is answered (the fold let its job go). Which inputs trigger a
pass follows from what it reads (PASS, libs/core/placement/decider.py); REACTIONS answers each of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobEvicted,
    JobFailed,
    JobFinished,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaRecalled,
    QuotaReserved,
)
from libs.core.kernel.decider import Decisions
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.wait_reasons import RESERVATION_RETURNED
from libs.core.placement.attempt import try_place
from libs.core.placement.codes import TOLD_ELSE
from libs.core.placement.starvation import find_starving, tell_starving
from libs.core.placement.state import PlacementState


def decide(state: PlacementState, out: Decisions) -> None:
    """What the trigger (already folded) decides: nothing for an input that is not a trigger."""
    event = out.trigger.event
    reaction = REACTIONS.get(type(event))
    if reaction is not None:
        reaction(state, event, out)


def reserved(state: PlacementState, event: QuotaReserved, out: Decisions) -> None:
    if event.job_id in state.waiting:
        try_place(state, event.job_id, out)


def recalled(state: PlacementState, event: QuotaRecalled, out: Decisions) -> None:
    """Quota asked a reservation back, and the fold let its job go: quota is told, and releases it. (A job
    placed before the ask was read is not answered: quota reads its placement, and it keeps its quota.)"""
    job_id, state.let_go = state.let_go, None
    if job_id is not None:
        out.emit(PlacementDeferred, correlation_id=job_id, job_id=job_id, code=RESERVATION_RETURNED,
                 message="no node held it before its placement timeout: placement let it go, and its quota "
                         "goes back")


def try_every_waiting(state: PlacementState, event: EventBase, out: Decisions) -> None:
    """GPUs came free, or new priorities reorder the waiting jobs and the holds of nominated preemptors: a job
    that did not fit, or was held back, may go now."""
    place_waiting(state, out)


def gpu_health(state: PlacementState, event: GpuHealthChanged, out: Decisions) -> None:
    if event.healthy:  # (a GPU gone sick only takes capacity away)
        place_waiting(state, out)


def queue_policy(state: PlacementState, event: QueuePolicyChanged, out: Decisions) -> None:
    if state.recharged:
        # A reservation moved to another flavor may fit where its former one did not.
        state.recharged.clear()
        place_waiting(state, out)


def tick(state: PlacementState, event: ClockTick, out: Decisions) -> None:
    on_tick(state, event.ts, out)


def on_tick(state: PlacementState, now: float, out: Decisions) -> None:
    # 1. Who holds capacity now: the starving job (the nominations lapsed in the fold).
    before = state.starving
    state.starving = find_starving(state, now)
    moved = before != state.starving
    # 2. Tell the starving job, and the one before it, why they wait (a hold that ended may have kept it from
    #    being told).
    if moved or state.lapsed:
        tell_starving(state, before, out)
    # 3. A hold lapsed or moved: what it held back may go now.
    if state.lapsed or moved:
        place_waiting(state, out)


def place_waiting(state: PlacementState, out: Decisions) -> None:
    """One pass over the waiting jobs (as Kueue's schedule()), each tried at most once."""
    # 1. The view: free GPU share on online nodes' healthy GPUs; a job asking for more cannot fit.
    free = state.cluster.usable_free_milli()
    state.shortcuts.begin_pass()
    try:
        # 2. The waiting jobs in order (order.wait_key: priority, reservation, id).
        for key in sorted(state.waiting.values()):
            job_id = key[2]
            # 3. Skip one that cannot fit without a scan, unless it was told no GPU of its models is there, or
            #    that capacity is held for another job: the inventory or the hold may have changed, and the
            #    reason it waits is then another (too few free), which it is told.
            if demand_milli(state.specs[job_id]) > free and state.deferred.get(job_id) not in TOLD_ELSE:
                continue
            # 4. Try it: placed, or told why it waits (attempt.try_place); what it takes is no longer free.
            if try_place(state, job_id, out):
                free -= demand_milli(state.specs[job_id])
    finally:
        state.shortcuts.end_pass()


REACTIONS: dict[type[EventBase], Callable[[PlacementState, Any, Decisions], None]] = {
    QuotaReserved: reserved,
    QuotaRecalled: recalled,
    **dict.fromkeys((JobFinished, JobFailed, JobEvicted, NodeRegistered, NodeUncordoned, PriorityClassesChanged),
                    try_every_waiting),
    GpuHealthChanged: gpu_health,
    QueuePolicyChanged: queue_policy,
    ClockTick: tick,
}
