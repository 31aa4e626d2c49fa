"""Where a job could fit, as the quota decider's state tells it, without deciding anything: the flavors a job
may use, whether it may borrow, whether its queue could ever hold it and whether a node present could, the
smallest waiting job each flavor could serve, what a pass sees of a queue's quota and budget (kept in the
pass until it reserves), and the group of queues (a cohort, or a queue without one) a pass runs over. The
scheduling pass, the reasons, the reclaim and the guarantee checker all ask these same questions."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from libs.core.kernel.quota_math import ANY, UNLIMITED
from libs.core.quota.state import Pass, QuotaJob

if TYPE_CHECKING:
    from libs.core.quota.decider import QuotaDecider


def flavors_of(d: QuotaDecider, job: QuotaJob) -> tuple[str, ...]:
    """The queue's flavors the job may use, in the queue's order, less those of a model no node of the cluster
    could hold it on while another could (quota of a model the cluster lacks would never be placed)."""
    if job.flavors_version != d.flavors_epoch:
        flavors = d.fleet.servable(tuple(d.book.flavors_for(job.queue, job.spec)), job.spec, job.demand)
        job.flavors = d._interned.setdefault(flavors, flavors)  # one object per value: compared by identity
        job.flavors_version = d.flavors_epoch
    return job.flavors


def may_borrow(d: QuotaDecider, job: QuotaJob) -> bool:
    """May the job use quota its queue borrows? Not a job that cannot be preempted: the lender would never
    get that quota back while it runs (as KAI Scheduler keeps such jobs within their queue's quota)."""
    return d.policy.preemptible(job.spec)


def could_hold(d: QuotaDecider, job: QuotaJob) -> bool:
    """Could the present nodes (healthy GPUs, registered, not lost nor cordoned) hold the job with every
    running job gone, by placement's fit? A job they could not hold is no starving job: holding quota for
    it would keep idle GPUs idle for a job that cannot start (libs/core/kernel/starvation.py)."""
    return d.fleet.could_place(flavors_of(d, job) or (ANY,), job.spec)


def could_ever_fit(d: QuotaDecider, job: QuotaJob) -> bool:
    if not d.book.governed(job.queue):
        return True
    # Ceilings change with policy alone: the answers are kept per policy version.
    if d._ever_fits_version != d.policy_version:
        d._ever_fits.clear()
        d._ever_fits_version = d.policy_version
    borrows = may_borrow(d, job)
    key = (job.queue, job.demand if borrows else -job.demand, flavors_of(d, job))  # one key per borrowing rule
    fits = d._ever_fits.get(key)
    if fits is None:
        fits = d._ever_fits[key] = any(d.book.ceiling(job.queue, f, borrows) >= job.demand for f in key[2])
    return fits


def all_holdable(d: QuotaDecider, queue: str) -> bool:
    """Could the present nodes hold every waiting job of the queue (each with every running job gone)? Kept
    until the inventory or the jobs' flavors change; a job that waits anew is checked as it comes
    (quota_fold.enqueue), and the answer for a queue with a job they could not hold is asked afresh once one
    leaves."""
    return _every_waiting(d, queue, d._holdable, (d.fleet.inventory.version, d.flavors_epoch), could_hold)


def all_could_ever_fit(d: QuotaDecider, queue: str) -> bool:
    """Could the queue, as its quota is now, hold every waiting job of it? Kept until the policy or the jobs'
    flavors change, as all_holdable is kept."""
    return _every_waiting(d, queue, d._fitting, (d.policy_version, d.flavors_epoch), could_ever_fit)


def _every_waiting(d: QuotaDecider, queue: str, known: dict[str, tuple[int, int, bool]], versions: tuple[int, int],
                   holds: Callable[[QuotaDecider, QuotaJob], bool]) -> bool:
    kept = known.get(queue)
    if kept is not None and kept[:2] == versions:
        return kept[2]
    answer = all(holds(d, d.jobs[j]) for users in d.pending.get(queue, {}).values()
                 for keys in users.values() for _, j in keys)
    known[queue] = (*versions, answer)
    return answer


def smallest_servable(d: QuotaDecider, queue: str, flavors: list[str], now: float) -> dict[str, int]:
    """Per flavor, the smallest waiting job of the queue that flavor could serve now (a job no node present
    could hold is served by none: it holds nobody). Without a user limit, a job backing off or a job no node
    could hold, the index of pending demands per requested models answers it."""
    spec = d.policy.queues.get(queue)
    limit = spec.user_max_gpus if spec is not None else None
    smallest: dict[str, int] = {}
    if limit is None and not any(d.jobs[j].queue == queue for backoffs in (d.backing_off, d.requeued)
                                 for j in backoffs if j in d.jobs) and all_holdable(d, queue):
        for models, demands in d.demands_by_models.get(queue, {}).items():
            need = min(demands)
            for f in flavors:
                if (f == ANY or not models or f in models) and need < smallest.get(f, UNLIMITED):
                    smallest[f] = need
        return smallest
    for users in d.pending.get(queue, {}).values():
        for user, keys in users.items():
            held = d.user_used.get((queue, user), 0)
            for _, job_id in keys:
                job = d.jobs[job_id]
                if max(d.backing_off.get(job_id, now), d.requeued.get(job_id, now)) > now or (
                        limit is not None and held + job.demand > limit * 1000) or (
                        not could_hold(d, job)):
                    continue
                for f in flavors:
                    if (f == ANY or not job.spec.gpu_models or f in job.spec.gpu_models) \
                            and job.demand < smallest.get(f, UNLIMITED):
                        smallest[f] = job.demand
    return smallest


def pass_servable(d: QuotaDecider, queue: str, p: Pass) -> dict[str, int]:
    """smallest_servable over all the queue's flavors, kept until the pass reserves."""
    smallest = p.servable.get(queue)
    if smallest is None:
        smallest = p.servable[queue] = smallest_servable(d, queue, list(d.book.limits.get(queue, ())), p.now)
    return smallest


def over_budget(d: QuotaDecider, queue: str, p: Pass) -> bool:
    if queue not in p.over_budget:
        left = d.budget_left_s(queue, p.now)
        p.over_budget[queue] = left is not None and left <= 0
    return p.over_budget[queue]


def quota_left(d: QuotaDecider, queue: str, flavor: str, p: Pass) -> tuple[int, int]:
    """What is left of the queue's nominal quota of the flavor, and its room; kept until the pass reserves."""
    key = (queue, flavor)
    left = p.quota.get(key)
    if left is None:
        left = p.quota[key] = (d.book.nominal_left(queue, flavor), d.book.room(queue, flavor))
    return left


def entitled(d: QuotaDecider, job: QuotaJob, p: Pass) -> bool:
    """Would the job fit within its queue's own nominal quota (lent out or not)? A queue over budget is
    never entitled: it only borrows."""
    if not d.book.governed(job.queue):
        return True
    flavors = flavors_of(d, job)
    key = (job.queue, job.demand, flavors)
    within = p.within.get(key)
    if within is None:
        within = False
        if not over_budget(d, job.queue, p):
            for f in flavors:
                if quota_left(d, job.queue, f, p)[0] >= job.demand:
                    within = True
                    break
        p.within[key] = within
    return within


def group_of(d: QuotaDecider, queue: str) -> list[str]:
    """The queues a pass for the queue runs over: its cohort's, or the queue alone."""
    cohort = d.book.cohort.get(queue, "")
    return d.book.members[cohort] if cohort else [queue]


def groups(d: QuotaDecider) -> list[list[str]]:
    """The groups of the queues jobs have waited in, in a fixed order."""
    seen: dict[str, list[str]] = {}
    for queue in sorted(d.pending):
        cohort = d.book.cohort.get(queue, "")
        seen.setdefault(cohort or f"queue:{queue}", group_of(d, queue))
    return [seen[k] for k in sorted(seen)]
