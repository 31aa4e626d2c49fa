"""Who may be a victim: the protections a running job has (its class, its minimum runtime, its near end, the
evictions already decided), its queue's blast-radius budget, and the candidates within the preemptor's own queue.

Every rule reads the preemption state and the policy only, so that the decider's cycle, reclaim and the
simulation ask the same questions of the same data.
"""

from __future__ import annotations

from contracts import JobSpec
from libs.core.kernel.attained_service import threshold_milli_s
from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.queue_policies import evicts_equal_priority, within_queue_allows
from libs.core.preemption.ordering import victim_order
from libs.core.preemption.state import OVERRUN_S, PreemptionState, Running


def eligible(state: PreemptionState, policy: PolicyBook, run: Running, now: float, preemptor_id: str,
             reclaim: bool = False) -> bool:
    """May `run` be evicted for the preemptor now? A reclaim (`reclaim`) may take a borrower whatever its class:
    quota never lets a job that cannot be preempted borrow, so one that borrows became a borrower, or lost
    its preemptibility, through a policy change after it started, and the lender is owed that quota back."""
    return ((run.preemptible or reclaim) and run.job_id not in state.victim_of and run.job_id not in state.cancelled
            and now - run.started >= run.min_runtime_s
            and not about_to_end(policy, run, now)
            and run.job_id not in state.preempted_by.get(preemptor_id, {})  # never one's preemptor back
            and preemptor_id not in state.preempted_by.get(run.job_id, {}))  # nor the same victim twice


def about_to_end(policy: PolicyBook, run: Running, now: float) -> bool:
    """Will the job end within preempt_min_remaining_s by its declared runtime? One still running OVERRUN_S
    past its declared end overran its estimate: nobody knows when it ends (a tick then looks again:
    PreemptionState.unprotected)."""
    return run.ends_at is not None and -OVERRUN_S < run.ends_at - now <= policy.settings.preempt_min_remaining_s


def budget_left(state: PreemptionState, policy: PolicyBook, queue: str, now: float) -> int | None:
    """GPUs (thousandths) the queue may still lose to eviction in its window; None: no budget."""
    spec = policy.queues.get(queue)
    if spec is None or spec.eviction_budget_gpus is None:
        return None
    recent = sum(milli for when, milli in state.evicted.get(queue, []) if now - when < spec.eviction_window_s)
    return spec.eviction_budget_gpus * 1000 - recent


def las_level(state: PreemptionState, policy: PolicyBook, queue: str, job_id: str, now: float) -> float | None:
    """The queue's least-attained-service threshold when the job has held no more than it (so it may preempt
    jobs of its priority that have held more); None otherwise."""
    threshold = threshold_milli_s(policy.queues.get(queue))
    if threshold is None or state.attained.of(job_id, now) > threshold:
        return None
    return threshold


def candidates(state: PreemptionState, policy: PolicyBook, preemptor: JobSpec, preemptor_id: str, now: float
               ) -> list[Running]:
    """Jobs of the preemptor's queue its queue's within_queue_preemption lets it evict (lower priority; newer of
    its priority too, kernel/queue_policies.py), in victim order; in a queue of least attained service
    (kernel/attained_service.py), also those of its priority above the threshold while it is not."""
    priority = policy.priority_of(preemptor)
    level = las_level(state, policy, preemptor.queue, preemptor_id, now)
    attained = state.attained
    spec = policy.queues.get(preemptor.queue)
    # (Only asked where newer jobs of its priority may go: the preemptor's arrival and nominal fit.)
    arrived = state.submitted.get(preemptor_id, now) if evicts_equal_priority(spec) else now
    within_nominal = evicts_equal_priority(spec) and fits_a_nominal(policy, preemptor)
    found = [run for run in state.by_queue.get(preemptor.queue, {}).values()
             if (within_queue_allows(spec, priority, run.priority, state.submitted.get(run.job_id, now) > arrived,
                                     within_nominal)
                 or (level is not None and run.priority == priority and attained.of(run.job_id, now) > level))
             and run.job_id != preemptor_id and eligible(state, policy, run, now, preemptor_id)]
    found.sort(key=lambda run: victim_order(run, now))
    return found


def fits_a_nominal(policy: PolicyBook, spec: JobSpec) -> bool:
    """Is the job no larger than its queue's nominal quota of some flavor (a queue without quota: always)?"""
    limits = policy.quotas.limits.get(spec.queue)
    demand = demand_milli(spec)
    return not limits or any(demand <= lim.nominal for lim in limits.values())
