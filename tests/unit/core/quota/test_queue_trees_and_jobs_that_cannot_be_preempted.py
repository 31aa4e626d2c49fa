"""What quota and preemption guarantee about a queue tree, jobs that cannot be preempted, eviction budgets and
the quota a preemption frees: a parent's quota bounds its subtree; a non-preemptible job never borrows (so a
lender always gets its quota back); a budget never shields a borrower from a reclaim; what victims free is held
for their preemptor until it is reserved. Each scenario is also judged by the guarantee checker.
"""

from __future__ import annotations

from contracts import (
    ClockTick,
    EventBase,
    FlavorQuota,
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobRejected,
    PreemptionDecided,
    QueueSpec,
    QuotaDeferred,
    QuotaReserved,
    Victim,
)
from libs.audit.guarantees import Violation, check, check_safety
from tests.unit.builders import EventFeed, node, of
from tests.unit.quota_builders import D, cluster, on, outcome, q, quota, reserved, run, wait


def logged(feed: EventFeed) -> list[tuple[int, EventBase]]:
    return list(enumerate(feed.log, start=1))


def broken(found: list[Violation]) -> set[str]:
    return {v.guarantee for v in found}


def settle(feed: EventFeed, until: float, every: float = 5.0) -> None:
    """Clock ticks up to `until`; the executor evicts every victim decided on the way."""
    while feed.now + every <= until:
        decided = of(feed.at(feed.now + every).send(ClockTick), PreemptionDecided)
        for d in decided:
            for v in d.victims:
                feed.send(JobEvicted, job_id=v.job_id, reason="preempted")


def placed(feed: EventFeed) -> set[str]:
    return {p.job_id for p in of(feed.log, JobPlaced)}


# --- 1. a parent's quota bounds its subtree -----------------------------------------------------------------

def tree(parent_nominal: int = 2) -> list[QueueSpec]:
    return [q("org", parent_nominal, cohort=""), q("a", 2, cohort="", parent="org"), q("b", 2, cohort="", parent="org")]


def test_two_children_of_nominal_2_under_a_parent_of_nominal_2_hold_2_gpus_together() -> None:
    feed = quota(*tree())
    run(feed, ("a1", on("a", 2)))
    decisions = feed.admit("b1", on("b", 1))
    assert outcome(decisions, "b1") == ("deferred", "parent_quota_exhausted")
    assert "leaves 0 GPUs" in of(decisions, QuotaDeferred)[0].message
    assert check_safety(logged(feed)) == []
    # What a1 gives back is the subtree's again.
    assert reserved(feed.send(JobFinished, job_id="a1")) == ["b1"]


def test_a_parent_without_quota_bounds_nothing() -> None:
    feed = quota(q("org", None, cohort=""), q("a", 2, cohort="", parent="org"), q("b", 2, cohort="", parent="org"))
    run(feed, ("a1", on("a", 2)), ("b1", on("b", 2)))
    assert check_safety(logged(feed)) == []


def test_a_parents_model_flavor_bounds_that_model_only() -> None:
    models = (FlavorQuota(model="H100", nominal_gpus=2), FlavorQuota(model="A100", nominal_gpus=2))
    feed = quota(q("org", cohort="", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)),
                 q("a", cohort="", parent="org", flavors=models), q("b", cohort="", parent="org", flavors=models))
    run(feed, ("a1", on("a", 2).models("H100")))
    assert outcome(feed.admit("b1", on("b", 1).models("H100")), "b1") == ("deferred", "parent_quota_exhausted")
    assert outcome(feed.admit("b2", on("b", 2).models("A100")), "b2") == ("reserved", 0, "A100")
    assert check_safety(logged(feed)) == []


def test_a_job_larger_than_its_parent_could_ever_hold_waits_until_the_parent_can() -> None:
    feed = cluster(*tree(parent_nominal=1))
    feed.nodes(node("n1", 8))
    decisions = feed.submit("a1", on("a", 2))
    assert not of(decisions, JobRejected) and outcome(decisions, "a1") == ("deferred", "exceeds_queue_quota")
    settle(feed, D + 30)
    assert check(logged(feed), liveness=True) == []
    feed.queues(q("org", 2, cohort=""))
    assert placed(feed) == {"a1"}


