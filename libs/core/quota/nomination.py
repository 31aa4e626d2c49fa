"""Quota that a preemption frees is its preemptor's, as placement holds the capacity it frees (its nomination).

When the preemption service decides to evict victims for a job waiting for quota (`PreemptionDecided`), that
job is nominated. Until it is reserved, ends, or its nomination lapses (NOMINATION_TTL_S after the decision,
on a clock tick):
  1. it comes first: before the other queues' jobs (quota's order) and before its own queue's jobs,
     nominations in the order they were made;
  2. no other job takes quota that would leave it without room: a job whose reservation would shrink the
     room the nominated job could use (in a flavor it may draw on: its queue's, its cohort's, its parent's)
     and leave it too little to fit waits, told `held_for_preemptor`. So victims that leave one by one free
     its room piece by piece and nobody takes a piece meanwhile. A job of a flavor it cannot use, or one that
     leaves it room enough, goes. A later nomination never holds an earlier one.
The quota decider applies this in its cycles; the guarantee checker asks the same question of the decider's
folded state (`holding_nominee`), so the two cannot disagree about who is held.
"""

from __future__ import annotations

from libs.core.kernel.quota_math import ANY
from libs.core.quota.fit import flavors_of
from libs.core.quota.starvation import reservation_effect
from libs.core.quota.state import QuotaJob, QuotaState


def nominees(state: QuotaState, group: list[str], now: float) -> list[QuotaJob]:
    """The nominated jobs still waiting for quota (not backing off), in nomination order, whose room the group's
    reservations take: of the group's queues, of the subtrees of its parents with quota (what a parent's
    subtree holds is what the parent uses in its cohort: kernel/queue_tree.py), and of the cohorts of the group's
    queues' ancestors with quota (a reservation beyond such an ancestor's nominal borrows from its cohort)."""
    if not state.nominated:
        return []
    queues = set(group)
    book = state.book
    bounds, cohort = book.bounds, book.cohort
    above = {cohort.get(ancestor, "") for q in group for ancestor in bounds.get(q, ())} - {""}
    found = []
    for job_id, at in state.nominated.items():
        job = state.jobs.get(job_id)
        if job is None or job.state != "pending" or (
                job.queue not in queues and queues.isdisjoint(bounds.get(job.queue, ())) and (
                    not above or above.isdisjoint(cohort.get(q, "") for q in (job.queue, *bounds.get(job.queue, ()))))):
            continue
        if max(state.backing_off.get(job_id, now), state.requeued.get(job_id, now)) > now:
            continue  # it may not take quota yet: it holds nothing meanwhile
        found.append((at, job_id, job))
    found.sort(key=lambda t: (t[0], t[1]))
    return [job for _, _, job in found]


def in_queue(state: QuotaState, queue: str) -> list[str]:
    """The queue's nominated waiting jobs, in nomination order: its order yields them first."""
    if not state.nominated:
        return []
    mine = [(at, job_id) for job_id, at in state.nominated.items()
            if (job := state.jobs.get(job_id)) is not None and job.state == "pending" and job.queue == queue]
    return [job_id for _, job_id in sorted(mine)]


def holding_nominee(state: QuotaState, waiting: list[QuotaJob], job: QuotaJob, flavor: str, over_budget: bool,
                    effects: dict[tuple[str, str, str, int, bool], bool] | None = None) -> QuotaJob | None:
    """The nominated job (of `waiting`, in nomination order) that reserving `job` in `flavor` would leave without
    room, or None. `effects` caches the answers while usage does not change."""
    mine = state.nominated.get(job.job_id)
    for nominee in waiting:
        if nominee.job_id == job.job_id or nominee.state != "pending":
            continue
        if mine is not None and (state.nominated.get(nominee.job_id, mine), nominee.job_id) > (mine, job.job_id):
            continue  # nominated after it: a later nomination never holds an earlier one
        key = (nominee.job_id, job.queue, flavor, job.demand, over_budget)
        held = effects.get(key) if effects is not None else None
        if held is None:
            takes_its_room, leaves_it_room = reservation_effect(
                state.book, nominee, flavors_of(state, nominee) or (ANY,), (), job, flavor, over_budget)
            held = takes_its_room and not leaves_it_room
            if effects is not None:
                effects[key] = held
        if held:
            return nominee
    return None
