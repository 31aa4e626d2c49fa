"""What quota guarantees when the situation changes under a waiting job: a starving job holds only the room
it could use, a job its queue can no longer hold blocks nobody, borrowing stops only in the flavor a lender
waits for, budgets pay for GPU run time alone, and a reservation no node can hold goes back to the queue.

Each test is one small scenario that once went wrong. Unless a test says otherwise the fair order sees
current usage only (half-life 0) and nothing starves.
"""

from __future__ import annotations

import pytest

from contracts import (
    ClockTick,
    EventBase,
    FlavorQuota,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobStarted,
    NodeCordoned,
    PlacementDeferred,
    QuotaDeferred,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
    SchedulingSettings,
    SchedulingSettingsChanged,
)
from contracts.views import JobView, QueueView
from libs.core.kernel.starvation import UNKNOWN_START, Starving, backfills, holds
from libs.core.kernel.wait_reasons import RESERVATION_RETURNED
from libs.core.quota.decider import QuotaDecider
from libs.views.explain import explain
from tests.unit.builders import EventFeed, kinds, node, of
from tests.unit.quota_builders import D, cluster, on, outcome, q, quota, reserved, run, wait

A100_H100 = (FlavorQuota(model="H100", nominal_gpus=2), FlavorQuota(model="A100", nominal_gpus=8))


def decider(feed: EventFeed) -> QuotaDecider:
    return next(d for d in feed.deciders if isinstance(d, QuotaDecider))


# --- the one starvation rule ------------------------------------------------------------------------------

@pytest.mark.parametrize(("priority", "duration_s", "takes", "leaves", "expected"), [
    pytest.param(500, None, True, False, True, id="a job taking room the starving job needs is held"),
    pytest.param(800, None, True, False, False, id="a job of higher priority is never held"),
    pytest.param(500, 100.0, True, False, False, id="a job ending before the starving job could start backfills"),
    pytest.param(500, 5000.0, True, False, True, id="a job ending after that is held"),
    pytest.param(500, None, False, False, False, id="a job taking room the starving job cannot use is not held"),
    pytest.param(500, None, True, True, False, id="a job leaving the starving job its room is not held"),
])
def test_the_starvation_rule(priority: int, duration_s: float | None, takes: bool, leaves: bool,
                             expected: bool) -> None:
    starving = Starving(job_id="big", priority=500, shadow=1000.0)
    assert holds(starving, "other", priority, duration_s, 0.0, lambda: (takes, leaves)) is expected


def test_no_job_backfills_before_an_unknown_start() -> None:
    assert not backfills(1.0, 0.0, UNKNOWN_START)
    assert holds(Starving(job_id="big", priority=500, shadow=UNKNOWN_START), "other", 500, 1.0, 0.0,
                 lambda: (True, False))


# --- 1. quota: a starving job holds only the quota it could use -------------------------------------------

def starving_borrower(c_lends: int = 2, c_nominal: int = 4, a_borrows: int | None = None) -> EventFeed:
    """Queue a (nominal 2) runs a1 (2 GPUs, until D + 3600); its big job needs 4, 2 of them borrowed from c's
    lendable quota; at D + 700 big starves."""
    feed = quota(q("a", 2, borrowing_limit_gpus=a_borrows), q("c", c_nominal, lending_limit_gpus=c_lends), q("d", 0),
                 starvation_after_s=600)
    run(feed, ("a1", on("a", 2, duration_s=3600)))
    wait(feed, ("big", on("a", 4)))
    feed.at(D + 700)
    return feed


def test_a_starving_job_does_not_hold_a_job_inside_its_own_queues_non_lendable_quota() -> None:
    feed = starving_borrower()
    assert outcome(feed.admit("c1", on("c", 2)), "c1") == ("reserved", 0, "")


def test_a_starving_borrower_does_not_hold_another_queue_within_its_own_nominal_quota() -> None:
    feed = starving_borrower()
    assert outcome(feed.admit("c1", on("c", 4)), "c1") == ("reserved", 0, "")


