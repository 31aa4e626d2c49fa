"""The quota decider's state as data: what it knows of each job (QuotaJob), everything its fold keeps
(QuotaState: the waiting jobs' indexes, usage, nominations, backoffs, and what cycles keep between them), and
what one scheduling cycle learns as it goes (Cycle). Functions of the package take the state they read; the
decider (libs/core/quota/decider.py) holds this state, with its decision chain and its react."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import JobSpec, JobSubmitted
from libs.core.kernel.attained_service import AttainedService
from libs.core.kernel.budgets import BudgetBook
from libs.core.kernel.fairness import DecayedUsage
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.quota_figures import budget_left_s
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.kernel.starvation import RoomEffect, Shadow, Starving
from libs.core.quota.fleet import Fleet

# (when, its head at the start of a cycle, that head's order key): see shortcuts/kept_heads.py
KeptHead = tuple[tuple[object, ...], str, tuple[object, ...]]
# (order key, queue, the stamp of what the key was found from): an entry of a cohort's heap of ranked queues
RankedEntry = tuple[tuple[object, ...], str, tuple[object, ...]]


# What a scan read of a priority it stopped in or skipped the rest of: the (arrival, id) of the last job it read,
# the one user waiting at that priority (None: several), and, when it skipped the rest, the level's smallest
# demand and its one set of models (which it skipped by); see shortcuts/kept_failures.py.
LevelRead = tuple[tuple[int, str], str | None, tuple[int, tuple[str, ...]] | None]


@dataclass(slots=True)
class KeptFailures:
    """What a cycle over a queue without a cohort keeps of trying its jobs when that decided nothing: see
    shortcuts/kept_failures.py."""

    view: tuple[object, ...]  # what the cycle's view and the versions it read were
    stopped_at: int  # the priority its scan stopped at: nothing below it was read
    levels: dict[int, LevelRead]  # what it read of the priorities it stopped in or skipped the rest of
    timed: bool  # did a job tried have a runtime limit (then the starving job's shadow is read with the clock)?
    version: int  # the queue's version (waiting.queue_changed) the failures stand for


@dataclass(slots=True)
class QuotaJob:
    job_id: str
    queue: str
    user: str
    priority: int
    arrival: int
    since: float
    demand: int
    spec: JobSpec
    state: str = "pending"  # pending | reserved (ended jobs are forgotten)
    flavor: str = ANY
    reserved_at: float = 0.0
    over_budget: bool = False
    # The flavors this job may use (see fit.flavors_of), as of flavors epoch `flavors_version`.
    flavors: tuple[str, ...] = ()
    flavors_version: int = -1
    # What fit.could_ever_fit and fit.could_hold last answered for it, kept on the job (a cycle asks at every try):
    # the first reads only the policy and its flavors (flavors epoch `fits_version`, which every policy change
    # bumps), the second the empty inventory and its flavors (at inventory version `holdable_inventory`, flavors
    # epoch `holdable_version`); its spec never changes.
    fits: bool = False
    fits_version: int = -1
    fits_spent: bool = False  # the borrowing rule `fits` was judged by: its queue over budget (fit.may_borrow)
    holdable: bool = False
    holdable_inventory: int = -1
    holdable_version: int = -1
    # What fit.may_borrow last answered for it, at policy version `borrows_version` (only its class decides).
    borrows: bool = False
    borrows_version: int = -1
    # Reserved: placement placed it; the last deferral placement told it while it was not (placement's word).
    placed: bool = False
    model: str = ""  # the GPU model placement placed it on ("" not placed): the flavor that covers it follows it
    placement_code: str = ""
    timeouts: int = 0  # how often its reservation went back unplaced (its backoff doubles each time)
    timed_out_flavor: str | None = None  # the flavor of its last reservation that went back unplaced


@dataclass(eq=False, repr=False)  # (compared and shown as an object: it is the decider's whole state)
class QuotaState:
    """Everything the quota decider's fold keeps. Nothing here decides: the scheduling cycle reads it, the fold
    (libs/core/quota/fold.py) writes it."""

    runs: CurrentRuns = field(default_factory=CurrentRuns)  # executors' reports of runs over never get to it
    policy: PolicyBook = field(default_factory=PolicyBook)
    jobs: dict[str, QuotaJob] = field(default_factory=dict)
    # queue -> priority -> user -> [(arrival, job id)] sorted
    pending: dict[str, dict[int, dict[str, list[tuple[int, str]]]]] = field(default_factory=dict)
    # (queue, priority) -> pending demand -> count: the smallest demand of a level, fast
    demands: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)
    # (queue, priority) -> allowed GPU models -> count: is the level all one kind of request?
    models: dict[tuple[str, int], dict[tuple[str, ...], int]] = field(default_factory=dict)
    # queue -> allowed GPU models -> pending demand -> count: the smallest request a flavor could serve
    demands_by_models: dict[str, dict[tuple[str, ...], dict[int, int]]] = field(default_factory=dict)
    # Pending jobs by how long they have waited: (since, arrival, job id), for starvation.
    by_wait: list[tuple[float, int, str]] = field(default_factory=list)
    by_wait_in: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)  # the same, per queue
    reserved: dict[str, dict[str, None]] = field(default_factory=dict)  # queue -> jobs holding quota
    queue_used: dict[str, int] = field(default_factory=dict)
    user_used: dict[tuple[str, str], int] = field(default_factory=dict)
    decayed: dict[str, DecayedUsage] = field(default_factory=dict)
    budgets: BudgetBook = field(default_factory=BudgetBook)
    # GPU time each job held over its runs (least attained service)
    attained: AttainedService = field(default_factory=AttainedService)
    # Reserved jobs placement has not placed yet (in reservation order): the placement timeout looks at these.
    unplaced: dict[str, None] = field(default_factory=dict)
    # Those of them asked back at their timeout (QuotaRecalled): they go back once placement lets them go.
    recalled: dict[str, None] = field(default_factory=dict)
    returned: str | None = None  # the recalled job placement let go, by the answer just folded (react releases it)
    deferred: dict[str, str] = field(default_factory=dict)  # job -> the reason code it was last told
    # The deferred jobs waiting for a budget (BUDGET_SPENT, OVER_BUDGET_WAITS): clock ticks look at these.
    budget_deferred: dict[str, None] = field(default_factory=dict)
    # The jobs told no node could hold them (judged on the nodes present, not only on their models: fit.judged_anew).
    judged_on_nodes: dict[str, None] = field(default_factory=dict)
    arrivals: int = 0  # admissions so far: each admitted job's place in line
    submitted: dict[str, JobSubmitted] = field(default_factory=dict)  # submissions not admitted yet
    policy_version: int = 0  # bumps on every policy event: cached per-job answers go stale
    usage_version: int = 0  # bumps whenever the book's usage changes (a charge, a reservation moving flavor)
    usage_of: dict[str, int] = field(default_factory=dict)  # queue -> bumps whenever its own usage changes
    # group of queues -> (what it was found with, the starving job's shadow): see shortcuts/kept_shadow.py
    kept_shadows: dict[tuple[str, ...], tuple[tuple[object, ...], Shadow[QuotaJob] | None]] = field(
        default_factory=dict)
    # The GPU models the cluster has: a flavor none of its nodes could serve is passed over.
    fleet: Fleet = field(default_factory=Fleet)
    flavors_epoch: int = 0  # bumps with the policy or the fleet: each job's cached flavors go stale
    retries: RetryBook = field(default_factory=RetryBook)
    retry_in: dict[str, float] = field(default_factory=dict)  # job that failed and runs again -> its backoff
    backing_off: dict[str, float] = field(default_factory=dict)  # job -> not before
    # job whose reservation went back unplaced -> not before (kept apart: a retry is work still to come,
    # this is a job waiting for the cluster to change)
    requeued: dict[str, float] = field(default_factory=dict)
    # preemptor -> when its victims were chosen: quota they free goes to it first (until it lapses)
    nominated: dict[str, float] = field(default_factory=dict)
    # The preemptors with a victim chosen by least attained service (of their queue and priority): no
    # starving job holds the quota their victims free against them (starvation.held_for_starving).
    las_nominated: dict[str, None] = field(default_factory=dict)
    # preemptor -> (when its victims were chosen, their job ids): its placement timeout waits for them to leave
    victims_of: dict[str, tuple[float, tuple[str, ...]]] = field(default_factory=dict)
    # What the last folded event leaves for react: the queue of a waiting job it ended, the queues of the
    # nominations it let lapse, and those of the jobs whose placement backoff new capacity ended.
    left_waiting: str | None = None
    lapsed: list[str] = field(default_factory=list)
    backoffs_ended: list[str] = field(default_factory=list)
    # The queues whose budget ran out (or came back with a new period) by this tick, and each budgeted queue's
    # answer at the last tick: over its budget, a queue is owed no nominal quota, so its lent quota is free.
    budget_turned: list[str] = field(default_factory=list)
    over_budget_at_tick: dict[str, bool] = field(default_factory=dict)
    # (queue, demand, flavors) -> could the queue ever hold that much (fit.could_ever_fit), at policy version
    ever_fits: dict[tuple[str, int, tuple[str, ...]], bool] = field(default_factory=dict)
    ever_fits_version: int = -1
    interned_flavors: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)
    # Answers shared by the jobs asking alike (shortcuts/request_shapes.py): (flavors epoch, (queue, models,
    # demand) -> the flavors they may use) and (inventory version, (flavors, placement shape) -> could hold).
    flavors_by_shape: tuple[int, dict[tuple[object, ...], tuple[str, ...]]] = field(default_factory=lambda: (-1, {}))
    holdable_by_shape: tuple[int, dict[tuple[object, ...], bool]] = field(default_factory=lambda: (-1, {}))
    # queue -> (inventory version, flavors epoch, could the present nodes hold each of its waiting jobs)
    holdable: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    # queue -> (policy version, flavors epoch, could the queue ever hold each of its waiting jobs)
    fitting: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    # queue -> its waiting jobs not told they wait for quota (a cycle may have something to tell them)
    untold: dict[str, dict[str, None]] = field(default_factory=dict)
    # queue -> bumps whenever something of its own changes (waiting.queue_changed)
    queue_version: dict[str, int] = field(default_factory=dict)
    cohort_demands: dict[str, dict[int, int]] = field(default_factory=dict)  # cohort -> waiting demand -> jobs
    kept_heads: dict[str, KeptHead] = field(default_factory=dict)  # queue -> its kept head: see shortcuts/kept_heads.py
    kept_failures: dict[str, KeptFailures] = field(default_factory=dict)  # see shortcuts/kept_failures.py
    # The queues of each cohort kept ranked in fair order (shortcuts/ranked_queues.py): cohort -> its waiting
    # queues, its heap of ranked ones, the versions it was ranked at, those changed since a cycle looked, and
    # those not ranked when last looked at.
    waiting_in: dict[str, dict[str, None]] = field(default_factory=dict)
    ranked: dict[str, list[RankedEntry]] = field(default_factory=dict)
    ranked_at: dict[str, tuple[object, ...]] = field(default_factory=dict)
    changed_queues: dict[str, dict[str, None]] = field(default_factory=dict)
    unranked: dict[str, dict[str, None]] = field(default_factory=dict)
    # queue -> (when, is it lent-only: see shortcuts/skipped_queues.lent_only)
    lent_only_known: dict[str, tuple[tuple[int, ...], bool]] = field(default_factory=dict)
    # (policy version, cohort -> the flavors of its pool): see shortcuts/skipped_queues.cohort_flavors
    cohort_flavors_at: tuple[int, dict[str, tuple[str, ...]]] = field(default_factory=lambda: (-1, {}))

    @property
    def book(self) -> QuotaBook:
        return self.policy.quotas

    def budget_left_s(self, queue: str, now: float) -> float | None:
        """GPU-seconds left in the queue's budget period: what its jobs ran in it, runs going on up to now."""
        return budget_left_s(self, queue, now)


