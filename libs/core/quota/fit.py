"""Where a job could fit, as the quota decider's state tells it, without deciding anything: the flavors a job
may use, whether it may borrow, whether its queue could ever hold it and whether a node present could, the
smallest waiting job each flavor could serve, what a cycle sees of a queue's quota and budget (kept in the
cycle until it reserves), and the group of queues (a cohort, or a queue without one) a cycle runs over. The
scheduling cycle, the reasons, the reclaim and the guarantee checker all ask these same questions."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from libs.core.kernel import inadmissible
from libs.core.kernel.accelerators import model_matches
from libs.core.kernel.inadmissible import queue_could_hold
from libs.core.kernel.quota_math import ANY, UNLIMITED
from libs.core.kernel.usable_flavors import usable_flavors
from libs.core.quota.shortcuts.request_shapes import shaped_flavors, shaped_holdable
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def flavors_of(state: QuotaState, job: QuotaJob) -> tuple[str, ...]:
    """The queue's flavors the job may use, in the queue's order, less those of a model no node of the cluster
    could hold it on while another could (kernel/usable_flavors.py, the rule preemption simulates by too)."""
    if job.flavors_version != state.flavors_epoch:
        job.flavors = shaped_flavors(state, job, usable_flavors_of)
        job.flavors_version = state.flavors_epoch
    return job.flavors


def usable_flavors_of(state: QuotaState, job: QuotaJob) -> tuple[str, ...]:
    """flavors_of the long way (shortcuts/request_shapes.py shares it among jobs asking alike)."""
    flavors = usable_flavors(state.book, state.fleet, job.spec, job.demand)
    return state.interned_flavors.setdefault(flavors, flavors)  # one object per value: compared by identity


def judged_anew(state: QuotaState) -> set[str]:
    """The queues of the waiting jobs whose answer the fleet event just folded may change. Quota reads the fleet
    through two questions only, so these are the jobs it changes: every answer is judged on the flavors the job
    may use (flavors_of: those of a model the nodes present serve), and NO_NODE_COULD_HOLD also on whether the
    nodes present could hold it at all (could_hold)."""
    queues = {state.jobs[j].queue for j in state.judged_on_nodes if j in state.jobs}
    return flavors_moved_queues(state, queues)


def flavors_moved_queues(state: QuotaState, queues: set[str] | None = None) -> set[str]:
    """`queues` with those of the waiting jobs whose usable flavors the fleet event just folded moved. Capacity
    that shrinks moves them too: a model no node serves any more, or none serving the job's now, so that every
    flavor is usable again (a job told its queue could never hold it may now be held in one)."""
    queues = set() if queues is None else queues
    if state.fleet.before is state.fleet.by_model:
        return queues  # no model's count changed: no job's flavors moved
    for job_id in state.deferred:
        job = state.jobs.get(job_id)
        if job is not None and job.state == "pending" and job.queue not in queues and flavors_moved(state, job):
            queues.add(job.queue)
    return queues


def flavors_moved(state: QuotaState, job: QuotaJob) -> bool:
    """Are the flavors the job may use now other than before the fleet event just folded?"""
    before = usable_flavors(state.book, state.fleet, job.spec, job.demand, state.fleet.before)
    return before != flavors_of(state, job)


def may_borrow(state: QuotaState, job: QuotaJob, spent: bool = False) -> bool:
    """May the job use quota its queue borrows (the kernel's rule, inadmissible.may_borrow)? Within budget not a
    job that cannot be preempted; `spent`: its queue is over its budget and goes on borrowing
    (borrows_over_budget), where every job borrows. Whether it can be preempted is kept on the job per policy
    version: every try asks it, and only the priority classes (policy) change it."""
    if job.borrows_version != state.policy_version:
        job.borrows = state.policy.preemptible(job.spec)
        job.borrows_version = state.policy_version
    return inadmissible.may_borrow(job.borrows, spent)


def borrows_over_budget(state: QuotaState, queue: str, now: float, cycle: Cycle | None = None) -> bool:
    """Is the queue over its GPU-hour budget and going on with borrowed quota only (`over_budget: borrow`)?
    Then every job of it borrows (may_borrow). Read from the cycle's view when given (over_budget)."""
    spec = state.policy.queues.get(queue)
    if spec is None or spec.budget_gpu_hours is None or spec.over_budget != "borrow":
        return False
    if cycle is not None:
        return over_budget(state, queue, cycle)
    left = state.budget_left_s(queue, now)
    return left is not None and left <= 0


def could_hold(state: QuotaState, job: QuotaJob) -> bool:
    """Could the present nodes (healthy GPUs, registered, not lost nor cordoned) hold the job with every
    running job gone, by placement's fit? A job they could not hold is no starving job: holding quota for
    it would keep idle GPUs idle for a job that cannot start (libs/core/kernel/starvation.py)."""
    inventory = state.fleet.inventory.version
    if job.holdable_version != state.flavors_epoch or job.holdable_inventory != inventory:
        job.holdable = shaped_holdable(state, job, flavors_of(state, job), placeable)
        job.holdable_inventory, job.holdable_version = inventory, state.flavors_epoch
    return job.holdable


def placeable(state: QuotaState, job: QuotaJob) -> bool:
    """could_hold the long way (shortcuts/request_shapes.py shares it among jobs asking alike)."""
    return state.fleet.could_place(flavors_of(state, job) or (ANY,), job.spec)


def could_ever_fit(state: QuotaState, job: QuotaJob, spent: bool = False) -> bool:
    """ever_fits, kept on the job per flavors epoch and borrowing rule (`spent`: see may_borrow)."""
    if job.fits_version != state.flavors_epoch or job.fits_spent != spent:
        job.fits = ever_fits(state, job, spent)
        job.fits_version, job.fits_spent = state.flavors_epoch, spent
    return job.fits


def ever_fits(state: QuotaState, job: QuotaJob, spent: bool = False) -> bool:
    """Could the job's queue, as its quota is now, ever hold the job (in a flavor it may use, by the borrowing
    rule it is under: kernel/inadmissible.py may_borrow; `spent`: its queue is over budget, borrowing)?"""
    if not state.book.governed(job.queue):
        return True
    # Ceilings change with policy alone: the answers are kept per policy version.
    if state.ever_fits_version != state.policy_version:
        state.ever_fits.clear()
        state.ever_fits_version = state.policy_version
    borrows = may_borrow(state, job, spent)
    key = (job.queue, job.demand if borrows else -job.demand, flavors_of(state, job))  # one key per borrowing rule
    fits = state.ever_fits.get(key)
    if fits is None:
        fits = state.ever_fits[key] = queue_could_hold(state.book, job.queue, job.demand, key[2], borrows)
    return fits


def all_holdable(state: QuotaState, queue: str) -> bool:
    """Could the present nodes hold every waiting job of the queue (each with every running job gone)? Kept
    until the inventory or the jobs' flavors change; a job that waits anew is checked as it comes
    (waiting.enqueue), and the answer for a queue with a job they could not hold is asked afresh once one
    leaves."""
    versions = (state.fleet.inventory.version, state.flavors_epoch)
    return _every_waiting(state, queue, state.holdable, versions, could_hold)


def all_could_ever_fit(state: QuotaState, queue: str) -> bool:
    """Could the queue, as its quota is now, hold every waiting job of it? Kept until the policy or the jobs'
    flavors change, as all_holdable is kept."""
    return _every_waiting(state, queue, state.fitting, (state.policy_version, state.flavors_epoch), could_ever_fit)


def _every_waiting(state: QuotaState, queue: str, known: dict[str, tuple[int, int, bool]], versions: tuple[int, int],
                   holds: Callable[[QuotaState, QuotaJob], bool]) -> bool:
    kept = known.get(queue)
    if kept is not None and kept[:2] == versions:
        return kept[2]
    answer = all(holds(state, state.jobs[j]) for users in state.pending.get(queue, {}).values()
                 for keys in users.values() for _, j in keys)
    known[queue] = (*versions, answer)
    return answer


def smallest_servable(state: QuotaState, queue: str, flavors: list[str], now: float) -> dict[str, int]:
    """Per flavor, the smallest waiting job of the queue that flavor could serve now (a job no node present
    could hold is served by none: it holds nobody). Without a user limit, a job backing off or a job no node
    could hold, the index of pending demands per requested models answers it."""
    spec = state.policy.queues.get(queue)
    limit = spec.user_max_gpus if spec is not None else None
    smallest: dict[str, int] = {}
    if limit is None and not any(state.jobs[j].queue == queue for backoffs in (state.backing_off, state.requeued)
                                 for j in backoffs if j in state.jobs) and all_holdable(state, queue):
        for models, demands in state.demands_by_models.get(queue, {}).items():
            need = min(demands)
            for f in flavors:
                # (the flavors a job may use by its models, "npu:*" and none included: QuotaBook.flavors_for)
                if (f == ANY or model_matches(models, f)) and need < smallest.get(f, UNLIMITED):
                    smallest[f] = need
        return smallest
    for users in state.pending.get(queue, {}).values():
        for user, keys in users.items():
            held = state.user_used.get((queue, user), 0)
            for _, job_id in keys:
                job = state.jobs[job_id]
                if max(state.backing_off.get(job_id, now), state.requeued.get(job_id, now)) > now or (
                        limit is not None and held + job.demand > limit * 1000) or (
                        not could_hold(state, job)):
                    continue
                for f in flavors:
                    if (f == ANY or model_matches(job.spec.gpu_models, f)) \
                            and job.demand < smallest.get(f, UNLIMITED):
                        smallest[f] = job.demand
    return smallest


def pass_servable(state: QuotaState, queue: str, cycle: Cycle) -> dict[str, int]:
    """smallest_servable over all the queue's flavors, kept until the cycle reserves."""
    smallest = cycle.servable.get(queue)
    if smallest is None:
        flavors = list(state.book.limits.get(queue, ()))
        smallest = cycle.servable[queue] = smallest_servable(state, queue, flavors, cycle.now)
    return smallest


def over_budget(state: QuotaState, queue: str, cycle: Cycle) -> bool:
    if queue not in cycle.over_budget:
        left = state.budget_left_s(queue, cycle.now)
        cycle.over_budget[queue] = left is not None and left <= 0
    return cycle.over_budget[queue]


def quota_left(state: QuotaState, queue: str, flavor: str, cycle: Cycle) -> tuple[int, int]:
    """What is left of the queue's nominal quota of the flavor, and its room; kept until the cycle reserves."""
    key = (queue, flavor)
    left = cycle.quota.get(key)
    if left is None:
        left = cycle.quota[key] = (state.book.nominal_left(queue, flavor), state.book.room(queue, flavor))
    return left


def lent_to(state: QuotaState, lender: str, flavor: str) -> Iterator[tuple[int, int]]:
    """The jobs holding quota of the flavor that the lender's queue lent (QuotaBook.holders_of_lent, holds_lent),
    each as its priority and its quota: those a reclaim for it might take, which its flavor fungibility asks about
    (kernel/queue_policies.py flavors_in_turn)."""
    book = state.book
    for queue in book.holders_of_lent(lender):
        for job_id in state.reserved.get(queue, ()):
            job = state.jobs[job_id]
            if job.flavor == flavor and book.holds_lent(lender, queue, flavor, job.over_budget):
                yield job.priority, job.demand


def entitled(state: QuotaState, job: QuotaJob, cycle: Cycle) -> bool:
    """Would the job fit within its queue's own nominal quota (lent out or not)? A queue over budget is
    never entitled: it only borrows."""
    if not state.book.governed(job.queue):
        return True
    flavors = flavors_of(state, job)
    key = (job.queue, job.demand, flavors)
    within = cycle.within.get(key)
    if within is None:
        within = False
        if not over_budget(state, job.queue, cycle):
            for f in flavors:
                if quota_left(state, job.queue, f, cycle)[0] >= job.demand:
                    within = True
                    break
        cycle.within[key] = within
    return within


def group_of(state: QuotaState, queue: str) -> list[str]:
    """The queues a cycle for the queue runs over: its cohort's, or the queue alone."""
    cohort = state.book.cohort.get(queue, "")
    return state.book.members[cohort] if cohort else [queue]


def linked_groups(state: QuotaState, queue: str) -> list[list[str]]:
    """The queue's group and the groups whose room its usage changes (kernel/queue_tree.py): the cohorts of its
    ancestors with quota, whose pools count what their subtrees hold, and every group under a parent with quota
    in those, whose rooms the parent's room bounds. Deepest first (a subtree's quota is its own before the
    cohort above may borrow it), then by name. A queue outside any tree: its group alone."""
    book = state.book
    own = group_of(state, queue)
    if not book.bounds.get(queue) and not any(book.children.get(q) for q in own):
        return [own]
    found = [own]
    for ancestor in book.bounds.get(queue, ()):
        if book.cohort.get(ancestor) and group_of(state, ancestor) not in found:
            found.append(group_of(state, ancestor))
    for group in found:  # (grows while read: each group's subtrees in turn)
        for parent in group:
            for child in book.children.get(parent, ()) if book.governed(parent) else ():
                if group_of(state, child) not in found:
                    found.append(group_of(state, child))
    return sorted(found, key=lambda group: (-len(book.bounds.get(group[0], ())), group[0]))


def groups(state: QuotaState) -> list[list[str]]:
    """The groups of the queues jobs have waited in, in a fixed order."""
    seen: dict[str, list[str]] = {}
    for queue in sorted(state.pending):
        cohort = state.book.cohort.get(queue, "")
        seen.setdefault(cohort or f"queue:{queue}", group_of(state, queue))
    return [seen[k] for k in sorted(seen)]