def test_a_borrower_taking_the_quota_the_starving_job_borrows_is_held() -> None:
    feed = starving_borrower()
    assert outcome(feed.admit("d1", on("d", 1)), "d1") == ("deferred", "held_for_starving_job")


def test_a_borrower_that_leaves_the_starving_job_its_room_is_not_held() -> None:
    # a may borrow 2 at most, and c lends 4: at D + 3600 big's 4 fit beside d1's borrowed GPU.
    feed = starving_borrower(c_lends=4, c_nominal=6, a_borrows=2)
    assert outcome(feed.admit("d1", on("d", 1)), "d1") == ("reserved", 1, "")


def test_a_starving_job_holds_a_job_of_its_own_queue_that_would_take_its_room() -> None:
    feed = starving_borrower()
    assert outcome(feed.admit("a2", on("a", 1)), "a2") == ("deferred", "held_for_starving_job")


def test_a_job_held_in_one_flavor_takes_another_the_starving_job_cannot_use() -> None:
    feed = quota(q("a", cohort="", flavors=(FlavorQuota(model="H100", nominal_gpus=4),
                                            FlavorQuota(model="A100", nominal_gpus=4))), starvation_after_s=600)
    run(feed, ("r1", on("a", 2).models("H100")))
    wait(feed, ("big", on("a", 4).models("H100")))
    feed.at(D + 700)
    assert outcome(feed.admit("any", on("a", 1)), "any") == ("reserved", 0, "A100")


# --- 1. placement: the same rule -------------------------------------------------------------------------

def test_placement_never_holds_for_a_starving_job_no_node_could_ever_hold() -> None:
    feed = cluster(q("a", None, cohort=""), starvation_after_s=600, placement_timeout_s=None)
    feed.nodes(node("n1", 8), node("n2", 4))
    assert kinds(feed.submit("r1", on("a", 4)))[-1] == "JobPlaced"  # on n1: big must wait for it
    assert kinds(feed.submit("big", on("a", 8)))[-1] == "PlacementDeferred"
    feed.send(NodeCordoned, node="n1")  # now no node could ever hold big
    feed.at(D + 700).send(ClockTick)
    assert kinds(feed.submit("small", on("a", 1)))[-1] == "JobPlaced"


def test_placement_does_not_hold_a_job_on_a_node_too_small_for_the_starving_job() -> None:
    feed = cluster(q("a", None, cohort=""), starvation_after_s=600, placement_timeout_s=None)
    feed.nodes(node("n1", 8), node("n2", 2))
    assert kinds(feed.submit("r1", on("a", 4)))[-1] == "JobPlaced"
    assert kinds(feed.submit("big", on("a", 8)))[-1] == "PlacementDeferred"
    feed.at(D + 700).send(ClockTick)  # big starves; only n1 could ever hold it
    placed = of(feed.submit("small", on("a", 2)), JobPlaced)
    assert [p.node for d in placed for p in d.placements] == ["n2"]


def test_placement_still_holds_a_job_that_would_take_the_starving_jobs_node() -> None:
    feed = cluster(q("a", None, cohort=""), starvation_after_s=600, placement_timeout_s=None)
    feed.nodes(node("n1", 8))
    assert kinds(feed.submit("r1", on("a", 4)))[-1] == "JobPlaced"
    assert kinds(feed.submit("big", on("a", 8)))[-1] == "PlacementDeferred"
    feed.at(D + 700).send(ClockTick)
    assert outcome_of_placement(feed.submit("small", on("a", 1)), "small") == "held_for_starving_job"


def test_a_job_placement_holds_capacity_for_keeps_its_quota_past_the_placement_timeout() -> None:
    feed = cluster(q("a", 16, cohort=""), starvation_after_s=600)
    feed.nodes(node("n1", 8))
    assert kinds(feed.submit("r1", on("a", 4, duration_s=5000)))[-1] == "JobPlaced"
    assert kinds(feed.at(D).submit("big", on("a", 8)))[-1] == "PlacementDeferred"
    # Not placed in 300 s: its quota goes back; after its backoff it gets it again, its wait going on.
    assert [r.job_id for r in of(feed.at(D + 300).send(ClockTick), QuotaReleased)] == ["big"]
    feed.send(JobFinished, job_id="r1")
    assert kinds(feed.submit("r2", on("a", 4, duration_s=5000)))[-1] == "JobPlaced"
    assert reserved(feed.at(D + 360).send(ClockTick)) == ["big"]
    # Waiting for capacity since D, it starves at D + 600: capacity is held for it, and it keeps its quota.
    told = of(feed.at(D + 600).send(ClockTick), PlacementDeferred)
    assert [(d.job_id, d.code) for d in told] == [("big", "capacity_held_for_it")]
    assert of(feed.at(D + 1000).send(ClockTick), QuotaReleased) == []


