"""What a cycle keeps of each queue between cycles: the job its order starts from and that job's order key.

A queue's head at the start of a cycle, and its key, depend on the queue's own state (its waiting jobs, its usage,
its users' usage, its nominations), the policy and flavors, and the fair order's epoch (order.fair_epoch):
kept with those, a cycle over a cohort reads them back for every queue nothing changed instead of reading its order and
computing its fair share again. Not kept for a queue whose key reads more than its own state: one in a tree (its
parent's share is part of its key), one with a budget (spent or not is a matter of time) or one with a job
backing off (whether it may go is a matter of time)."""

from __future__ import annotations

from libs.core.quota.order import fair_epoch
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def backing_off_queues(state: QuotaState) -> set[str]:
    """The queues with a job backing off (a retry, or a reservation placement could not place in time)."""
    if not state.backing_off and not state.requeued:
        return set()
    return {job.queue for waits in (state.backing_off, state.requeued) for j in waits
            if (job := state.jobs.get(j)) is not None}


def may_keep_head(state: QuotaState, queue: str, backing_off: set[str]) -> bool:
    spec = state.policy.queues.get(queue)
    return (spec is not None and not spec.parent and spec.budget_gpu_hours is None and queue not in backing_off
            and not state.book.children.get(queue))


def head_stamp(state: QuotaState, queue: str, cycle: Cycle) -> tuple[object, ...]:
    return (fair_epoch(state, cycle.now), state.policy_version, state.flavors_epoch, state.queue_version.get(queue, 0))


def kept_head(state: QuotaState, queue: str, cycle: Cycle) -> tuple[QuotaJob, tuple[object, ...]] | None:
    known = state.kept_heads.get(queue)
    if known is None or known[0] != head_stamp(state, queue, cycle):
        return None
    return state.jobs[known[1]], known[2]


def keep_head(state: QuotaState, queue: str, cycle: Cycle, head: QuotaJob, key: tuple[object, ...]) -> None:
    state.kept_heads[queue] = (head_stamp(state, queue, cycle), head.job_id, key)
