"""What each trigger makes the quota decider decide, after the trigger is folded: which groups of queues it runs
a scheduling cycle over (libs/core/quota/cycle.py), and the decisions of its own (a reservation that goes back
as its job ends, quota taken again by a job placed just as it went back, jobs told that no node could hold
them). One reaction per kind of trigger; the decider (libs/core/quota/decider.py) picks it by the event's type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaReleased,
    SchedulingSettingsChanged,
)
from libs.core.kernel.decider import Decisions
from libs.core.kernel.wait_reasons import HELD_FOR_PREEMPTOR, WAITING_OR_HELD
from libs.core.quota.cycle import schedule
from libs.core.quota.fit import borrows_over_budget, flavors_moved_queues, group_of, groups, judged_anew, linked_groups
from libs.core.quota.reasons import tell_new, tell_no_node
from libs.core.quota.reserve import never_fits
from libs.core.quota.state import QuotaState
from libs.core.quota.timeout import give_back_returned, recall_unplaced

# Capacity that may let a job placement could not place go: the wait after a placement timeout ends on these.
CAPACITY_GREW = (NodeRegistered, NodeUncordoned, GpuHealthChanged)


class AfterFold(NamedTuple):
    """What folding the trigger left for its reaction, read before any decision is folded (which clears it)."""

    left_waiting: str | None  # the queue of a waiting job the trigger ended
    lapsed: list[str]  # the queues of nominations the trigger let lapse
    backoffs_ended: list[str]  # the queues of jobs whose placement backoff new capacity ended
    returned: str | None  # the recalled job placement let go
    budget_turned: list[str]  # the queues whose budget ran out, or came back, by the tick


def after_fold(state: QuotaState) -> AfterFold:
    return AfterFold(state.left_waiting, state.lapsed, state.backoffs_ended, state.returned,
                     state.budget_turned)


def decides_nothing(state: QuotaState, event: EventBase) -> bool:
    """Triggers that certainly decide nothing, answered before any work: a tick while no job waits for time
    to cycle, and placement's word on a job (a placement, a deferral) other than its letting go of a recalled
    one."""
    if isinstance(event, ClockTick):
        return (not state.budget_deferred and not state.backing_off and not state.requeued and not state.unplaced
                and not state.lapsed and not state.budget_turned)
    return isinstance(event, (PlacementDeferred, JobPlaced)) and state.returned is None


def schedule_groups_of(state: QuotaState, queues: set[str], now: float, out: Decisions) -> None:
    """A cycle over each group (in their fixed order) that holds one of the queues."""
    for group in groups(state) if queues else ():
        if not queues.isdisjoint(group):
            schedule(state, group, now, out)


def react_answer(state: QuotaState, event: PlacementDeferred | JobPlaced, after: AfterFold, out: Decisions) -> None:
    """Placement's word on a reserved job answers a recall (timeout.recall_unplaced): placed, the job keeps its
    quota (placement placed it before it read the ask, and nobody took that quota meanwhile); let go (a
    deferral `reservation_returned`), its reservation goes back, and a cycle runs over each group whose room
    that changes, deepest first, as for any release (schedule_freed). A placement frees no quota: it decides
    nothing."""
    if after.returned is not None:
        job = state.jobs[after.returned]
        give_back_returned(state, job, event.ts, out)
        schedule_freed(state, job.queue, event.ts, out)


def react_admitted(state: QuotaState, event: JobAdmitted, after: AfterFold, out: Decisions) -> None:
    job = state.jobs.get(event.job_id)
    if job is not None and job.state == "pending":
        schedule(state, group_of(state, job.queue), event.ts, out)
        if job.state == "pending" and job.job_id not in state.deferred:
            tell_new(state, job, event.ts, out)


def react_ended(state: QuotaState, event: JobFinished | JobFailed | JobCancelled | JobEvicted, after: AfterFold,
                out: Decisions) -> None:
    """A job's run ended or it left: its reservation goes back; a waiting job that left lets the jobs it held
    back go."""
    release(state, event, out)
    if after.left_waiting is not None:
        schedule(state, group_of(state, after.left_waiting), event.ts, out)


def release(state: QuotaState, event: JobFinished | JobFailed | JobCancelled | JobEvicted, out: Decisions) -> None:
    job = state.jobs.get(event.job_id)
    if job is None or job.state != "reserved":
        return
    reason = "retry" if event.job_id in state.retry_in else type(event).__name__.removeprefix("Job").lower()
    out.emit(QuotaReleased, correlation_id=event.job_id, job_id=event.job_id, queue=job.queue,
             gpu_milli=job.demand, reason=reason)
    schedule_freed(state, job.queue, event.ts, out)
    if job.state == "pending" and job.job_id not in state.deferred:
        tell_new(state, job, event.ts, out)  # evicted back into its queue, and not reached by the cycle


def schedule_freed(state: QuotaState, queue: str, now: float, out: Decisions) -> None:
    """Quota of the queue went back (a job ended, or a reservation not placed in time): a cycle over each group
    whose room that changes, deepest first (linked_groups: a subtree's quota is its own before the cohort above
    may borrow it, so a child waiting for what its parent lent is served before that cohort's borrowers)."""
    linked = linked_groups(state, queue)
    for group in linked:  # its group's room, and in a tree the rooms above and below
        schedule(state, group, now, out)
    for group in linked[:-1]:
        # A job held for a preemptor of a cohort above its group (nomination.nominees) was tried before that
        # preemptor's group took the quota freed for it: it is tried again, to learn why it waits now.
        members = set(group)
        if any(code == HELD_FOR_PREEMPTOR and (held := state.jobs.get(j)) is not None and held.queue in members
               for j, code in state.deferred.items()):
            schedule(state, group, now, out)


def react_capacity_grew(state: QuotaState, event: NodeRegistered | NodeUncordoned | GpuHealthChanged,
                        after: AfterFold, out: Decisions) -> None:
    """The queues of jobs whose placement backoff ended, and of waiting jobs whose answer the new capacity may
    change (fit.judged_anew: a model no node served is served now, say): they may be reserved now, or starve
    again (the cycle tells them anew)."""
    changed = {*after.backoffs_ended, *judged_anew(state)}
    if isinstance(event, NodeRegistered) or (isinstance(event, GpuHealthChanged) and not event.healthy):
        # Capacity may have shrunk too: a GPU turned sick, or a node registered again smaller (fewer GPUs,
        # MIG on), so a waiting job no node could hold any more holds nobody now.
        changed.update(tell_no_node(state, event.ts, out))
    schedule_groups_of(state, changed, event.ts, out)


def react_capacity_shrank(state: QuotaState, event: NodeLost | NodeCordoned, after: AfterFold,
                          out: Decisions) -> None:
    """Nodes went: the jobs no node present could hold any more are told so, and the queues of waiting jobs
    whose usable flavors moved (fit.flavors_moved_queues) are looked at again."""
    told = tell_no_node(state, event.ts, out)
    schedule_groups_of(state, flavors_moved_queues(state, told), event.ts, out)


def react_policy(state: QuotaState, event: QueuePolicyChanged | PriorityClassesChanged | SchedulingSettingsChanged,
                 after: AfterFold, out: Decisions) -> None:
    for group in groups(state):
        schedule(state, group, event.ts, out)
    tell_inadmissible(state, event.ts, out)


def tell_inadmissible(state: QuotaState, now: float, out: Decisions) -> None:
    """A policy change may leave a waiting job its queue could never hold: it is told so (reserve.never_fits)
    even where no cycle tried it (one held behind a job of higher priority is not tried), so that it hears
    what a job submitted after the change hears. Only a job told it waits for quota: a hold of its own (its
    user's limit, a budget, a backoff) binds before its queue's ceiling, as a cycle tries them."""
    for job_id, code in list(state.deferred.items()):
        job = state.jobs.get(job_id)
        if code in WAITING_OR_HELD and job is not None and job.state == "pending":
            never_fits(state, job, out, borrows_over_budget(state, job.queue, now))


def react_tick(state: QuotaState, event: ClockTick, after: AfterFold, out: Decisions) -> None:
    """Time alone can change a verdict: a new budget period opens, a budget runs out (its queue is owed no
    nominal quota any more: what it lent is free for its cohort), a backoff ends, a reservation that placement
    could not place in time is asked back (recall_unplaced: it goes back on placement's answer), a preemptor's
    nomination lapses."""
    now = event.ts
    waiting = {state.jobs[j].queue for j in state.budget_deferred}
    waiting.update(after.lapsed)
    waiting.update(after.budget_turned)
    recall_unplaced(state, now, out)
    for backoffs in (state.backing_off, state.requeued):
        waiting.update(state.jobs[j].queue for j, t in backoffs.items() if t <= now and j in state.jobs)
    schedule_groups_of(state, waiting, now, out)


REACTIONS: dict[type[EventBase], Callable[[QuotaState, Any, AfterFold, Decisions], None]] = {
    JobPlaced: react_answer,
    PlacementDeferred: react_answer,
    JobAdmitted: react_admitted,
    JobFinished: react_ended,
    JobFailed: react_ended,
    JobCancelled: react_ended,
    JobEvicted: react_ended,
    NodeRegistered: react_capacity_grew,
    NodeUncordoned: react_capacity_grew,
    GpuHealthChanged: react_capacity_grew,
    NodeLost: react_capacity_shrank,
    NodeCordoned: react_capacity_shrank,
    QueuePolicyChanged: react_policy,
    PriorityClassesChanged: react_policy,
    SchedulingSettingsChanged: react_policy,
    ClockTick: react_tick,
}
