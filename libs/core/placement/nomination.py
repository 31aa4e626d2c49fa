"""Nominated preemptors: room held for a preemptor once its victims are chosen.

Until the preemptor is placed (or the nomination lapses on the log's clock), a job of lower priority (for a
reclaim: also any job of another queue; for least attained service: a job of its own queue and priority) is
placed only where it leaves the preemptor room to fit once its victims are gone, so that the capacity freed for
it is not taken by the jobs it displaced."""

from __future__ import annotations

from contracts import RECLAIM, JobSpec, PreemptionDecided, ReplicaPlacement
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.kernel.attained_service import least_served
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.placement.state import Nomination, PlacementState


def nominate(state: PlacementState, event: PreemptionDecided) -> None:
    # A reclaim's preemptor holds its room against every other queue's job too: the GPUs it takes back are its
    # queue's nominal quota, not the borrowers' to take again.
    state.nominated[event.preemptor_id] = Nomination(
        priority=state.policy.priority_of(state.specs[event.preemptor_id]),
        victims=tuple(v.job_id for v in event.victims), at=event.ts,
        reclaim=any(v.reason == RECLAIM for v in event.victims), least_served=least_served(event))


def end_nomination(state: PlacementState, job_id: str) -> None:
    """The job's nomination is over (it is placed, gone, or its quota went back): the jobs it held back wait
    for other reasons now, and are told so at the next tick."""
    if state.nominated.pop(job_id, None) is not None:
        state.held_back_free = True


def left_for_good(state: PlacementState, job_id: str) -> None:
    """A victim placed again (elsewhere, or where it left once its preemptor ran) is no longer leaving for its
    preemptor: its new run neither counts as the preemptor's room nor keeps the nomination from lapsing."""
    for nomination in state.nominated.values():
        if job_id in nomination.victims:
            nomination.victims = tuple(v for v in nomination.victims if v != job_id)


def lapse(state: PlacementState, now: float) -> None:
    """On a tick: nominations older than the TTL end (never while a victim still leaves: a checkpoint may take
    longer, and the room is the nominee's); `lapsed` says whether a hold ended since the last tick."""
    lapsed = [job_id for job_id, n in state.nominated.items()
              if now - n.at > NOMINATION_TTL_S and not any(v in state.placed for v in n.victims)]
    for job_id in lapsed:
        del state.nominated[job_id]
    state.lapsed = bool(lapsed) or state.held_back_free
    state.held_back_free = False


def holds_back(nomination: Nomination, nominee_queue: str, priority: int, queue: str) -> bool:
    """Is a job of `priority` in `queue` one the nomination holds back? One of lower priority; for a reclaim,
    any job of another queue; for least attained service, a job of its own queue and priority (its victims
    would take their GPUs back)."""
    same_queue = nominee_queue == queue
    return (nomination.priority > priority or (nomination.reclaim and not same_queue)
            or (nomination.least_served and same_queue and nomination.priority == priority))


def blocking_nominee(state: PlacementState, job_id: str, spec: JobSpec, tentative: tuple[ReplicaPlacement, ...]
                     ) -> str | None:
    """With `job_id` tentatively allocated (at `tentative`): the first nominee it holds back (`holds_back`) that
    would fit once its victims are gone, but no longer beside the job; None when none. Nominees are asked in id
    order; among nominees the earlier nomination goes first: a later one never holds it back."""
    if not state.nominated:
        return None
    priority = state.policy.priority_of(spec)
    mine = state.nominated.get(job_id)
    for nominee in sorted(state.nominated):
        nomination = state.nominated[nominee]
        if nominee == job_id or nominee not in state.specs:
            continue
        if mine is not None and (nomination.at, nominee) > (mine.at, job_id):
            continue
        nominee_spec = state.specs[nominee]
        if not holds_back(nomination, nominee_spec.queue, priority, spec.queue):
            continue
        with state.cluster.what_if() as victims_gone:
            for victim in nomination.victims:
                if victim in state.placed:
                    victims_gone.release(state.placed[victim])
            held_back = (not state.placer.fits(nominee_spec)
                         and fits_without(state.cluster, state.placer, tentative, nominee_spec))
        if held_back:
            return nominee
    return None


def fits_without(cluster: Cluster, placer: Placer, tentative: tuple[ReplicaPlacement, ...], spec: JobSpec) -> bool:
    """Would `spec` fit with the tentative allocation given back, so that it is what keeps it out (a job that
    does not fit anyway is kept out by nothing)?"""
    with cluster.what_if() as without:
        without.release(tentative)
        return placer.fits(spec)