def test_a_starving_job_no_node_can_hold_any_more_is_told_so_and_gives_its_quota_back() -> None:
    feed = cluster(q("a", 16, cohort=""), starvation_after_s=600)
    feed.nodes(node("n1", 8), node("n2", 4))
    assert kinds(feed.submit("r1", on("a", 4, duration_s=5000)))[-1] == "JobPlaced"  # on n2, best fit
    assert kinds(feed.submit("r2", on("a", 4, duration_s=5000)))[-1] == "JobPlaced"
    assert kinds(feed.submit("big", on("a", 8)))[-1] == "PlacementDeferred"
    feed.at(D + 300).send(ClockTick)
    feed.at(D + 360).send(ClockTick)
    assert [d.code for d in of(feed.at(D + 600).send(ClockTick), PlacementDeferred)] == ["capacity_held_for_it"]
    feed.send(NodeCordoned, node="n1")  # now no node could ever hold big
    told = [d.code for d in of(feed.at(D + 700).send(ClockTick), PlacementDeferred) if d.job_id == "big"]
    assert told and told[0] != "capacity_held_for_it"
    assert [r.job_id for r in of(feed.at(D + 701).send(ClockTick), QuotaReleased)] == ["big"]


def outcome_of_placement(decisions: list[object], job_id: str) -> str:
    mine = [d for d in decisions if isinstance(d, PlacementDeferred | JobPlaced) and d.job_id == job_id]
    last = mine[-1]
    return "placed" if isinstance(last, JobPlaced) else last.code


# --- 2. a job its queue can no longer hold blocks nobody ---------------------------------------------------

def test_a_head_that_a_lowered_quota_can_never_hold_is_told_so_and_blocks_nobody() -> None:
    feed = quota(q("a", 8, cohort=""))
    run(feed, ("r1", on("a", 2)))
    wait(feed, ("big", on("a", 8).priority("urgent")))
    assert outcome(feed.admit("small", on("a", 1).priority("batch")), "small") == (
        "deferred", "behind_higher_priority")
    decisions = feed.queues(q("a", 6, cohort=""))
    assert outcome(decisions, "big") == ("deferred", "exceeds_queue_quota")
    assert reserved(decisions) == ["small"]
    # It waits without holding anything: a later job of lower priority goes at once...
    assert outcome(feed.admit("later", on("a", 1).priority("batch")), "later") == ("reserved", 0, "")
    # ...and once the queue may hold it again, it is served.
    feed.send(JobFinished, job_id="r1")
    feed.send(JobFinished, job_id="small")
    feed.send(JobFinished, job_id="later")
    assert reserved(feed.queues(q("a", 8, cohort=""))) == ["big"]


def test_a_head_whose_flavor_was_removed_blocks_nobody() -> None:
    feed = quota(q("a", cohort="", flavors=(FlavorQuota(model="H100", nominal_gpus=4),)))
    run(feed, ("r1", on("a", 2).models("H100")))
    wait(feed, ("big", on("a", 4).models("H100").priority("urgent")))
    wait(feed, ("small", on("a", 1).priority("batch")))
    decisions = feed.queues(q("a", cohort="", flavors=(FlavorQuota(model="A100", nominal_gpus=4),)))
    assert outcome(decisions, "big") == ("deferred", "no_quota_for_models")
    assert outcome(decisions, "small") == ("reserved", 0, "A100")


