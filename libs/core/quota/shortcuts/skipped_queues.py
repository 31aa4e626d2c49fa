"""Queues a scheduling cycle need not look at: none of their waiting jobs could get quota in the cycle, and trying
them would tell nobody anything new.

In a full cohort every waiting queue's head fails, so a cycle that tried them all would cost as much as the
cohort has waiting queues, on every event. A queue is skippable when, in every flavor, its room is below
the smallest waiting job that flavor could serve (below its nominal quota left, in a flavor whose borrowers
are frozen this cycle); and trying its jobs would change nothing: each is told
already that it waits for quota (which defer does not repeat), no user limit, budget or backoff could tell
one otherwise, every job fits its queue's quota as it is now and a node present could hold it; and none of
its jobs fitting its own nominal quota could freeze borrowers (those flavors are frozen already, or its
nominal quota is used). Quota only shrinks during a cycle, so a skippable queue stays so until it ends.
Skipping such a queue decides exactly what trying it would
(tests/unit/core/kernel/test_shortcuts_change_no_decision.py)."""

from __future__ import annotations

from libs.core.quota.fit import all_could_ever_fit, all_holdable, pass_servable, quota_left
from libs.core.quota.state import Cycle, QuotaState


def skippable(state: QuotaState, queue: str, cycle: Cycle) -> bool:
    """Could no waiting job of the queue get quota in this cycle, trying them telling nobody anything new?
    (`p.backing_off`, the queues with a job backing off as the cycle began, may name more than are left: a
    backoff ending on the way only makes the answer no where it could have been yes.)"""
    flavors = state.book.limits.get(queue)
    if not flavors or queue in cycle.backing_off or not nothing_to_tell(state, queue):
        return False
    smallest = pass_servable(state, queue, cycle)
    for flavor in flavors:
        need = smallest.get(flavor)
        if need is None:
            continue  # no waiting job of the queue could use it
        nominal_left, room = quota_left(state, queue, flavor, cycle)
        if flavor in cycle.no_borrowing:
            if room >= need <= nominal_left:
                return False  # it could take its own nominal quota (nobody borrows the flavor this cycle)
        elif room >= need or nominal_left >= need:
            return False  # it could take quota, or, failing within its nominal quota, freeze the borrowers
    return True


def lent_only(state: QuotaState, queue: str, backing_off: set[str]) -> bool:
    """Is the waiting queue lent-only: skippable whenever its cohort has no idle lendable quota for the cohort's
    smallest waiting job (cohort_full)? So when trying its jobs could tell nobody anything new (as skippable
    asks) and its room is only what its cohort lends: it has no guaranteed (unlendable) quota idle, and less
    of its nominal quota left than its smallest waiting job (so it waits for no lent quota either). Everything
    asked is the queue's own, or policy, flavors and nodes: the answer is kept until one of them changes.
    `backing_off`: the queues with a job backing off (a cycle knows them)."""
    if queue in backing_off:
        return False
    versions = (state.policy_version, state.flavors_epoch, state.fleet.inventory.version,
                state.queue_version.get(queue, 0))
    known = state.lent_only_known.get(queue)
    if known is not None and known[0] == versions:
        return known[1]
    answer = lent_only_now(state, queue)
    state.lent_only_known[queue] = (versions, answer)
    return answer


def nothing_to_tell(state: QuotaState, queue: str) -> bool:
    """Would trying the governed queue's waiting jobs (none backing off) tell none of them anything new? Each is
    told it waits for quota already, no user limit or budget could tell it otherwise, its queue's quota could
    hold it and a node present could."""
    if state.untold.get(queue):
        return False
    spec = state.policy.queues.get(queue)
    if spec is None or spec.user_max_gpus is not None or spec.budget_gpu_hours is not None:
        return False
    return all_holdable(state, queue) and all_could_ever_fit(state, queue)


def lent_only_now(state: QuotaState, queue: str) -> bool:
    flavors = state.book.limits.get(queue)
    if not flavors or not nothing_to_tell(state, queue):
        return False
    smallest = min(min(demands) for demands in state.demands_by_models[queue].values())
    for flavor, lim in flavors.items():
        used = state.book.used.get((queue, flavor), 0)
        if used < lim.guaranteed or lim.nominal - used >= smallest:
            return False
    return True


def cohort_full(state: QuotaState, cohort: str) -> bool:
    """Is the cohort's idle lendable quota of every flavor below its smallest waiting job? Then no lent-only queue
    of it could take quota (its room is at most what the cohort lends)."""
    demands = state.cohort_demands.get(cohort)
    if not demands:
        return True
    need = min(demands)
    book = state.book
    return all(book.pool[(cohort, f)] - book.pool_used[(cohort, f)] < need for f in cohort_flavors(state, cohort))


def cohort_flavors(state: QuotaState, cohort: str) -> tuple[str, ...]:
    """The flavors the cohort's pool has (kept per policy version)."""
    version, known = state.cohort_flavors_at
    if version != state.policy_version:
        known = {}
        for c, f in state.book.pool:
            known[c] = (*known.get(c, ()), f)
        state.cohort_flavors_at = (state.policy_version, known)
    return known.get(cohort, ())
