"""Preemption's cycle: for a waiting job, find the victims whose eviction lets it run, and decide it.

A deferral by quota or placement asks about its job at once (consider); a clock tick asks about every waiting job
whose circumstances may have changed (tick). The rules of who may be a victim are in candidates.py, the reclaim
of lent quota in reclaim.py, the choice of the victim set in victim_sets.py, the what-if in simulation.py.
"""

from __future__ import annotations

from contracts import (
    BORROW_WITHIN_COHORT,
    LEAST_ATTAINED_SERVICE,
    RECLAIM,
    WITHIN_QUEUE_PRIORITY,
    JobSpec,
    PreemptionDecided,
    Victim,
)
from libs.core.kernel.attained_service import threshold_milli_s
from libs.core.kernel.decider import Decisions
from libs.core.kernel.lent_quota import waits_for_lent_quota
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.queue_policies import evicts_equal_priority, flavors_in_turn, fungible, preempts_while_borrowing
from libs.core.kernel.quota_math import ANY
from libs.core.preemption.candidates import candidates, las_level
from libs.core.preemption.holds import free_flavors
from libs.core.preemption.reclaim import borrowing_victims, placement_victims, reclaim_victims
from libs.core.preemption.shortcuts import AlikeJobs
from libs.core.preemption.simulation import Simulation, waiting_in_turn
from libs.core.preemption.state import PLACEMENT, Running, World
from libs.core.preemption.tick_jobs import could_evict_in, grace_ends, heads_of_queues, placement_waiters


def tick(world: World, now: float, out: Decisions) -> None:
    """A clock tick's cycle: look again at the waiting jobs a change may serve, and decide their evictions."""
    state, book = world.state, world.policy.quotas
    # 1. What changed since the last tick: reclaim graces that ended, protections that ran out (minimum
    #    runtimes, budgets grown back), anything folded. Nothing: no job would decide otherwise than before.
    due = grace_ends(state, world.policy, now)
    unprotected = state.unprotected(now)
    if not (state.changed or due or unprotected):
        return
    state.changed = False
    # 2. The jobs to try, in this order, each once: per queue, the first waiting job of each priority for each
    #    flavor quota does not hold it back from (a job ending frees quota for jobs behind the first too: no
    #    deferral tells them), the jobs holding quota that wait for a place, the jobs whose grace ended, the
    #    jobs that could evict where a protection ran out.
    jobs = heads_of_queues(world) + placement_waiters(state) + due + could_evict_in(state, book, unprotected)
    # 3. Try each (skipping a job alike to one that just found no victims: shortcuts.AlikeJobs).
    alike = AlikeJobs(state, world.policy, now)
    for job_id in dict.fromkeys(jobs):
        if alike.skip(job_id):
            continue
        alike.tried(consider(world, job_id, now, out))


def consider(world: World, job_id: str, now: float, out: Decisions) -> bool:
    """Find victims for one waiting job and decide their eviction; True when an eviction was decided."""
    # 1. Could an eviction serve it at all?
    if not may_evict_for(world, job_id):
        return False
    state = world.state
    spec, waiting = state.specs[job_id], state.waiting[job_id]
    queue = world.policy.queues.get(spec.queue)
    grace_over = state.grace_over(job_id, queue.reclaim_after_s if queue is not None else 0.0, now)
    # 2. The victims: for a job holding its quota, room on the GPUs; for a job waiting for quota, quota (and room).
    borrowing = False  # the victims of other queues are a reclaim's, not a borrowing preemptor's
    if waiting.code == PLACEMENT:
        victims = _victims_for_placement(world, job_id, spec, grace_over, now)
    else:
        victims, borrowing = _victims_for_quota(world, job_id, spec, grace_over, now)
    # 3. Decide their eviction.
    if not victims:
        return False
    _decide(world, job_id, spec, victims, borrowing, now, out)
    return True


def may_evict_for(world: World, job_id: str) -> bool:
    """Could an eviction serve the job now? Only a waiting job, not already waiting for its victims to
    leave, nor running; and only with candidates: without any there is nobody to evict, so no simulation
    is set up. No job of the queue running at a lower priority: no candidate within the queue; no cohort
    either: no borrower to reclaim from."""
    state, policy = world.state, world.policy
    spec = state.specs.get(job_id)
    waiting = state.waiting.get(job_id)
    if spec is None or waiting is None or job_id in state.in_flight or job_id in state.running:
        return False
    running, priority = state.running_priorities.get(spec.queue), policy.priority_of(spec)
    if running is not None and min(running, default=priority) < priority:
        return True
    if running and evicts_equal_priority(policy.queues.get(spec.queue)) and priority in running:
        return True  # newer jobs of its own priority may be candidates
    if running and threshold_milli_s(policy.queues.get(spec.queue)) is not None:
        return True  # least attained service: jobs of its own priority may be candidates
    return bool(policy.quotas.cohort.get(spec.queue, ""))


def _victims_for_placement(world: World, job_id: str, spec: JobSpec, grace_over: bool, now: float
                           ) -> list[Running]:
    """A job holding its quota lacks only room on the GPUs: jobs of its queue of lower priority make it, or
    (its grace over) borrowers of its cohort give back the GPUs its nominal quota stands for."""
    state = world.state
    if _giving_back(world, job_id, now):
        return []  # quota gives its reservation back now: what an eviction freed would go to others
    held = state.reserved.get(job_id)
    flavor = held[1] if held is not None else ANY
    found = candidates(state, world.policy, spec, job_id, now)
    reclaims = grace_over and held is not None
    if not (found or reclaims):
        return []
    with _simulation(world, spec, job_id, now) as sim:
        victims = sim.choose(found, lambda: sim.fits(flavor)) if found else []
        if not victims and reclaims and held is not None:
            victims = placement_victims(sim, held, job_id)
    return victims