def test_a_job_its_queue_can_never_hold_does_not_starve_anyone() -> None:
    feed = quota(q("a", 8, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("a", 2)))
    wait(feed, ("big", on("a", 8)))
    feed.queues(q("a", 6, cohort=""))
    feed.at(D + 700)
    assert outcome(feed.admit("small", on("a", 1)), "small") == ("reserved", 0, "")


# --- 3. borrowing stops only in the flavor a lender waits for ----------------------------------------------

def test_a_lender_waiting_for_a100_quota_does_not_stop_borrowing_of_idle_h100() -> None:
    feed = quota(q("lender", flavors=(FlavorQuota(model="A100", nominal_gpus=2),
                                      FlavorQuota(model="H100", nominal_gpus=2))),
                 q("borrower", flavors=(FlavorQuota(model="A100", nominal_gpus=0),
                                        FlavorQuota(model="H100", nominal_gpus=0))),
                 q("spare", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)))
    run(feed, ("ba", on("borrower", 2).models("A100")), ("bh", on("borrower", 3).models("H100")))
    assert outcome(feed.admit("own", on("lender", 2).models("A100")), "own") == ("deferred", "quota_lent_out")
    # The lender waits for A100 only: the last idle H100 may still be borrowed.
    assert outcome(feed.admit("b2", on("borrower", 1).models("H100")), "b2") == ("reserved", 1, "H100")


def test_a_lender_waiting_only_on_its_own_user_limit_does_not_stop_borrowing() -> None:
    feed = quota(q("lender", 4, user_max_gpus=2), q("borrower", 0), q("spare", 2))
    run(feed, ("ann1", on("lender", 2, user="ann")), ("b1", on("borrower", 2)), ("s1", on("spare", 1)))
    assert outcome(feed.admit("ann2", on("lender", 2, user="ann")), "ann2") == ("deferred", "user_limit")
    assert outcome(feed.admit("b2", on("borrower", 1)), "b2") == ("reserved", 1, "")


def test_a_lender_whose_waiting_job_could_use_the_flavor_still_stops_borrowing() -> None:
    feed = quota(q("lender", 4), q("borrower", 0), q("spare", 2))
    run(feed, ("l1", on("lender", 2)), ("b1", on("borrower", 2)), ("s1", on("spare", 1)))
    assert outcome(feed.admit("l2", on("lender", 2)), "l2") == ("deferred", "quota_lent_out")
    assert outcome(feed.admit("b2", on("borrower", 1)), "b2")[0] == "deferred"


def test_a_higher_job_waiting_for_h100_does_not_hold_back_an_a100_job_of_its_queue() -> None:
    feed = quota(q("a", cohort="", flavors=A100_H100))
    run(feed, ("h1", on("a", 2).models("H100")))
    wait(feed, ("urgent", on("a", 2).models("H100").priority("urgent")))
    assert outcome(feed.admit("a100", on("a", 1).models("A100").priority("batch")), "a100") == (
        "reserved", 0, "A100")
    # A job of any model is held only in H100, the flavor the urgent job waits for.
    assert outcome(feed.admit("any", on("a", 1).priority("batch")), "any") == ("reserved", 0, "A100")


def test_a_lower_job_asking_only_for_the_awaited_flavor_is_still_held() -> None:
    feed = quota(q("a", cohort="", flavors=A100_H100))
    run(feed, ("h1", on("a", 1).models("H100")))
    wait(feed, ("urgent", on("a", 2).models("H100").priority("urgent")))
    assert outcome(feed.admit("h100", on("a", 1).models("H100").priority("batch")), "h100") == (
        "deferred", "behind_higher_priority")


# --- 4. budgets pay for GPU run time -----------------------------------------------------------------------

def budget_feed() -> EventFeed:
    return quota(q("a", 4, cohort="", budget_gpu_hours=1, budget_period="day", over_budget="wait"))


def test_a_job_that_never_ran_spends_no_budget() -> None:
    feed = budget_feed()
    run(feed, ("waits", on("a", 3)))
    feed.at(D + 3 * 3600)
    assert decider(feed).state.budget_left_s("a", D + 3 * 3600) == 3600.0
    assert outcome(feed.admit("next", on("a", 1)), "next") == ("reserved", 0, "")


