"""Which waiting jobs a clock tick looks at again: circumstances change without a new deferral (a reclaim grace
ends, a protection runs out, anything is folded), and only the jobs such a change could serve are tried."""

from __future__ import annotations

from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.quota_math import QuotaBook
from libs.core.preemption.state import PLACEMENT, PreemptionState


def grace_ends(state: PreemptionState, policy: PolicyBook, now: float) -> list[str]:
    """The waiting jobs whose reclaim grace has run out since they were last considered (so reclaim may
    start for them), in id order. Each job counts once: it is considered on this tick, and marked."""
    due = []
    for name, keys in state.grace.items():  # per queue, the unchecked jobs by how long they have waited
        queue = policy.queues.get(name)
        if queue is None or queue.reclaim_after_s <= 0:
            continue
        for since, job_id in keys:
            if since + queue.reclaim_after_s > now:
                break
            due.append(job_id)
    due.sort()
    for job_id in due:
        state.waiting[job_id].grace_checked = True
        state.ungrace(job_id)
    return due


def heads_of_queues(state: PreemptionState, book: QuotaBook) -> list[str]:
    """The first waiting job per queue (the index keeps each queue's waiting jobs in (-priority, id)
    order), not already waiting for its victims to leave; where that one can never reclaim (it waits for
    placement, or is above its queue's nominal quota in every flavor), also the first of its priority
    that can: it may reclaim while the first waits."""
    heads = []
    for queue in sorted(state.heads):
        first_priority = None
        for negative_priority, job_id in state.heads[queue]:
            if job_id in state.in_flight:
                continue
            if first_priority is None:
                first_priority = negative_priority
                heads.append(job_id)
                if not book.cohort.get(queue, "") or may_reclaim(state, book, job_id):
                    break
            elif negative_priority != first_priority:
                break
            elif may_reclaim(state, book, job_id):
                heads.append(job_id)
                break
    return heads


def placement_waiters(state: PreemptionState) -> list[str]:
    """The jobs holding quota that wait for a place (few: placement places most at once), in id order: any
    of them may reclaim GPUs from borrowers, wherever it stands in its queue (reclaim.placement_victims)."""
    return sorted(job_id for job_id in state.placing if job_id not in state.in_flight)


def may_reclaim(state: PreemptionState, book: QuotaBook, job_id: str) -> bool:
    """Does the waiting job wait for quota and fit its queue's nominal quota of some flavor it may use?"""
    spec, waiting = state.specs.get(job_id), state.waiting.get(job_id)
    if spec is None or waiting is None or waiting.code == PLACEMENT:
        return False
    demand, limits = demand_milli(spec), book.limits.get(spec.queue, {})
    return any(demand <= limits[flavor].nominal for flavor in book.flavors_for(spec.queue, spec))


def could_evict_in(state: PreemptionState, book: QuotaBook, queues: list[str]) -> list[str]:
    """Every waiting job that could evict jobs of `queues`: theirs (within the queue) and their cohorts'
    (reclaim), by queue, then in each queue's (-priority, id) order."""
    targets: dict[str, None] = {}
    for queue in queues:
        targets[queue] = None
        targets.update(dict.fromkeys(book.members.get(book.cohort.get(queue, ""), ())))
    return [job_id for queue in sorted(targets) for _, job_id in state.heads.get(queue, ())
            if job_id not in state.in_flight]
