"""The usage a reservation charges: its queue's (with the decayed usage fair share reads), its user's and its
flavor's in the quota book; and where a queue's reservations are charged when its flavors change."""

from __future__ import annotations

from libs.core.kernel.flavors import reservation_model
from libs.core.kernel.quota_figures import charge_queue
from libs.core.quota.state import QuotaJob, QuotaState
from libs.core.quota.waiting import queue_changed


def charge(state: QuotaState, job: QuotaJob, sign: int, now: float) -> None:
    """Usage of the job's queue, user and flavor changes by its demand."""
    queue_changed(state, job.queue)
    usage_changed(state, job.queue)
    charge_queue(state, job.queue, job.flavor, sign * job.demand, job.over_budget, now)
    key = (job.queue, job.user)
    state.user_used[key] = state.user_used.get(key, 0) + sign * job.demand


def recharge(state: QuotaState, queue: str) -> None:
    """The queue's reservations follow its current flavors (QuotaBook.recharge): usage reserved under a
    flavor the queue no longer has moves to the one that covers its job's model now, so that what the
    queue borrows stays where a lender can reclaim it."""
    usage_changed(state, queue)
    for job_id in state.reserved.get(queue, {}):
        job = state.jobs[job_id]
        model = reservation_model(job.flavor, job.model, job.spec)
        job.flavor = state.book.recharge(queue, job.flavor, model, job.demand, job.over_budget)


def usage_changed(state: QuotaState, queue: str) -> None:
    """The queue's usage in the book changed: what was kept of the rooms it reads goes stale
    (shortcuts/kept_shadow.py)."""
    state.usage_version += 1
    state.usage_of[queue] = state.usage_of.get(queue, 0) + 1