def test_a_child_waiting_for_its_parents_quota_held_within_nominal_is_owed_no_reclaim() -> None:
    feed = cluster(*tree())
    feed.nodes(node("n1", 8))
    feed.submit("a1", on("a", 2))
    assert outcome(feed.submit("b1", on("b", 1)), "b1") == ("deferred", "parent_quota_exhausted")
    settle(feed, D + 400)
    assert placed(feed) == {"a1"}
    assert check(logged(feed), liveness=True) == []


# --- 2. a job that cannot be preempted never borrows ------------------------------------------------------

def test_a_non_preemptible_job_uses_only_its_queues_nominal_quota() -> None:
    feed = quota(q("l", 4), q("b", 2))
    run(feed, ("b1", on("b", 2).priority("production-inference")))
    # A preemptible job may borrow the idle quota...
    assert outcome(feed.admit("training", on("b", 2).priority("training")), "training") == ("reserved", 2, "")
    # ...one that cannot be preempted may not.
    decisions = feed.admit("inference", on("b", 2).priority("production-inference"))
    assert outcome(decisions, "inference") == ("deferred", "nominal_quota_only")
    assert "never borrows" in of(decisions, QuotaDeferred)[0].message


def test_a_non_preemptible_job_larger_than_its_queues_nominal_waits_until_its_nominal_can_hold_it() -> None:
    feed = cluster(q("l", 4), q("b", 2))
    feed.nodes(node("n1", 8))
    decisions = feed.submit("big", on("b", 3).priority("production-inference"))
    assert not of(decisions, JobRejected) and outcome(decisions, "big") == ("deferred", "exceeds_queue_quota")
    assert "cannot be preempted" in of(decisions, QuotaDeferred)[-1].message
    feed.queues(q("b", 3))
    assert placed(feed) == {"big"}


def test_a_lender_gets_its_quota_back_from_a_queue_whose_inference_would_have_borrowed_it() -> None:
    feed = cluster(q("l", 4), q("b", 2))
    feed.nodes(node("n1", 8))
    feed.submit("b1", on("b", 2).priority("production-inference"))
    feed.submit("b3", on("b", 2).priority("training"))  # borrows, and may be preempted
    feed.submit("b2", on("b", 2).priority("production-inference"))  # would borrow: waits
    assert placed(feed) == {"b1", "b3"}
    decided = of(feed.at(D + 10).submit("l1", on("l", 4)), PreemptionDecided)
    assert [(d.preemptor_id, [v.job_id for v in d.victims]) for d in decided] == [("l1", ["b3"])]
    for v in decided[0].victims:
        feed.send(JobEvicted, job_id=v.job_id, reason="preempted")
    settle(feed, D + 300)
    assert "l1" in placed(feed)
    assert check(logged(feed), liveness=True) == []


# --- 3. an eviction budget never shields a borrower from a reclaim ----------------------------------------

def test_a_budget_of_zero_does_not_shield_a_borrower_from_a_reclaim() -> None:
    feed = cluster(q("l", 4), q("b", 0, eviction_budget_gpus=0, eviction_window_s=600.0))
    feed.nodes(node("n1", 4))
    feed.submit("b1", on("b", 2).priority("batch"))
    decided = of(feed.at(D + 10).submit("l1", on("l", 4)), PreemptionDecided)
    assert [v.job_id for d in decided for v in d.victims] == ["b1"]
    feed.send(JobEvicted, job_id="b1", reason="preempted")
    settle(feed, D + 300)
    assert "l1" in placed(feed)
    assert check(logged(feed), liveness=True) == []


def test_a_budget_still_caps_evictions_for_priority_and_a_reclaim_does_not_spend_it() -> None:
    feed = cluster(q("l", 2), q("b", 4, eviction_budget_gpus=2, eviction_window_s=600.0))
    feed.nodes(node("n1", 6))
    for job_id in ("b1", "b2", "b3"):
        feed.submit(job_id, on("b", 2).priority("batch"))  # b3 borrows l's idle 2
    reclaim = of(feed.at(D + 10).submit("l1", on("l", 2)), PreemptionDecided)
    assert [v.job_id for d in reclaim for v in d.victims] == ["b3"]
    feed.send(JobEvicted, job_id="b3", reason="preempted")
    # The reclaim spent none of b's budget: its urgent job may still evict 2 GPUs of its own batch work...
    first = of(feed.at(D + 20).submit("u1", on("b", 2).priority("urgent")), PreemptionDecided)
    assert len([v for d in first for v in d.victims]) == 1
    for d in first:
        for v in d.victims:
            feed.send(JobEvicted, job_id=v.job_id, reason="preempted")
    # ...and no more in the window.
    assert of(feed.at(D + 30).submit("u2", on("b", 2).priority("urgent")), PreemptionDecided) == []


