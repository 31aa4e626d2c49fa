"""One waiting job tried: placed on the live cluster inside a what-if, kept (JobPlaced) only if no hold binds it;
otherwise told why it waits (PlacementDeferred), once per reason.

Capacity is taken at JobPlaced and given back only when an executor reports the job gone (finished, failed or
evicted): between those two facts the GPUs are the job's, whatever else happens."""

from __future__ import annotations

from contracts import JobPlaced, JobSpec, PlacementDeferred, ReplicaPlacement
from libs.core.cluster.job_fit import placement_shape
from libs.core.cluster.shortfall import Shortfall
from libs.core.kernel.decider import Decisions
from libs.core.placement.codes import HELD_FOR_STARVING_JOB, NODE_ORDER_SALT, RESERVED_FOR_PREEMPTOR
from libs.core.placement.nomination import blocking_nominee
from libs.core.placement.starvation import held_for_starving
from libs.core.placement.state import PlacementState

Placements = tuple[ReplicaPlacement, ...]


def try_place(state: PlacementState, job_id: str, out: Decisions) -> bool:
    """Place the job if it fits and no hold binds it; True when placed."""
    spec = state.specs[job_id]
    policy = state.policy_for(spec)
    shape = placement_shape(spec, policy)
    result: Placements | Shortfall | None = state.shortcuts.known_failure(shape, state.generation,
                                                                          lambda: state.pure(spec))
    blocked = held_for = None
    if result is None:
        with state.cluster.what_if() as trial:  # the job placed on the live cluster, kept only if nobody holds it
            pure = state.pure(spec)
            result = place_apart(state, spec, policy) or state.placer.place_gang(spec, policy, salt=NODE_ORDER_SALT)
            if isinstance(result, Shortfall):
                state.shortcuts.remember_failure(shape, result, pure)
            else:
                blocked, held_for = holds_on(state, job_id, spec, result, out.trigger.event.ts)
                if blocked is None and held_for is None:
                    trial.keep()
    if isinstance(result, Shortfall):
        if state.starving is not None and state.starving.job_id == job_id:
            return False  # it was told capacity is held for it (starvation.tell_starving)
        defer(state, job_id, result.code, result.message, result.shortfall_milli, out)
        return False
    if held_for is not None:
        defer(state, job_id, HELD_FOR_STARVING_JOB, f"capacity is held for job {held_for}, which has waited too "
              "long; only jobs ending before it can start may go first", 0, out)
        return False
    if blocked is not None:
        defer(state, job_id, RESERVED_FOR_PREEMPTOR, f"capacity is held for job {blocked}, which preempted jobs to "
              "run", 0, out)
        return False
    # Placed: the trial's allocation stands as JobPlaced's (giving it back for the fold to take it again comes
    # to the same, but for the array views' notice of the change, which `touch` gives).
    state.cluster.touch(result)
    state.allocated_here = job_id
    try:
        out.emit(JobPlaced, correlation_id=job_id, job_id=job_id, placements=result, policy=policy)
    finally:
        state.allocated_here = None
    return True


def holds_on(state: PlacementState, job_id: str, spec: JobSpec, tentative: Placements, now: float
             ) -> tuple[str | None, str | None]:
    """The holds that bind the job placed at `tentative`: (the nominee it would keep out, the starving job it would
    keep waiting), each None when none.
    A reclaim's nominee takes the room its victims freed: no starving job holds that against it (the room is its
    queue's nominal quota, and its eviction would be for nothing), as its hold binds the starving job; so does a
    nominee of least attained service (its victims, of its own queue and priority, left for it, and quota holds
    their quota for it alone). Another nominee is held like any job of its priority."""
    blocked = blocking_nominee(state, job_id, spec, tentative)
    if blocked is not None:
        return blocked, None
    nomination = state.nominated.get(job_id)
    if nomination is not None and (nomination.reclaim or nomination.least_served):
        return None, None
    return None, held_for_starving(state, job_id, spec, tentative, now)


def defer(state: PlacementState, job_id: str, code: str, message: str, shortfall_milli: int, out: Decisions
          ) -> None:
    """Tell the job why it waits, unless that is what it was told last."""
    if state.deferred.get(job_id) != code:
        out.emit(PlacementDeferred, correlation_id=job_id, job_id=job_id, code=code, message=message,
                 shortfall_milli=shortfall_milli)


def place_apart(state: PlacementState, spec: JobSpec, policy: str) -> Placements | None:
    """A service replica that spreads: a placement away from its service's other replicas, if one fits."""
    if not (spec.service and spec.spread):
        return None
    others = state.service_nodes.get(spec.service)
    if not others:
        return None
    avoid = sorted({node for nodes in others.values() for node in nodes})
    return state.placer.place_apart(spec, avoid, policy, salt=NODE_ORDER_SALT)
