"""Placement's cycle: what one trigger decides, in numbered steps.

A reservation tries its own job; capacity coming back (a run over, a node registered or uncordoned, a GPU
healthy again) tries every waiting job; a tick first settles who holds capacity (nominations lapse, the
starving job is found and told), then tries every waiting job if a hold ended or moved."""

from __future__ import annotations

from contracts import (
    ClockTick,
    GpuHealthChanged,
    JobEvicted,
    JobFailed,
    JobFinished,
    NodeRegistered,
    NodeUncordoned,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaReserved,
)
from libs.core.kernel.decider import Decisions
from libs.core.kernel.policy import demand_milli
from libs.core.placement.attempt import try_place
from libs.core.placement.codes import TOLD_ELSE
from libs.core.placement.starvation import find_starving, tell_starving
from libs.core.placement.state import PlacementState

CAPACITY_BACK = (JobFinished, JobFailed, JobEvicted, NodeRegistered, NodeUncordoned)
# New priorities reorder the waiting jobs and the holds of nominated preemptors: a job held back may go now.
ORDER_CHANGED = (PriorityClassesChanged,)


def decide(state: PlacementState, out: Decisions) -> None:
    """What the trigger (already folded) decides."""
    event = out.trigger.event
    if isinstance(event, QuotaReserved):
        if event.job_id in state.waiting:
            try_place(state, event.job_id, out)
    elif (isinstance(event, CAPACITY_BACK + ORDER_CHANGED)
          or (isinstance(event, GpuHealthChanged) and event.healthy)):
        place_waiting(state, out)
    elif isinstance(event, QueuePolicyChanged) and state.recharged:
        # A reservation moved to another flavor may fit where its former one did not.
        state.recharged.clear()
        place_waiting(state, out)
    elif isinstance(event, ClockTick):
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
