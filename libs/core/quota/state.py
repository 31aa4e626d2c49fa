"""What the quota decider knows of one job, and what one scheduling pass learns as it goes."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import JobSpec
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.starvation import RoomEffect, Starving


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
    # The flavors this job may use (see quota_fit.flavors_of), as of flavors epoch `flavors_version`.
    flavors: tuple[str, ...] = ()
    flavors_version: int = -1
    # Reserved: placement placed it; the last deferral placement told it while it was not (placement's word).
    placed: bool = False
    model: str = ""  # the GPU model placement placed it on ("" not placed): the flavor that covers it follows it
    placement_code: str = ""
    placed_while_pending: bool = False  # placed before placement read that its quota went back
    timeouts: int = 0  # how often its reservation went back unplaced (its backoff doubles each time)
    timed_out_flavor: str | None = None  # the flavor of its last reservation that went back unplaced


@dataclass(slots=True)
class Pass:
    """What one scheduling pass learned; quota only shrinks during a pass, so failures stay failures."""

    now: float
    failed: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict)  # (queue, flavors) -> demand
    # queue -> flavor -> the priority that holds lower jobs back in that flavor
    held_below: dict[str, dict[str, int]] = field(default_factory=dict)
    held_all: dict[str, int] = field(default_factory=dict)  # queue -> the priority holding it in every flavor
    # Flavors a queue under its nominal quota waits for (lent out): no borrower of them grows this pass.
    no_borrowing: set[str] = field(default_factory=set)
    starving: QuotaJob | None = None
    rule: Starving | None = None  # the starving job as the starvation rule sees it
    ending: tuple[QuotaJob, ...] = ()  # the reserved jobs that end by its shadow time
    held_message: str = ""  # what a job held for the starving job is told (made once per pass)
    # Cached between reservations (a reservation changes usage, so it clears them).
    keys: dict[str, tuple[object, ...]] = field(default_factory=dict)  # job id -> its order key
    within: dict[tuple[str, int, tuple[str, ...]], bool] = field(default_factory=dict)
    over_budget: dict[str, bool] = field(default_factory=dict)
    fair: dict[str, tuple[float, ...]] = field(default_factory=dict)  # queue -> its fair-share key
    # (queue, demand, flavors, could a node present hold it) -> quota_reasons.quota_reason's answer
    reasons: dict[tuple[str, int, tuple[str, ...], bool], tuple[str, str, int]] = field(default_factory=dict)
    # (queue, priority) -> the smallest demand waiting at that level
    smallest: dict[tuple[str, int], int] = field(default_factory=dict)
    servable: dict[str, dict[str, int]] = field(default_factory=dict)  # queue -> quota_fit.pass_servable
    # (queue, flavor) -> what is left of its nominal quota, and its room (see QuotaBook)
    quota: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # (queue, flavor, demand, over budget) -> what such a reservation does to the starving job's room
    effects: dict[tuple[str, str, int, bool], RoomEffect] = field(default_factory=dict)
    # The nominated preemptors waiting in the pass's group (libs/core/quota/nomination.py), and per
    # (preemptor, queue, flavor, demand, over budget) whether such a reservation would leave it without room.
    nominees: list[QuotaJob] = field(default_factory=list)
    nominee_effects: dict[tuple[str, str, str, int, bool], bool] = field(default_factory=dict)
    # A pass over one queue (its jobs are tried one after the other, nothing between them): then the jobs held
    # for the starving job in every flavor they had room in, by (queue, priority, demand, flavors, may borrow),
    # with the pass's `holds` count and the size of `no_borrowing` then: another job of that key with no runtime
    # limit, told so already, tried next, would be held the same way while neither changed (quota_pass.next_head).
    one_queue: bool = False
    held_for_starving: dict[tuple[str, int, int, tuple[str, ...], bool], tuple[int, int]] = field(
        default_factory=dict)
    holds: int = 0  # bumps whenever `held_below` grows
    backing_off: set[str] = field(default_factory=set)  # the queues with a job backing off
    cohort: str = ""  # the pass's cohort ("": a queue without one)
    reservations: int = 0  # how many the pass made so far

    def reserved(self) -> None:
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
