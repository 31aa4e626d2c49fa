"""Which waiting jobs a clock tick looks at again: circumstances change without a new deferral (a reclaim grace
ends, a protection runs out, anything is folded), and only the jobs such a change could serve are tried."""

from __future__ import annotations

from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.preemption.holds import flavors_of, holds_others
from libs.core.preemption.state import PLACEMENT, PreemptionState, World


def grace_ends(state: PreemptionState, policy: PolicyBook, now: float) -> list[str]:
    """The waiting jobs whose reclaim grace has run out since they were last considered (so reclaim may
    start for them), in id order. Each job counts once: it is considered on this tick, and marked. (The grace is
    the queue's, counted from when it began its unbroken wait, PreemptionState.grace_over: the first of its jobs
    to be due ends it, and the tick tries the queue's heads with it.)"""
    due = []
    for name, keys in state.grace.items():  # per queue, the unchecked jobs by how long they have waited
        queue = policy.queues.get(name)
        if queue is None or queue.reclaim_after_s <= 0:
            continue
        # (From when the queue began its unbroken wait, which is no later than any of its jobs' waits.)
        began = state.queue_waits_since.get(name, keys[0][0])
        for since, job_id in keys:
            if min(since, began) + queue.reclaim_after_s > now:
                break
            due.append(job_id)
    due.sort()
    for job_id in due:
        state.waiting[job_id].grace_checked = True
        state.ungrace(job_id)
    return due


def heads_of_queues(world: World) -> list[str]:
    """Per queue (in name order), the waiting jobs a change may let preemption serve (first_of_each_priority)."""
    return [job_id for queue in sorted(world.state.heads) for job_id in first_of_each_priority(world, queue)]


def first_of_each_priority(world: World, queue: str) -> list[str]:
    """The queue's waiting jobs worth trying, in its (-priority, id) order, skipping those already waiting for
    their victims to leave. Of each priority, for each flavor free to it (holds.py: quota holds a job back in
    the flavors a job of higher priority waits for), the first job that may use it; where that one can never
    reclaim (it waits for placement, or is above its queue's nominal quota in every flavor), also the first
    that can. So a lower job that quota would give freed quota of its own flavors to is tried too, not only
    each queue's first: lower priorities are looked at while some flavor of the queue is free."""
    state, book = world.state, world.policy.quotas
    cohort = bool(book.cohort.get(queue, ""))
    everything = set(book.limits.get(queue, ())) or {ANY}
    held: set[str] = set()  # the flavors jobs of the priorities above wait for
    level = _Level(None)
    found = []
    for negative_priority, job_id in state.heads[queue]:
        if negative_priority != level.negative_priority:
            held |= level.holding
            if held >= everything:
                break  # every flavor is held for a job above: quota would give none to a lower job
            level = _Level(negative_priority)
        flavors = flavors_of(world, job_id)
        if holds_others(world, job_id):
            level.holding.update(flavors)  # (ANY, all there is, in a queue without quota)
        free = set(flavors) - held
        if free and job_id not in state.in_flight and level.worth_trying(free, state, book, job_id, cohort):
            found.append(job_id)
        if level.spent(held, everything):
            break  # (the common case, one flavor: the first job that may reclaim ends the walk)
    return found


class _Level:
    """One priority of a queue as the tick walks it: the flavors its jobs hold lower ones back from, and the
    flavors a job tried so far could take (`tried`), and reclaim in (`reclaiming`)."""

    def __init__(self, negative_priority: int | None) -> None:
        self.negative_priority = negative_priority
        self.holding: set[str] = set()
        self.tried: set[str] = set()
        self.reclaiming: set[str] = set()

    def worth_trying(self, free: set[str], state: PreemptionState, book: QuotaBook, job_id: str, cohort: bool
                     ) -> bool:
        """Is the job, whose free flavors are `free`, the first of its priority for one of them, or the first
        that may reclaim in one? Then it is tried, and noted."""
        if free <= self.reclaiming:
            return False
        reclaims = not cohort or may_reclaim(state, book, job_id)  # (without a cohort nothing is to reclaim)
        if free <= self.tried and not reclaims:
            return False
        self.tried |= free
        if reclaims:
            self.reclaiming |= free
        return True

    def spent(self, held: set[str], everything: set[str]) -> bool:
        """Is there nothing left to try, at this priority or below? Every flavor is held for a job of this
        priority or above, and each flavor free to this one was tried by a job that may reclaim in it."""
        return bool(self.reclaiming) and self.reclaiming >= everything - held and held | self.holding >= everything


def placement_waiters(state: PreemptionState) -> list[str]:
    """The jobs holding quota that wait for a place (few: placement places most at once), in id order: any
    of them may reclaim GPUs from borrowers, wherever it stands in its queue (reclaim.placement_victims)."""
    return sorted(job_id for job_id in state.placing if job_id not in state.in_flight)


def may_reclaim(state: PreemptionState, book: QuotaBook, job_id: str) -> bool:
    """Does the waiting job wait for quota and fit what is left of its queue's nominal quota of some flavor it
    may use? (One that would fit only with jobs of its queue gone is tried all the same when it is the first of
    its priority, but a smaller job behind it, which a reclaim could serve, is tried too.)"""
    spec, waiting = state.specs.get(job_id), state.waiting.get(job_id)
    if spec is None or waiting is None or waiting.code == PLACEMENT:
        return False
    demand = demand_milli(spec)
    return any(demand <= book.nominal_left(spec.queue, flavor) for flavor in book.flavors_for(spec.queue, spec))


def could_evict_in(state: PreemptionState, book: QuotaBook, queues: list[str]) -> list[str]:
    """Every waiting job that could evict jobs of `queues`: theirs (within the queue) and their cohorts'
    (reclaim), by queue, then in each queue's (-priority, id) order."""
    targets: dict[str, None] = {}
    for queue in queues:
        targets[queue] = None
        targets.update(dict.fromkeys(book.members.get(book.cohort.get(queue, ""), ())))
    return [job_id for queue in sorted(targets) for _, job_id in state.heads.get(queue, ())
            if job_id not in state.in_flight]
