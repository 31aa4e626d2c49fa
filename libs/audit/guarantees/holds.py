"""Why a waiting job may rightly wait, judged on the World at one moment: the quota it lacks, the cluster
capacity it does not fit, and the holds the deciders place on purpose (a job of higher priority first, a
user limit, a spent budget, a retry's backoff, a job starving for too long, a preemptor's nomination).

Each hold answers with a sentence (why the job waits) or "" (it does not hold the job)."""

from __future__ import annotations

import heapq

import msgspec

from contracts import JobSpec
from libs.audit.guarantees.world import PLACEMENT, QUOTA, JobState, World
from libs.core.cluster.job_fit import fits
from libs.core.kernel.lent_quota import first_in_turn, waits_for_lent_quota
from libs.core.kernel.nomination import NOMINATION_TTL_S
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.queue_policies import flavors_in_turn
from libs.core.kernel.quota_figures import over_budget_room
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.starvation import longest_waiting
from libs.core.kernel.usable_flavors import usable_flavors
from libs.core.quota.fit import could_hold, lent_to
from libs.core.quota.nomination import holding_nominee, nominees
from libs.core.quota.reclaim import waiting_in_turn
from libs.core.quota.starvation import may_starve


def _gpus(milli: int) -> str:
    return f"{milli / 1000:g}"


def on_flavor(spec: JobSpec, flavor: str) -> JobSpec:
    """The job as placement sees it once its quota came from one GPU model's flavor."""
    return spec if flavor == ANY else msgspec.structs.replace(spec, gpu_models=(flavor,))


def priority(world: World, spec: JobSpec) -> int:
    return world.quota.policy.priority_of(spec)


# --- quota --------------------------------------------------------------------------------------------


def quota_flavors_with_room(world: World, spec: JobSpec) -> list[str]:
    """The queue's flavors the job may use that have room for it now (ANY for a queue without quota)."""
    book = world.quota.book
    demand = demand_milli(spec)
    over = _over_budget(world, spec.queue)
    if not book.governed(spec.queue):  # over budget, quota's own rule (over_budget_room) says what is idle
        return [ANY] if (over_budget_room(book, spec.queue, ANY) if over else book.room(spec.queue, ANY)) >= demand \
            else []
    borrows = world.quota.policy.preemptible(spec)  # a job that cannot be preempted never borrows
    # Of a model no present node could hold the job on, while another could, quota gives no flavor (the
    # decider's own narrowing, quota_fit.flavors_of): room there is no room the job could use.
    flavors = usable_flavors(book, world.quota.fleet, spec, demand)
    if not over:  # by the queue's flavor fungibility: past a flavor it waits at for a reclaim, no room is its
        flavors = flavors_in_turn(world.quota.policy.queues.get(spec.queue), flavors, demand,
                                  lambda f: (book.nominal_left(spec.queue, f), book.room(spec.queue, f)),
                                  priority(world, spec), lambda f: lent_to(world.quota, spec.queue, f))
    return [f for f in flavors
            if (over_budget_room(book, spec.queue, f) if over else book.room(spec.queue, f) if borrows
                else book.room_within_nominal(spec.queue, f)) >= demand]


def quota_hold(world: World, job_id: str, job: JobState) -> str:
    """Why the job cannot take quota now ("" when it could)."""
    spec = job.spec
    for hold in (backoff_hold, user_limit_hold, budget_hold, higher_priority_hold, starving_quota_hold,
                 nominee_quota_hold):
        why = hold(world, job_id, spec)
        if why:
            return why
    roomy = quota_flavors_with_room(world, spec)
    if not roomy:
        return f"queue {spec.queue} has no room for {_gpus(demand_milli(spec))} GPUs in any flavor the job may use"
    if all(lender_waits(world, spec, f) for f in roomy):
        return f"a queue of {spec.queue}'s cohort under its nominal quota waits for quota lent out: nobody borrows"
    return ""


def backoff_hold(world: World, job_id: str, spec: JobSpec) -> str:
    """A job waits out its backoff: after a failure, or after its reservation went back at a placement timeout."""
    failed = world.quota.backing_off.get(job_id)
    if failed and failed > world.now:
        return f"it backs off after a failure until {failed:.0f}"
    timed_out = world.quota.requeued.get(job_id)
    if timed_out and timed_out > world.now:
        return f"it backs off after a placement timeout until {timed_out:.0f}"
    return ""


