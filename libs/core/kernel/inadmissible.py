"""What a job waits for that only a change of policy can give: its queue, as its quota is now, could never hold
it (more than its ceiling in every flavor it may use, or no flavor of its models at all), or it asks more than
its queue lets one user hold. Such a job is admitted and waits, holding nothing: a queue may join its cohort, a
lending limit or a nominal quota be raised, a flavor be added, a user limit be raised, and then it runs (as
Kueue keeps such a workload pending, inadmissible). Admission refuses only what no policy could ever serve.

Stated once here: the quota decider tells a waiting job these reasons (libs/core/quota/reasons.py), the HTTP
API answers a submission with the same reason at once (`waits_by_policy`, services/admission/api.py), and the
guarantee checker judges the claim by the quota decider's own answer."""

from __future__ import annotations

from collections.abc import Sequence

from contracts import JobSpec
from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.quota_math import QuotaBook
from libs.core.kernel.wait_reasons import EXCEEDS_QUEUE_QUOTA, NO_QUOTA_FOR_MODELS, USER_LIMIT

Reason = tuple[str, str, int]  # (code, message, shortfall in thousandths of a GPU)


def may_borrow(preemptible: bool, over_budget: bool) -> bool:
    """May a job use quota its queue borrows, and so is it judged by its queue's ceiling borrowing included? One
    that can be preempted may. One that cannot never borrows while its queue is within its GPU-hour budget (the
    lender would never get that quota back while it runs, as KAI Scheduler keeps such jobs within their queue's
    quota); but over its budget (`over_budget` here: spent, going on with `over_budget: borrow`) quota reserves
    every job of the queue as borrowed outright, preemptible whatever its class (kernel/quota_figures.py
    `over_budget_room`), so there it borrows, and its queue's ceiling is the one with borrowing. One rule for the
    room quota gives a job and the ceiling it tells it: quota (libs/core/quota/fit.py), the answer at submission
    (within budget: the budget is not known there) and the checker ask it."""
    return preemptible or over_budget


def queue_could_hold(book: QuotaBook, queue: str, demand: int, flavors: Sequence[str], borrows: bool) -> bool:
    """Could the queue, as its quota is now, ever hold `demand` in one of `flavors` (by the borrowing rule the
    job is under: a job that cannot be preempted never borrows)? A queue without quota holds anything."""
    return not book.governed(queue) or any(book.ceiling(queue, f, borrows) >= demand for f in flavors)


def ceiling_reason(book: QuotaBook, queue: str, demand: int, flavors: Sequence[str], borrows: bool,
                   models: Sequence[str]) -> Reason:
    """Why the queue could never hold the job as its quota is now (queue_could_hold said it could not)."""
    named = ", ".join(models) or "any model"
    if not flavors:
        return (NO_QUOTA_FOR_MODELS, f"the job needs {demand / 1000:g} GPUs of {named}; queue {queue} has no quota "
                "for them: it waits, holding nothing, until the queue is given quota of one of them", demand)
    most = max(book.ceiling(queue, f, borrows) for f in flavors)
    what = "borrowing included" if borrows else "within its nominal quota (the job cannot be preempted)"
    return (EXCEEDS_QUEUE_QUOTA, f"the job needs {demand / 1000:g} GPUs; queue {queue} can hold at most "
            f"{most / 1000:g} GPUs of {named}, {what}: it waits, holding nothing, until the queue's quota can "
            "hold it", demand - most)


def user_limit_message(user: str, queue: str, held: int, demand: int, limit: int) -> str:
    """What a job over its queue's per-user limit is told: alone over it, only a raised limit helps."""
    if demand > limit * 1000:
        return (f"the job needs {demand / 1000:g} GPUs; a user of queue {queue} may hold at most {limit}: it "
                "waits, holding nothing, until the queue's user limit is raised")
    return f"user {user} already holds {held / 1000:g} GPUs in queue {queue} (limit {limit})"


def waits_by_policy(spec: JobSpec, policy: PolicyBook) -> Reason | None:
    """The reason a job just submitted waits whatever the other jobs do, as quota will tell it: over its
    queue's per-user limit alone, then no quota of its models or more than its queue's ceiling (in the flavors
    of its queue it may use, as quota tries them: its user limit first). None when only others' use could hold
    it. Quota narrows the flavors further to those of a model a present node serves, so it may yet tell a job
    this answer let through that its queue cannot hold it; and it judges a job of a queue over its budget by the
    ceiling with borrowing (may_borrow), which this answer, knowing no budget, does not."""
    queue = policy.queues.get(spec.queue)
    demand = demand_milli(spec)
    if queue is not None and queue.user_max_gpus is not None and demand > queue.user_max_gpus * 1000:
        return (USER_LIMIT, user_limit_message(spec.user or spec.team, spec.queue, 0, demand, queue.user_max_gpus),
                0)
    book = policy.quotas
    flavors = book.flavors_for(spec.queue, spec)
    borrows = may_borrow(policy.preemptible(spec), over_budget=False)
    if queue_could_hold(book, spec.queue, demand, flavors, borrows):
        return None
    return ceiling_reason(book, spec.queue, demand, flavors, borrows, spec.gpu_models)
