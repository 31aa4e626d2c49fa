"""What a cycle over a queue without a cohort keeps of its failed tries between cycles.

Most cycles over such a queue follow an admission, and most of those decide nothing: they try the heads the
cycle before tried, each failing again and told already, and their scan stops where the one before stopped
(next_head stops at a job held in every flavor and told it waits for quota: everything after it is of its
priority or lower). A cycle that decided nothing keeps the job its scan stopped at and what its tries read
beyond the queue; a later cycle over the queue would try the same jobs in the same state and decide nothing
too, so it is left out while nothing those tries read changed:
  1. the queue's own state as the scan read it: its waiting jobs, their order and what they were told, its
     usage and its users', its nominations. Every change of the queue's own bumps its version
     (waiting.queue_changed); `follow` keeps the failures standing through a change to a job the scan never
     read: one of a priority below where it stopped (joining, leaving or told something), or one after the
     last job it read of a priority it stopped in or skipped the rest of (in the order of that priority's one
     user), joining or told something. Of a priority it skipped the rest of, it read the smallest demand and
     the models (next_head skips a level by them): a job joining there keeps them only as large as its
     smallest and of its one set of models; of the priority it stopped in, a job joining only lowers the
     smallest or adds models, which lets next_head skip it no more than before. A job leaving either is read.
  2. the policy, the jobs' flavors and the nodes present (their versions);
  3. the cycle's view (take_view, reclaim.lent_out): the starving job, when it began to wait, and the
     reservations that end by its shadow; the flavors no borrower grows in; no nominee waits in the queue.
     The shadow itself is read only by a job with a runtime limit (does it backfill?), with the clock: when a
     try had one, a shadow of now is compared as such (now plus a runtime limit is past now whatever the
     clock reads) and a later one with the clock.
Not kept for a queue whose tries read more than that: one in a tree (its parent's quota bounds it, or it
bounds its children), one with a budget (spent or not is a matter of time), one with a job backing off
(likewise)."""

from __future__ import annotations

from libs.core.kernel.starvation import UNKNOWN_START
from libs.core.quota.state import Cycle, KeptFailures, LevelRead, QuotaJob, QuotaState


def keepable(state: QuotaState, queue: str, cycle: Cycle) -> bool:
    """Do the tries of the queue's jobs read nothing but what the kept failures are compared on?"""
    spec = state.policy.queues.get(queue)
    book = state.book
    return (not cycle.cohort and spec is not None and not spec.parent and spec.budget_gpu_hours is None
            and queue not in cycle.backing_off and not cycle.nominees and not book.children.get(queue)
            and not book.bounds.get(queue))


def view_of(state: QuotaState, cycle: Cycle, timed: bool) -> tuple[object, ...]:
    """What the cycle's tries read beyond the queue's own state (2 and 3 above); `timed`: a job tried has a
    runtime limit."""
    rule = cycle.rule
    starving: tuple[object, ...] | None = None
    if rule is not None and cycle.starving is not None:
        shadow: object = None  # (read by no try)
        if timed:
            shadow = ("now" if rule.shadow == cycle.now else rule.shadow if rule.shadow == UNKNOWN_START
                      else (rule.shadow, cycle.now))
        starving = (rule.job_id, rule.priority, cycle.starving.since, shadow,
                    tuple(job.job_id for job in cycle.ending))
    return (state.policy_version, state.flavors_epoch, state.fleet.inventory.version, starving,
            tuple(sorted(cycle.no_borrowing)))


def failures_stand(state: QuotaState, queue: str, cycle: Cycle) -> bool:
    """Would trying the queue's jobs decide nothing, as the cycle that kept its failures decided nothing?"""
    kept = state.kept_failures.get(queue)
    return (kept is not None and kept.version == state.queue_version.get(queue, 0) and keepable(state, queue, cycle)
            and kept.view == view_of(state, cycle, kept.timed))


def keep_failures(state: QuotaState, queue: str, cycle: Cycle, decided: bool, timed: bool) -> None:
    """The queue's jobs were tried (`timed`: one with a runtime limit): keep the failures when that decided
    nothing and the scan stopped short."""
    stopped = cycle.stopped_at
    if decided or stopped is None or not keepable(state, queue, cycle):
        state.kept_failures.pop(queue, None)
        return
    levels = {stopped.priority: level_read(state, queue, stopped, skipped=False)}
    for priority, job in cycle.skipped.items():
        levels[priority] = level_read(state, queue, job, skipped=True)
    state.kept_failures[queue] = KeptFailures(view=view_of(state, cycle, timed), stopped_at=stopped.priority,
                                              levels=levels, timed=timed, version=state.queue_version.get(queue, 0))


def level_read(state: QuotaState, queue: str, last: QuotaJob, skipped: bool) -> LevelRead:
    """What the scan read of the priority of `last`, the last job of it it read (skipped: the rest of it)."""
    users = state.pending[queue][last.priority]
    joins = None
    if skipped:
        level = (queue, last.priority)
        joins = (min(state.demands[level]), next(iter(state.models[level])))
    return ((last.arrival, last.job_id), last.user if len(users) == 1 else None, joins)


def follow(state: QuotaState, queue: str, version: int, job: QuotaJob, how: str) -> None:
    """The queue's version became `version` as the job joined, left or was told something (`how`): a change the
    kept failures' scan did not read keeps them standing (1 above); any other leaves them stale."""
    kept = state.kept_failures.get(queue)
    if kept is None or kept.version != version - 1 or job.job_id in state.nominated:
        return
    if job.priority < kept.stopped_at:
        kept.version = version
        return
    read = kept.levels.get(job.priority)
    if read is None or how == "leaves" or job.user != read[1] or (job.arrival, job.job_id) <= read[0]:
        return
    joins = read[2]
    if how == "joins" and joins is not None and (job.demand < joins[0] or job.spec.gpu_models != joins[1]):
        return
    kept.version = version