def user_limit_hold(world: World, job_id: str, spec: JobSpec) -> str:
    queue = world.quota.policy.queues.get(spec.queue)
    limit = queue.user_max_gpus if queue is not None else None
    if limit is None:
        return ""
    user = spec.user or spec.team
    held = world.quota.user_used.get((spec.queue, user), 0)
    if held + demand_milli(spec) <= limit * 1000:
        return ""
    return f"user {user} holds {_gpus(held)} GPUs of queue {spec.queue} (limit {limit})"


def _over_budget(world: World, queue: str) -> bool:
    left = world.quota.budget_left_s(queue, world.now)
    return left is not None and left <= 0


def budget_hold(world: World, job_id: str, spec: JobSpec) -> str:
    if not _over_budget(world, spec.queue):
        return ""
    queue = world.quota.policy.queues[spec.queue]
    if queue.over_budget == "wait":
        return f"queue {spec.queue} spent its GPU-hour budget and waits for the next period"
    if not quota_flavors_with_room(world, spec):
        return f"queue {spec.queue} spent its GPU-hour budget and its cohort lends no idle quota"
    return ""


def higher_priority_hold(world: World, job_id: str, spec: JobSpec) -> str:
    """A job of higher priority of the queue waits for quota first: one a node present could hold (one none
    could hold holds nobody, as quota_reserve.hold_below has it)."""
    levels = world.quota.pending.get(spec.queue, {})
    mine = priority(world, spec)
    for prio, users in levels.items():
        if prio > mine and any(holdable(world, j) for keys in users.values() for _, j in keys):
            return f"jobs of higher priority wait for queue {spec.queue}'s quota first"
    return ""


def holdable(world: World, job_id: str) -> bool:
    """Could a node present hold the quota decider's job with every running job gone (quota_fit.could_hold)?"""
    job = world.quota.jobs.get(job_id)
    return job is not None and could_hold(world.quota, job)


def starving_quota_hold(world: World, job_id: str, spec: JobSpec) -> str:
    """Another job of the cohort is its starving job: the longest waiting past the starvation limit that may
    starve (the decider's own rule, quota_starvation.may_starve: one no node present could hold is none, and
    holds nobody). Quota is held for it."""
    quota = world.quota
    limit = quota.policy.settings.starvation_after_s
    if limit is None:
        return ""
    book = quota.book
    cohort = book.cohort.get(spec.queue, "")
    group = book.members.get(cohort, [spec.queue]) if cohort else [spec.queue]
    waits = heapq.merge(*(quota.by_wait_in.get(queue, []) for queue in group))
    oldest = longest_waiting(((since, (since, quota.jobs[other])) for since, _, other in waits if other in quota.jobs),
                             world.now, limit, lambda item: may_starve(quota, item[1]))
    if oldest is None or oldest[1].job_id == job_id or oldest[1].priority < priority(world, spec):
        return ""
    return f"quota is held for job {oldest[1].job_id}, waiting since {oldest[0]:.0f}"


def nominee_quota_hold(world: World, job_id: str, spec: JobSpec) -> str:
    """A preemptor of the job's cohort was nominated and waits for quota: the job's reservation, in every flavor
    with room for it, would leave that preemptor without room (libs/core/quota/nomination.py)."""
    job = world.quota.jobs.get(job_id)
    if job is None or not world.quota.nominated:
        return ""
    book = world.quota.book
    cohort = book.cohort.get(spec.queue, "")
    waiting = nominees(world.quota, book.members.get(cohort, [spec.queue]) if cohort else [spec.queue], world.now)
    if not waiting:
        return ""
    over = _over_budget(world, spec.queue)
    holders = [holding_nominee(world.quota, waiting, job, f, over) for f in quota_flavors_with_room(world, spec)]
    held = [h.job_id for h in holders if h is not None]
    if not holders or len(held) < len(holders):
        return ""  # some flavor with room for it would leave every preemptor its room
    return f"quota freed by preemption is held for preemptor {held[0]}"


def lender_waits(world: World, spec: JobSpec, flavor: str) -> bool:
    """Must the job borrow `flavor`, while another queue of its cohort under its nominal quota waits for the
    part of it that is lent out? Then the quota decider lets no borrower grow (see quota_reclaim.lent_out)."""
    book = world.quota.book
    if book.nominal_left(spec.queue, flavor) >= demand_milli(spec):
        return False
    return bool(waiting_lenders(world, spec.queue, flavor))


def waiting_lenders(world: World, queue: str, flavor: str) -> list[str]:
    """Queues of `queue`'s cohort (itself included) whose quota of the flavor is lent out while they wait."""
    book = world.quota.book
    cohort = book.cohort.get(queue, "")
    group = book.members.get(cohort, [queue]) if cohort else [queue]
    return [q for q in group if lent_out_while_waiting(world, q, flavor)]