@dataclass(slots=True)
class Cycle:
    """What one scheduling cycle learned; quota only shrinks during a cycle, so failures stay failures."""

    now: float
    failed: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict)  # (queue, flavors) -> demand
    # queue -> flavor -> the priority that holds lower jobs back in that flavor
    held_below: dict[str, dict[str, int]] = field(default_factory=dict)
    held_all: dict[str, int] = field(default_factory=dict)  # queue -> the priority holding it in every flavor
    # Flavors a queue under its nominal quota waits for (lent out): no borrower of them grows this cycle.
    no_borrowing: set[str] = field(default_factory=set)
    # Queues whose head was found past a job told its queue could never hold it: whether that job still could not
    # is asked afresh each time (next_head.held_apart), so such a head is not kept between cycles.
    passed_inadmissible: set[str] = field(default_factory=set)
    starving: QuotaJob | None = None
    rule: Starving | None = None  # the starving job as the starvation rule sees it
    ending: tuple[QuotaJob, ...] = ()  # the reserved jobs that end by its shadow time
    held_message: str = ""  # what a job held for the starving job is told (made once per cycle)
    held_for_starving_job: bool = False  # was any job held for the starving job?
    # Cached between reservations (a reservation changes usage, so it clears them).
    keys: dict[str, tuple[object, ...]] = field(default_factory=dict)  # job id -> its order key
    within: dict[tuple[str, int, tuple[str, ...]], bool] = field(default_factory=dict)
    over_budget: dict[str, bool] = field(default_factory=dict)
    fair: dict[str, tuple[float, ...]] = field(default_factory=dict)  # queue -> its fair-share key
    # (queue, demand, flavors, could a node present hold it) -> reasons.quota_reason's answer
    reasons: dict[tuple[str, int, tuple[str, ...], bool], tuple[str, str, int]] = field(default_factory=dict)
    # (queue, priority) -> the smallest demand waiting at that level
    smallest: dict[tuple[str, int], int] = field(default_factory=dict)
    servable: dict[str, dict[str, int]] = field(default_factory=dict)  # queue -> fit.pass_servable
    # (queue, flavor) -> what is left of its nominal quota, and its room (see QuotaBook)
    quota: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # (queue, flavor, demand, over budget) -> what such a reservation does to the starving job's room
    effects: dict[tuple[str, str, int, bool], RoomEffect] = field(default_factory=dict)
    # The nominated preemptors waiting in the cycle's group (libs/core/quota/nomination.py), and per
    # (preemptor, queue, flavor, demand, over budget) whether such a reservation would leave it without room.
    nominees: list[QuotaJob] = field(default_factory=list)
    nominee_effects: dict[tuple[str, str, str, int, bool], bool] = field(default_factory=dict)
    # A cycle over one queue (its jobs are tried one after the other, nothing between them): then the jobs held
    # for the starving job in every flavor they had room in, by (queue, priority, demand, flavors, may borrow),
    # with the cycle's `holds` count and the size of `no_borrowing` then: another job of that key with no runtime
    # limit, told so already, tried next, would be held the same way while neither changed
    # (shortcuts/repeated_holds.py).
    one_queue: bool = False
    held_for_starving: dict[tuple[str, int, int, tuple[str, ...], bool], tuple[int, int]] = field(
        default_factory=dict)
    holds: int = 0  # bumps whenever `held_below` grows
    backing_off: set[str] = field(default_factory=set)  # the queues with a job backing off
    cohort: str = ""  # the cycle's cohort ("": a queue without one)
    reservations: int = 0  # how many the cycle made so far
    # The job at which a queue's scan for its next head last stopped, it and every job after it held in every
    # flavor, it told it waits for quota (None: the scan did not stop so); see shortcuts/kept_failures.py.
    stopped_at: QuotaJob | None = None
    skipped: dict[int, QuotaJob] = field(default_factory=dict)  # priority -> the job the scan skipped its rest at

    def note_reservation(self) -> None:
        """A job got quota: usage changed, so every answer kept until the next reservation goes."""
        self.reservations += 1
        self.held_for_starving.clear()
        self.keys.clear()
        self.within.clear()
        self.over_budget.clear()
        self.fair.clear()
        self.reasons.clear()
        self.smallest.clear()
        self.servable.clear()
        self.quota.clear()
        self.effects.clear()
        self.nominee_effects.clear()
