"""Is the reason a waiting job was last given still true? Each deferral code makes a claim about the world;
this checks the claim, not the code's wording."""

from __future__ import annotations

from collections.abc import Callable

from contracts import JobSpec
from libs.audit.guarantees import holds
from libs.audit.guarantees.world import PLACEMENT, QUOTA, JobState, World
from libs.core.cluster.shortfall import (
    FRAGMENTATION,
    GANG,
    INSUFFICIENT_CPU_MEMORY,
    INSUFFICIENT_GPUS,
    NO_MODEL_MATCH,
    TOPOLOGY,
)
from libs.core.kernel.wait_reasons import (
    BUDGET_SPENT,
    HELD_FOR_PREEMPTOR,
    HELD_FOR_STARVING_JOB,
    INADMISSIBLE,
    NO_NODE_COULD_HOLD,
    OVER_BUDGET_WAITS,
    RESERVED_FOR_PREEMPTOR,
    RETRY_BACKOFF,
    USER_LIMIT,
    WAITING_FOR_QUOTA,
)
from libs.core.quota import fit as quota_fit

Claim = Callable[[World, str, JobState], str]  # "" when the claim is true, else why it is not


def _quota_lacking(world: World, job_id: str, job: JobState) -> str:
    """The quota family (told once, whichever limit binds): the job cannot take quota now for a quota reason."""
    spec = job.spec
    if (holds.higher_priority_hold(world, job_id, spec) or holds.starving_quota_hold(world, job_id, spec)
            or holds.nominee_quota_hold(world, job_id, spec)):
        return ""
    roomy = [f for f in holds.quota_flavors_with_room(world, spec) if not holds.lender_waits(world, spec, f)]
    return f"queue {spec.queue} has room for it ({', '.join(roomy)})" if roomy else ""


def _negate(hold: Callable[[World, str, JobSpec], str], what: str) -> Claim:
    def claim(world: World, job_id: str, job: JobState) -> str:
        return "" if hold(world, job_id, job.spec) else what
    return claim


def _no_node_could_hold(world: World, job_id: str, job: JobState) -> str:
    """`no_node_could_hold`: no node present (registered, neither lost nor cordoned, its healthy GPUs) could hold
    the job under any flavor it may use, even with every running job gone. Asked of the inventory the quota
    decider's state folds from the log's node events, by placement's fit (quota_fleet,
    cluster.starving_room.EmptyInventory)."""
    held = world.quota.jobs.get(job_id)
    fleet = world.quota.fleet
    if held is None or not fleet.inventory.cluster.nodes:
        return ""  # no node at all: none could hold it
    if not quota_fit.could_hold(world.quota, held):
        return ""
    return "a node present could hold it once the running jobs are gone"


def _inadmissible(world: World, job_id: str, job: JobState) -> str:
    """`exceeds_queue_quota`, `no_quota_for_models`: its queue, as its quota is now, could not hold the job in
    any flavor it may use (the quota decider's own answer, quota_fit.could_ever_fit). Once a policy change gave
    it room the claim is false, and a job still told so was never looked at again."""
    held = world.quota.jobs.get(job_id)
    if held is None or not quota_fit.could_ever_fit(world.quota, held,
                                                    quota_fit.borrows_over_budget(world.quota, held.queue, world.now)):
        return ""
    return f"queue {job.spec.queue}'s quota as it is now could hold it"


def _not_fitting(world: World, job_id: str, job: JobState) -> str:
    return "it fits the cluster's free capacity" if holds.fits_now(world, job.spec, job.flavor) else ""


QUOTA_CLAIMS: dict[str, Claim] = {
    **dict.fromkeys(WAITING_FOR_QUOTA, _quota_lacking),
    USER_LIMIT: _negate(holds.user_limit_hold, "its user is within the queue's per-user limit"),
    BUDGET_SPENT: _negate(holds.budget_hold, "its queue's GPU-hour budget is not spent"),
    OVER_BUDGET_WAITS: _negate(holds.budget_hold, "its queue is within budget, or its cohort lends enough"),
    RETRY_BACKOFF: _negate(holds.backoff_hold, "its retry backoff is over"),
    HELD_FOR_STARVING_JOB: _negate(holds.starving_quota_hold, "no job of its cohort waits past the starvation limit"),
    NO_NODE_COULD_HOLD: _no_node_could_hold,
    **dict.fromkeys(INADMISSIBLE, _inadmissible),
    HELD_FOR_PREEMPTOR: _negate(holds.nominee_quota_hold, "no preemptor waiting for quota would be left without room "
                                                          "by it"),
}
PLACEMENT_CLAIMS: dict[str, Claim] = {
    **dict.fromkeys((NO_MODEL_MATCH, INSUFFICIENT_GPUS, FRAGMENTATION, INSUFFICIENT_CPU_MEMORY, TOPOLOGY, GANG),
                    _not_fitting),
    RESERVED_FOR_PREEMPTOR: _negate(holds.nomination_hold, "no preemptor of higher priority (nor a reclaim of "
                                                           "another queue) holds capacity"),
    HELD_FOR_STARVING_JOB: _negate(holds.starving_placement_hold, "no job waits for a place past the starvation "
                                                                  "limit"),
}


def untrue(world: World, job_id: str, job: JobState) -> str:
    """Why the job's recorded reason is false now ("" when true, or when the code is not one this knows)."""
    claims = QUOTA_CLAIMS if job.phase == QUOTA else PLACEMENT_CLAIMS if job.phase == PLACEMENT else {}
    claim = claims.get(job.reason)
    return claim(world, job_id, job) if claim is not None else ""