def lent_out_while_waiting(world: World, queue: str, flavor: str) -> bool:
    """Does the queue wait for its quota of the flavor lent out: the job its order admits next there fits its
    nominal quota of the flavor, but not the room its cohort leaves it? Then borrowers hold the part of its quota
    it waits for. One rule for quota, preemption and the checker (libs/core/kernel/lent_quota.py), asked of the
    jobs quota lists for it (`quota_reclaim.waiting_in_turn`): jobs held by their user's limit, backing off, that
    no node present could hold or that their queue could never hold wait for neither, so they hold no borrower
    back and are owed no reclaim."""
    book = world.quota.book
    if not world.quota.pending.get(queue) or flavor not in book.limits.get(queue, {}) or _over_budget(world, queue):
        return False
    return waits_for_lent_quota(book, queue, flavor, waiting_in_turn(world.quota, queue, flavor, world.now))


def reclaim_due(world: World, queue: str, flavor: str) -> bool:
    """Is a reclaim of the flavor's lent quota due to the queue? Exactly where quota lets no borrower of it grow
    (lent_out_while_waiting): its first job in turn there (first_waiting) fits its nominal quota of the flavor but
    not its room. A job that would have to borrow is owed none, nor are the jobs waiting behind it."""
    return lent_out_while_waiting(world, queue, flavor)


def first_waiting(world: World, queue: str, flavor: str) -> str | None:
    """The queue's first job waiting for quota in the flavor, as its order admits them (the kernel's rule,
    libs/core/kernel/lent_quota.py `first_in_turn`: of the highest priority waiting there, the smallest; jobs
    below it wait behind it by the queue's own order), among the jobs quota would try there (see
    lent_out_while_waiting)."""
    first = first_in_turn(waiting_in_turn(world.quota, queue, flavor, world.now))
    return None if first is None else first[2]


# --- placement ----------------------------------------------------------------------------------------


def fits_now(world: World, spec: JobSpec, flavor: str = ANY) -> bool:
    return fits(world.capacity.cluster, on_flavor(spec, flavor))


def nomination_hold(world: World, job_id: str, spec: JobSpec) -> str:
    mine = priority(world, spec)
    for preemptor in sorted(world.nominated):
        at = world.nominated[preemptor]
        other = world.jobs.get(preemptor)
        if (preemptor != job_id and other is not None and other.phase in (QUOTA, PLACEMENT)
                and world.now - at <= NOMINATION_TTL_S
                and (priority(world, other.spec) > mine
                     or (preemptor in world.reclaiming and other.spec.queue != spec.queue)
                     or (preemptor in world.least_served and other.spec.queue == spec.queue
                         and priority(world, other.spec) == mine))):
            return f"capacity is held for preemptor {preemptor}, nominated at {at:.0f}"
    return ""


def starving_placement_hold(world: World, job_id: str, spec: JobSpec) -> str:
    limit = world.quota.policy.settings.starvation_after_s
    if limit is None:
        return ""
    mine = priority(world, spec)
    for other in sorted(world.placing):
        job = world.jobs[other]
        since = job.since if job.place_wait_since is None else job.place_wait_since
        # (one no node present could hold is no starving job: placement holds nothing for it)
        if (other != job_id and job.phase == PLACEMENT and world.now - since >= limit
                and priority(world, job.spec) >= mine and world.quota.fleet.could_place((job.flavor,), job.spec)):
            return f"capacity is held for job {other}, waiting for a place since {since:.0f}"
    return ""


def placement_hold(world: World, job_id: str, job: JobState) -> str:
    """Why the reserved job cannot be placed now ("" when it could)."""
    for hold in (nomination_hold, starving_placement_hold):
        why = hold(world, job_id, job.spec)
        if why:
            return why
    if not fits_now(world, job.spec, job.flavor):
        return "it does not fit the cluster's free capacity"
    return ""


def could_run(world: World, job_id: str, job: JobState) -> str:
    """For a waiting job: what is idle that it could use now ("" when something rightly holds it)."""
    if job.phase == PLACEMENT:
        return "" if placement_hold(world, job_id, job) else "it fits the cluster's free capacity now"
    if job.phase != QUOTA or job_id not in world.quota.jobs or quota_hold(world, job_id, job):
        return ""
    for flavor in quota_flavors_with_room(world, job.spec):
        if not lender_waits(world, job.spec, flavor) and fits_now(world, job.spec, flavor):
            where = f"queue {job.spec.queue} has room" + (f" of flavor {flavor}" if flavor != ANY else "")
            return f"{where} and the cluster has free capacity it fits"
    return ""