def _victims_for_quota(world: World, job_id: str, spec: JobSpec, grace_over: bool, now: float
                       ) -> tuple[list[Running], bool]:
    """A job waiting for quota: first (its grace over) a reclaim of the quota its queue lent, else jobs of its
    queue it may evict, else (its queue's borrow_within_cohort allowing) borrowers of its cohort so that it
    borrows, so that quota admits it and placement places it. True with victims of that last kind."""
    # The flavors quota would reserve it in (one rule for both deciders), less those a job of higher priority
    # of its queue waits for: quota freed there goes to that one first, so evicting for it would serve the other.
    flavors = list(free_flavors(world, job_id))
    queue, book, demand = world.policy.queues.get(spec.queue), world.policy.quotas, demand_milli(spec)
    if fungible(queue):  # in the order its queue's flavor fungibility tries them, none past where it waits
        flavors = list(flavors_in_turn(queue, flavors, demand, lambda f: (book.nominal_left(spec.queue, f),
                                                                          book.room(spec.queue, f)),
                                       world.policy.priority_of(spec),
                                       lambda f: world.state.lent_to(book, spec.queue, f)))
    if not flavors:
        return [], False
    with _simulation(world, spec, job_id, now) as sim:
        victims = reclaim_victims(sim, flavors, job_id) if grace_over else []
        found = [] if victims else candidates(world.state, world.policy, spec, job_id, now)
        if found:

            def admitted_and_placed() -> bool:
                flavor = sim.quota_flavor(flavors)
                return flavor is not None and sim.fits(flavor)

            victims = sim.choose(found, admitted_and_placed, placed=lambda: any(sim.fits(f) for f in flavors))
        if not victims and preempts_while_borrowing(world.policy.queues.get(spec.queue)):
            return borrowing_victims(sim, flavors, job_id, found), True
    return victims, False


def _giving_back(world: World, job_id: str, now: float) -> bool:
    """Is the job's placement timeout over, so that quota gives its reservation back (as quota_timeout does:
    unless capacity is held for it)? Without a timeout, quota gives it back while a lender waits for the quota
    it borrows (timeout.recall_lent). It is reserved again later, and may evict then."""
    timeout = world.policy.settings.placement_timeout_s
    reserved_at = world.state.reserved_at.get(job_id)
    if reserved_at is None:
        return False
    if timeout is None:
        return _lender_waits(world, job_id)
    if now - reserved_at < timeout:
        return False
    return job_id not in world.state.capacity_held or _lender_waits(world, job_id)


def _lender_waits(world: World, job_id: str) -> bool:
    """Does another queue of the job's cohort wait for quota it lent, of the flavor the job borrows (as
    quota_reclaim.lender_waits asks)? Then quota gives a starving borrower's reservation back all the same."""
    held = world.state.reserved.get(job_id)
    if held is None:
        return False
    queue, flavor, _, over_budget = held
    book = world.policy.quotas
    cohort = book.cohort.get(queue, "")
    if not cohort or (not over_budget and book.borrowed(queue, flavor) <= 0):
        return False
    waiting = waiting_in_turn(world.state, book, world.models, flavor)
    return any(other != queue and other in waiting and waits_for_lent_quota(book, other, flavor, waiting[other])
               for other in book.members[cohort])


def _simulation(world: World, spec: JobSpec, job_id: str, now: float) -> Simulation:
    """The preemptor's what-if, to ask inside its `with` block (the decider's book and cluster come out of it
    unchanged)."""
    state = world.state

    def unclaimed(job_id: str) -> bool:
        preemptor = state.victim_of.get(job_id)
        return preemptor is None or preemptor in state.running or preemptor not in state.specs

    # Jobs on their way out (cancelled, or victims of a preemptor that runs already or is gone) leave room
    # nobody has claimed; victims leaving for a preemptor still waiting do not: that room is its.
    leaving = [state.running[other] for other in sorted({**state.cancelled, **state.victim_of})
               if other in state.running and unclaimed(other)]
    return Simulation(state, world.policy, world.cluster, spec, leaving, now, job_id, world.models)


def _decide(world: World, job_id: str, spec: JobSpec, victims: list[Running], borrowing: bool, now: float,
            out: Decisions) -> None:
    priority = world.policy.priority_of(spec)
    # Victims of another queue: a reclaim of lent quota, unless the preemptor must borrow to fit (borrowing
    # within its cohort, kernel/queue_policies.py); of its own priority in its queue: least attained service
    # where that rule lets it evict them, else newer jobs of its priority.
    level = las_level(world.state, world.policy, spec.queue, job_id, now)

    def why(victim: Running) -> str:
        if victim.queue != spec.queue:
            return BORROW_WITHIN_COHORT if borrowing else RECLAIM
        if victim.priority < priority or level is None or world.state.attained.of(victim.job_id, now) <= level:
            return WITHIN_QUEUE_PRIORITY
        return LEAST_ATTAINED_SERVICE

    reasons = [why(victim) for victim in victims]
    # The decision's code: the first of reclaim, borrowing, priority, least attained service one victim has.
    code = next(c for c in (RECLAIM, BORROW_WITHIN_COHORT, WITHIN_QUEUE_PRIORITY, LEAST_ATTAINED_SERVICE)
                if c in reasons)
    out.emit(PreemptionDecided, correlation_id=job_id, preemptor_id=job_id, code=code,
             victims=tuple(Victim(job_id=victim.job_id, queue=victim.queue, priority=victim.priority,
                                  gpu_milli=victim.demand, reason=reason,
                                  lost_gpu_seconds=round(victim.lost(now) / 1000, 3), started_at=victim.started)
                           for victim, reason in zip(victims, reasons, strict=True)))