def test_a_budget_pays_for_the_time_a_job_ran() -> None:
    feed = budget_feed()
    run(feed, ("j", on("a", 2)))
    feed.at(D + 600).send(JobStarted, job_id="j")
    assert decider(feed).state.budget_left_s("a", D + 1200) == 3600.0 - 2 * 600
    feed.at(D + 1800).send(JobFinished, job_id="j")
    assert decider(feed).state.budget_left_s("a", D + 7200) == 3600.0 - 2 * 1200


def test_a_mig_instance_spends_its_share_of_a_gpu() -> None:
    feed = budget_feed()
    run(feed, ("mig", on("a", 1, mig_profile="1g.10gb")))
    feed.send(JobPlaced, job_id="mig", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=142, mig_slices=1, model="A100"),))
    feed.send(JobStarted, job_id="mig")
    feed.at(D + 3600).send(JobFinished, job_id="mig")
    assert decider(feed).state.budget_left_s("a", D + 3600) == pytest.approx(3600.0 - 0.142 * 3600)


def test_a_spent_budget_still_makes_jobs_wait() -> None:
    feed = budget_feed()
    run(feed, ("j", on("a", 2)))
    feed.send(JobStarted, job_id="j")
    feed.at(D + 1800)
    assert outcome(feed.admit("late", on("a", 1)), "late") == ("deferred", "budget_spent")


# --- 5. a reservation no node can hold goes back to its queue -----------------------------------------------

def unplaceable(timeout_s: float | None = 300.0) -> EventFeed:
    """Queue a (nominal 4): big holds all 4 from D, and placement cannot place it; small (1) waits."""
    feed = quota(q("a", 4, cohort=""))
    feed.send(SchedulingSettingsChanged, version=2, settings=SchedulingSettings(
        fair_share_half_life_s=0.0, starvation_after_s=None, placement_timeout_s=timeout_s))
    run(feed, ("big", on("a", 4)))
    wait(feed, ("small", on("a", 1)))
    feed.at(D + 1).send(PlacementDeferred, job_id="big", code="fragmentation", message="no node holds it")
    return feed


def let_go(feed: EventFeed, job_id: str) -> list[EventBase]:
    """Placement's answer to quota asking the job's reservation back: it let the job go."""
    return feed.send(PlacementDeferred, job_id=job_id, code=RESERVATION_RETURNED, message="let go")


def test_a_reservation_no_node_holds_is_asked_back_at_the_placement_timeout_and_goes_back_once_let_go() -> None:
    feed = unplaceable()
    assert feed.at(D + 299).send(ClockTick) == []
    asked = feed.at(D + 300).send(ClockTick)
    assert [(r.job_id, r.reason) for r in of(asked, QuotaRecalled)] == [("big", "placement_timeout")]
    assert of(asked, QuotaReleased) == [] and reserved(asked) == []
    assert of(feed.at(D + 305).send(ClockTick), QuotaRecalled) == []  # asked once
    decisions = let_go(feed, "big")
    assert [(r.job_id, r.reason) for r in of(decisions, QuotaReleased)] == [("big", "placement_timeout")]
    assert reserved(decisions) == ["small"]
    assert outcome(decisions, "big") == ("deferred", "placement_timed_out")


def test_a_job_that_gave_its_quota_back_waits_out_a_growing_backoff() -> None:
    feed = unplaceable()
    feed.at(D + 300).send(ClockTick)
    let_go(feed, "big")
    feed.send(JobFinished, job_id="small")
    assert reserved(feed.at(D + 359).send(ClockTick)) == []
    assert reserved(feed.at(D + 360).send(ClockTick)) == ["big"]
    feed.at(D + 361).send(PlacementDeferred, job_id="big", code="fragmentation", message="no node holds it")
    assert [r.job_id for r in of(feed.at(D + 660).send(ClockTick), QuotaRecalled)] == ["big"]
    assert [r.job_id for r in of(let_go(feed, "big"), QuotaReleased)] == ["big"]
    # The second time it waits twice as long.
    assert reserved(feed.at(D + 779).send(ClockTick)) == []
    assert reserved(feed.at(D + 780).send(ClockTick)) == ["big"]