# --- 4. what a preemption frees is held for its preemptor -------------------------------------------------

def victims_chosen(feed: EventFeed, preemptor: str, *victims: tuple[str, str, int]) -> list[EventBase]:
    return feed.send(PreemptionDecided, preemptor_id=preemptor, code="reclaim", victims=tuple(
        Victim(job_id=v, queue=queue, priority=100, gpu_milli=gpus * 1000, reason="reclaim")
        for v, queue, gpus in victims))


def test_a_job_of_the_preemptors_priority_first_in_its_queues_order_does_not_take_the_freed_quota() -> None:
    """ann's job preempted low; bob, holding nothing, comes before ann among jobs of their priority."""
    feed = quota(q("t", 4, cohort=""))
    run(feed, ("ann1", on("t", 1, user="ann").priority("training")), ("low", on("t", 3).priority("batch")))
    wait(feed, ("ann2", on("t", 3, user="ann").priority("training")))
    feed.send(PreemptionDecided, preemptor_id="ann2", code="within_queue_priority", victims=(
        Victim(job_id="low", queue="t", priority=100, gpu_milli=3000, reason="within_queue_priority"),))
    wait(feed, ("bob1", on("t", 3, user="bob").priority("training")))
    decisions = feed.send(JobEvicted, job_id="low", reason="preempted")
    assert reserved(decisions) == ["ann2"]


def partial_release() -> EventFeed:
    """l (nominal 4) and o (nominal 4) lend all; b borrows 6 with three 2-GPU jobs and o holds 2. l1 (4) had b1
    and b2 chosen as its victims; o2 (2, within o's nominal) arrives afterwards."""
    feed = quota(q("l", 4), q("o", 4), q("b", 0))
    run(feed, ("b1", on("b", 2)), ("b2", on("b", 2)), ("b3", on("b", 2)), ("o1", on("o", 2)))
    wait(feed, ("l1", on("l", 4)))
    victims_chosen(feed, "l1", ("b1", "b", 2), ("b2", "b", 2))
    wait(feed, ("o2", on("o", 2)))
    return feed


def test_another_entitled_queue_does_not_take_the_room_a_victim_leaving_first_frees() -> None:
    feed = partial_release()
    first = feed.send(JobEvicted, job_id="b1", reason="preempted")
    assert reserved(first) == []
    assert outcome(first, "o2") == ("deferred", "held_for_preemptor")
    assert reserved(feed.send(JobEvicted, job_id="b2", reason="preempted")) == ["l1"]


def test_the_hold_lapses_with_the_nomination() -> None:
    feed = partial_release()
    feed.send(JobEvicted, job_id="b1", reason="preempted")
    assert reserved(feed.at(D + 100).send(ClockTick)) == []
    decisions = feed.at(D + 121).send(ClockTick)
    assert reserved(decisions) == ["o2"]
    assert of(decisions, QuotaReserved)[0].borrowed_milli == 0


def test_a_job_of_a_flavor_the_preemptor_cannot_use_is_not_held() -> None:
    both = (FlavorQuota(model="A100", nominal_gpus=4), FlavorQuota(model="H100", nominal_gpus=4))
    feed = quota(q("l", flavors=both), q("o", flavors=both),
                 q("b", flavors=(FlavorQuota(model="A100", nominal_gpus=0),)))
    run(feed, ("b1", on("b", 4).models("A100")), ("o1", on("o", 4).models("A100")))
    wait(feed, ("l1", on("l", 4).models("A100")))
    victims_chosen(feed, "l1", ("b1", "b", 4))
    assert outcome(feed.admit("o2", on("o", 2).models("H100")), "o2") == ("reserved", 0, "H100")