def test_a_placed_job_keeps_its_quota() -> None:
    feed = unplaceable()
    feed.at(D + 200).send(JobPlaced, job_id="big", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0, 1, 2, 3), gpu_milli=1000, model="A100"),))
    assert of(feed.at(D + 600).send(ClockTick), QuotaRecalled) == []


def test_without_a_placement_timeout_a_reservation_is_kept() -> None:
    feed = unplaceable(timeout_s=None)
    assert of(feed.at(D + 10_000).send(ClockTick), QuotaRecalled) == []


def test_a_job_placed_before_placement_read_the_ask_keeps_its_quota_and_nobody_took_it() -> None:
    """Quota and placement react to the same tick: placement may place the job as quota asks its reservation
    back. Placed first, the job keeps its quota; the quota was never free meanwhile, so small still waits."""
    feed = unplaceable()
    assert [r.job_id for r in of(feed.at(D + 300).send(ClockTick), QuotaRecalled)] == ["big"]
    decisions = feed.send(JobPlaced, job_id="big", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0, 1, 2, 3), gpu_milli=1000, model="A100"),))
    assert of(decisions, QuotaReleased) == [] and of(decisions, QuotaReserved) == []
    assert decider(feed).state.queue_used["a"] == 4000
    assert of(feed.at(D + 600).send(ClockTick), QuotaRecalled) == []


def test_placement_forgets_a_job_whose_quota_went_back() -> None:
    feed = cluster(q("a", 12, cohort=""))
    feed.nodes(node("n1", 4), node("n2", 4))
    assert kinds(feed.submit("r1", on("a", 3)))[-1] == "JobPlaced"
    assert kinds(feed.submit("r2", on("a", 3)))[-1] == "JobPlaced"  # one GPU free on each node
    assert kinds(feed.submit("big", on("a", 4)))[-1] == "PlacementDeferred"
    released = of(feed.at(D + 300).send(ClockTick), QuotaReleased)
    assert [r.job_id for r in released] == ["big"]
    # r1's node frees while big backs off: big is not placed without quota...
    assert of(feed.at(D + 310).send(JobFinished, job_id="r1"), JobPlaced) == []
    # ...but once its backoff ends it gets its quota, and then its node.
    decisions = feed.at(D + 360).send(ClockTick)
    assert reserved(decisions) == ["big"]
    assert [d.job_id for d in of(decisions, JobPlaced)] == ["big"]


def test_the_deferral_after_a_timeout_says_when_the_job_runs_again() -> None:
    feed = unplaceable()
    feed.at(D + 300).send(ClockTick)
    told = [d for d in of(let_go(feed, "big"), QuotaDeferred) if d.job_id == "big"]
    assert "60 s from now" in told[0].message


# --- what "why pending" says about these -------------------------------------------------------------------

def pending(reason: str, gpus: int = 8, phase: str = "admitted") -> JobView:
    return JobView(id="p", state="pending", team="ml", queue="ml", spec=JobSpec(team="ml", queue="ml", gpus=gpus),
                   phase=phase, reason=reason, message=f"{reason} message")


EXPLAIN_QUEUE = QueueView(name="ml", team="ml", nominal_gpus=6, reserved_gpus=2.0)


def test_a_job_its_queue_can_never_hold_is_told_only_a_quota_change_unblocks_it() -> None:
    answer = explain(pending("exceeds_queue_quota"), EXPLAIN_QUEUE, [], [], [], D)
    assert [r.code for r in answer.reasons] == ["queue_ceiling"]
    assert answer.unblock == ["raise queue ml's quota (nominal, borrowing limit, or what its cohort lends: a "
                              "peer's lending limit, a queue joining the cohort) so that it can hold 8 GPUs; until "
                              "then it waits without holding back other jobs"]
    assert answer.estimated_start is None


def test_a_job_whose_reservation_timed_out_is_not_promised_gpus() -> None:
    answer = explain(pending("placement_timed_out"), EXPLAIN_QUEUE, [], [], [], D)
    assert [r.code for r in answer.reasons] == ["placement_timeout"]
    assert len(answer.unblock) == 1 and "GPU more" not in answer.unblock[0]
