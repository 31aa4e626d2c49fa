"""Quota across queues: cohorts lending and borrowing idle quota, flavors, the fair order, per-user limits,
GPU-hour budgets, starvation reservations, and reclaim by the preemption decider.

Each table row is one small scenario written out in full. Unless a row says otherwise, the fair order sees
current usage only (half-life 0) and nothing starves (no starvation limit), so a row shows one rule alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts import (
    ClockTick,
    EventBase,
    FlavorQuota,
    JobCancelled,
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobStarted,
    NodeRegistered,
    PlacementDeferred,
    PreemptionDecided,
    QueuePolicyChanged,
    QueueSpec,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    ReplicaPlacement,
)
from libs.core.kernel.flavors import charged_flavor, reservation_model
from libs.core.kernel.queue_limits import Limits
from libs.core.kernel.quota_math import QuotaBook
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, Job, brief, kinds, node, of, pipeline, spec_of
from tests.unit.quota_builders import DAY, D, on, outcome, q, quota, reserved, run, settings, wait

# --- borrowing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("queues", "running", "gpus", "expected"), [
    pytest.param([q("a", 2), q("b", 4)], [], 5, ("reserved", 3, ""),
                 id="a queue in a cohort takes its peer's idle quota beyond its nominal, borrowing the excess"),
    pytest.param([q("a", 2), q("b", 4)], [], 2, ("reserved", 0, ""),
                 id="a job within its queue's nominal borrows nothing"),
    pytest.param([q("a", 2), q("b", 4)], [("a1", on("a", 1))], 3, ("reserved", 2, ""),
                 id="a job partly within nominal borrows only the part above it"),
    pytest.param([q("a", 2, borrowing_limit_gpus=1), q("b", 4)], [], 3, ("reserved", 1, ""),
                 id="a queue may borrow up to its borrowing limit"),
    pytest.param([q("a", 2, borrowing_limit_gpus=1), q("b", 4)], [], 4, ("deferred", "exceeds_queue_quota"),
                 id="its borrowing limit caps what it takes though the peer has more idle"),
    pytest.param([q("a", 2, borrowing_limit_gpus=0), q("b", 4)], [], 3, ("deferred", "exceeds_queue_quota"),
                 id="a borrowing limit of 0 forbids borrowing"),
    pytest.param([q("a", 2), q("b", 4)], [("b1", on("b", 4))], 3, ("deferred", "cohort_quota_exhausted"),
                 id="a peer's quota in use is not lent"),
    pytest.param([q("a", 2, cohort=""), q("b", 4, cohort="")], [], 3, ("deferred", "exceeds_queue_quota"),
                 id="without a cohort there is no borrowing"),
    pytest.param([q("a", 2, cohort="c1"), q("b", 4, cohort="c2")], [], 3, ("deferred", "exceeds_queue_quota"),
                 id="queues of different cohorts lend each other nothing"),
    pytest.param([QueueSpec(name="org", team="org"), q("a", 2, cohort="", parent="org"),
                  q("b", 4, cohort="", parent="org")], [], 5, ("reserved", 3, ""),
                 id="the children of a parent queue form a cohort"),
])
def test_borrowing(queues: list[QueueSpec], running: list[tuple[str, Job]], gpus: int,
                   expected: tuple[Any, ...]) -> None:
    feed = quota(*queues)
    run(feed, *running)
    assert outcome(feed.admit("j", on("a", gpus)), "j") == expected


# --- lending ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("lend", "gpus", "expected"), [
    pytest.param(None, 6, ("reserved", 4, ""), id="without a lending limit a peer lends all its idle nominal"),
    pytest.param(1, 3, ("reserved", 1, ""), id="a peer lends up to its lending limit"),
    pytest.param(1, 4, ("deferred", "exceeds_queue_quota"), id="its lending limit caps what a peer lends"),
    pytest.param(0, 3, ("deferred", "exceeds_queue_quota"), id="a queue with lending limit 0 lends nothing"),
])
def test_lending(lend: int | None, gpus: int, expected: tuple[Any, ...]) -> None:
    feed = quota(q("a", 2), q("b", 4, lending_limit_gpus=lend))
    assert outcome(feed.admit("j", on("a", gpus)), "j") == expected


@pytest.mark.parametrize(("gpus", "expected"), [
    pytest.param(3, ("reserved", 0, ""), id="its guaranteed part (nominal - lending limit) stays free for the owner"),
    pytest.param(4, ("deferred", "quota_lent_out"), id="only the lendable part is lent out"),
])
def test_the_guaranteed_part_stays_available_to_its_owner_when_others_borrow_all_that_is_lendable(
        gpus: int, expected: tuple[Any, ...]) -> None:
    feed = quota(q("a", 2), q("b", 4, lending_limit_gpus=1))
    assert outcome(feed.admit("greedy", on("a", 3)), "greedy") == ("reserved", 1, "")
    assert outcome(feed.admit("more", on("a", 1)), "more") == ("deferred", "queue_quota_exhausted")
    assert outcome(feed.admit("own", on("b", gpus)), "own") == expected


# --- flavors ------------------------------------------------------------------------------------------------

FLAVORED = QueueSpec(name="a", team="a", flavors=(FlavorQuota(model="H100", nominal_gpus=4),
                                                  FlavorQuota(model="A100", nominal_gpus=8)))


@pytest.mark.parametrize(("h100_held", "j", "expected"), [
    pytest.param(0, on("a", 2), ("reserved", 0, "H100"),
                 id="a job allowing any model takes the queue's first flavor"),
    pytest.param(0, on("a", 2).models("A100", "H100"), ("reserved", 0, "H100"),
                 id="a job allowing both models follows the queue's preference order, not its own"),
    pytest.param(4, on("a", 2), ("reserved", 0, "A100"),
                 id="once H100 is full a job allowing both models takes A100"),
    pytest.param(3, on("a", 2), ("reserved", 0, "A100"),
                 id="a job does not split across flavors: too little H100 left, all of it on A100"),
    pytest.param(0, on("a", 2).models("A100"), ("reserved", 0, "A100"),
                 id="a job allowing only A100 takes A100 while H100 is idle"),
    pytest.param(4, on("a", 1).models("H100"), ("deferred", "queue_quota_exhausted"),
                 id="a job allowing only H100 waits when H100 is full though A100 is idle"),
    pytest.param(0, on("a", 9).models("A100"), ("deferred", "exceeds_queue_quota"),
                 id="each flavor has its own nominal"),
])
def test_flavors(h100_held: int, j: Job, expected: tuple[Any, ...]) -> None:
    feed = quota(FLAVORED)
    if h100_held:
        run(feed, ("h", on("a", h100_held).models("H100")))
    assert outcome(feed.admit("j", j), "j") == expected


@pytest.mark.parametrize(("peer_model", "expected"), [
    pytest.param("H100", ("reserved", 2, "H100"), id="a peer's idle quota of the same model is lent"),
    pytest.param("A100", ("deferred", "exceeds_queue_quota"), id="a peer's idle quota of another model is not"),
])
def test_borrowing_is_per_flavor(peer_model: str, expected: tuple[Any, ...]) -> None:
    feed = quota(q("a", flavors=(FlavorQuota(model="H100", nominal_gpus=4),)),
                 q("b", flavors=(FlavorQuota(model=peer_model, nominal_gpus=4),)))
    assert outcome(feed.admit("j", on("a", 6).models("H100")), "j") == expected


# --- the fair order across a cohort ------------------------------------------------------------------------

def contest(feed: EventFeed, a_holds: int, b_holds: int) -> list[str]:
    """Queues a and b (nominal 2) hold `a_holds` and `b_holds`, l (nominal 6) the rest of the cohort's 10; a
    then b ask one GPU more each (both must borrow). One GPU of l frees: who gets it?"""
    run(feed, ("l1", on("l", 1)), ("l2", on("l", 10 - a_holds - b_holds - 1)), ("a1", on("a", a_holds)),
        ("b1", on("b", b_holds)))
    wait(feed, ("a-next", on("a", 1)), ("b-next", on("b", 1)))
    return reserved(feed.send(JobFinished, job_id="l1"))


@pytest.mark.parametrize(("a_weight", "a_holds", "b_holds", "first"), [
    pytest.param(1.0, 4, 3, "b-next", id="the queue using less of its nominal is served first"),
    pytest.param(1.0, 3, 4, "a-next", id="whichever queue that is"),
    pytest.param(1.0, 3, 3, "a-next", id="at equal usage the earlier job goes first"),
    pytest.param(2.0, 4, 3, "a-next", id="weight 2 doubles a queue's share: 4 of 2x2 is less than 3 of 2"),
])
def test_freed_quota_goes_to_the_queue_furthest_below_its_weighted_share(
        a_weight: float, a_holds: int, b_holds: int, first: str) -> None:
    feed = quota(q("a", 2, weight=a_weight), q("b", 2), q("l", 6))
    assert contest(feed, a_holds, b_holds) == [first]


@pytest.mark.parametrize(("half_life_s", "a_used_before", "first"), [
    pytest.param(3600.0, True, "b-next", id="a queue that used a lot in the last hours goes after one that did not"),
    pytest.param(3600.0, False, "a-next", id="without that past usage the earlier job goes first"),
    pytest.param(0.0, True, "a-next", id="with half-life 0 only current usage counts"),
])
def test_decayed_past_usage_counts_toward_fair_share(half_life_s: float, a_used_before: bool, first: str) -> None:
    feed = quota(q("a", 2), q("b", 2), q("l", 6), half_life_s=half_life_s, t0=D - 2 * 3600)
    if a_used_before:
        run(feed, ("a-past", on("a", 8)))  # two hours on 8 GPUs, ended now
    feed.at(D)
    if a_used_before:
        feed.send(JobFinished, job_id="a-past")
    assert contest(feed, 3, 3) == [first]


def test_a_job_within_its_queues_nominal_goes_before_one_that_must_borrow() -> None:
    # a has weight 4 (so the lower weighted usage) and its job came first, but it must borrow; b's fits b's
    # nominal once one GPU of l frees.
    feed = quota(q("a", 2, weight=4.0), q("b", 2), q("l", 2))
    run(feed, ("l1", on("l", 1)), ("l2", on("l", 1)), ("b1", on("b", 1)), ("a1", on("a", 2)), ("a2", on("a", 1)))
    wait(feed, ("a-next", on("a", 1)), ("b-next", on("b", 1)))
    decider = feed.deciders[0]
    assert isinstance(decider, QuotaDecider) and decider.fair_share("a", D) < decider.fair_share("b", D)
    assert reserved(feed.send(JobFinished, job_id="l1")) == ["b-next"]


# --- inside a queue -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("waiting", "first"), [
    pytest.param([("ann-next", "ann", "training"), ("bob-next", "bob", "training")], "bob-next",
                 id="the user holding fewer GPUs in the queue goes first though later"),
    pytest.param([("bob-next", "bob", "training"), ("dan-next", "dan", "training")], "dan-next",
                 id="a user holding nothing goes before one holding some"),
    pytest.param([("bob-next", "bob", "training"), ("ann-next", "ann", "urgent")], "ann-next",
                 id="priority comes before the users' holdings"),
    pytest.param([("bob-1", "bob", "training"), ("bob-2", "bob", "training")], "bob-1",
                 id="the same user: the earlier job"),
    pytest.param([("dan-1", "dan", "batch"), ("dan-2", "dan", "training")], "dan-2",
                 id="the same user: the higher priority though later"),
])
def test_inside_a_queue_priority_then_the_user_holding_least_then_arrival(
        waiting: list[tuple[str, str, str]], first: str) -> None:
    feed = quota(q("q", 4, cohort=""))
    run(feed, ("ann-run", on("q", 2, user="ann")), ("bob-run", on("q", 1, user="bob")),
        ("cid-run", on("q", 1, user="cid")))
    wait(feed, *[(job_id, on("q", 1, user=user).priority(prio)) for job_id, user, prio in waiting])
    assert reserved(feed.send(JobFinished, job_id="cid-run")) == [first]


# --- per-user limit -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("ann_holds", "gpus", "expected"), [
    pytest.param(2, 1, ("deferred", "user_limit"), id="a job beyond its user's limit waits"),
    pytest.param(1, 1, ("reserved", 0, ""), id="a job up to its user's limit goes"),
    pytest.param(0, 3, ("deferred", "user_limit"), id="a job larger than the limit by itself waits"),
])
def test_the_per_user_limit(ann_holds: int, gpus: int, expected: tuple[Any, ...]) -> None:
    feed = quota(q("q", 8, cohort="", user_max_gpus=2))
    if ann_holds:
        run(feed, ("ann-run", on("q", ann_holds, user="ann")))
    assert outcome(feed.admit("ann-next", on("q", gpus, user="ann")), "ann-next") == expected


def test_while_one_user_is_at_the_limit_another_users_job_goes_and_hers_goes_when_she_frees_gpus() -> None:
    feed = quota(q("q", 8, cohort="", user_max_gpus=2))
    run(feed, ("ann-run", on("q", 2, user="ann")))
    assert outcome(feed.admit("ann-next", on("q", 1, user="ann")), "ann-next") == ("deferred", "user_limit")
    assert outcome(feed.admit("bob-next", on("q", 2, user="bob")), "bob-next") == ("reserved", 0, "")
    assert reserved(feed.send(JobFinished, job_id="ann-run")) == ["ann-next"]


# --- GPU-hour budgets ---------------------------------------------------------------------------------------

def budget(over_budget: str, period: str = "day") -> QueueSpec:
    """Queue a: nominal 2, one GPU-hour per period."""
    return q("a", 2, budget_gpu_hours=1, budget_period=period, over_budget=over_budget)


def spend(feed: EventFeed) -> None:
    """Two GPUs running for half an hour from D: the budget is spent at D + 1800."""
    run(feed, ("spender", on("a", 2)))
    feed.send(JobStarted, job_id="spender")
    feed.at(D + 1800)
    feed.send(JobFinished, job_id="spender")


@pytest.mark.parametrize(("period", "still_spent", "next_period"), [
    pytest.param("day", D + DAY / 2, D + DAY, id="a daily budget opens again the next day"),
    pytest.param("week", D + DAY, D + 2 * DAY, id="a weekly budget opens again on Monday"),
    pytest.param("month", D + 19 * DAY, D + 20 * DAY, id="a monthly budget opens again on the 1st"),
])
def test_over_budget_wait_defers_until_a_new_period_opens_on_a_clock_tick(
        period: str, still_spent: float, next_period: float) -> None:
    feed = quota(budget("wait", period), q("l", 2))
    spend(feed)
    assert outcome(feed.admit("late", on("a", 1)), "late") == ("deferred", "budget_spent")
    assert outcome(feed.admit("also", on("a", 1)), "also") == ("deferred", "budget_spent")
    assert feed.at(still_spent).send(ClockTick) == []
    assert reserved(feed.at(next_period).send(ClockTick)) == ["late", "also"]


def test_a_budget_is_spent_by_running_jobs_before_they_end() -> None:
    feed = quota(budget("wait"))
    run(feed, ("long", on("a", 1)))
    feed.send(JobStarted, job_id="long")
    feed.at(D + 3599)
    assert outcome(feed.admit("before", on("a", 1)), "before") == ("reserved", 0, "")
    feed.send(JobStarted, job_id="before")
    feed.send(JobFinished, job_id="before")
    feed.at(D + 3600)  # long, still running, has used the GPU-hour by itself
    assert outcome(feed.admit("after", on("a", 1)), "after") == ("deferred", "budget_spent")


@pytest.mark.parametrize(("lender_busy", "gpus", "expected"), [
    pytest.param(0, 1, ("reserved", 1, ""), id="over budget a job runs on a peer's idle quota, all of it borrowed"),
    pytest.param(0, 2, ("reserved", 2, ""), id="as much as the peer has idle"),
    pytest.param(0, 3, ("deferred", "over_budget_waits_for_idle_quota"),
                 id="but no more: never on the queue's own idle nominal"),
    pytest.param(2, 1, ("deferred", "over_budget_waits_for_idle_quota"), id="nothing idle at the peer: it waits"),
])
def test_over_budget_borrow_runs_only_on_peers_idle_quota(lender_busy: int, gpus: int,
                                                          expected: tuple[Any, ...]) -> None:
    feed = quota(budget("borrow"), q("l", 2))
    spend(feed)
    if lender_busy:
        run(feed, ("l1", on("l", lender_busy)))
    decisions = feed.admit("over", on("a", gpus))
    assert outcome(decisions, "over") == expected
    assert all(d.over_budget for d in of(decisions, QuotaReserved))


def test_within_budget_jobs_are_not_marked_over_budget() -> None:
    feed = quota(budget("borrow"), q("l", 2))
    [first] = feed.admit("first", on("a", 2))
    assert isinstance(first, QuotaReserved) and not first.over_budget


def test_over_budget_jobs_together_take_no_more_than_peers_lend() -> None:
    feed = quota(budget("borrow"), q("l", 2))
    spend(feed)
    assert outcome(feed.admit("over1", on("a", 1)), "over1") == ("reserved", 1, "")
    # l lends 2 idle GPUs and over1 already runs on one of them: a 2-GPU job must wait.
    assert outcome(feed.admit("over2", on("a", 2)), "over2")[0] == "deferred"


def test_an_over_budget_job_that_cannot_run_does_not_stop_others_borrowing_its_queues_idle_quota() -> None:
    feed = quota(budget("borrow"), q("l", 2), q("m", 0))
    spend(feed)
    run(feed, ("l1", on("l", 2)))
    assert outcome(feed.admit("over", on("a", 1)), "over") == ("deferred", "over_budget_waits_for_idle_quota")
    # a's 2 GPUs are idle and lendable; m borrows them.
    assert outcome(feed.admit("m1", on("m", 2)), "m1") == ("reserved", 2, "")


# --- starvation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("after_s", "later", "expected"), [
    pytest.param(300, on("q", 1), ("reserved", 0, ""),
                 id="before the starvation limit a later smaller job simply goes"),
    pytest.param(700, on("q", 1), ("deferred", "held_for_starving_job"),
                 id="past the limit a later job of equal priority without a runtime is held for the big one"),
    pytest.param(700, on("q", 1, duration_s=3000), ("deferred", "held_for_starving_job"),
                 id="one that would end after the big job could start is held"),
    pytest.param(700, on("q", 1, max_runtime_s=1000), ("reserved", 0, ""),
                 id="one that ends before the big job could start backfills"),
    pytest.param(700, on("q", 1, duration_s=1000), ("deferred", "held_for_starving_job"),
                 id="one only estimated to end before the big job could start is held"),
    pytest.param(700, on("q", 1).priority("urgent"), ("reserved", 0, ""),
                 id="a job of higher priority is not held"),
])
def test_a_job_waiting_past_the_starvation_limit_is_not_overtaken(after_s: float, later: Job,
                                                                   expected: tuple[Any, ...]) -> None:
    # r1 holds 2 of q's 4 GPUs until D + 3600 (its declared runtime): the big job could start then.
    feed = quota(q("q", 4, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("q", 2, duration_s=3600)))
    wait(feed, ("big", on("q", 4)))
    feed.at(D + after_s)
    assert outcome(feed.admit("later", later), "later") == expected


def test_the_starving_job_gets_the_quota_it_was_held_for() -> None:
    feed = quota(q("q", 4, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("q", 2, duration_s=3600)))
    wait(feed, ("big", on("q", 4)))
    feed.at(D + 700)
    wait(feed, ("later", on("q", 1)))
    assert reserved(feed.at(D + 3600).send(JobFinished, job_id="r1")) == ["big"]


# --- no borrower grows while a queue under nominal waits for its lent quota --------------------------------


@pytest.mark.parametrize("b_waits", [
    pytest.param(False, id="with no queue waiting for lent quota a borrower takes freed quota"),
    pytest.param(True, id="while b waits for its lent quota the borrower does not grow"),
])
def test_no_borrower_grows_while_a_queue_under_its_nominal_waits_for_lent_quota(b_waits: bool) -> None:
    # a holds its nominal 2 and b's idle 2; l holds its 2. b (holding nothing) then wants its 2 back.
    feed = quota(q("a", 2), q("b", 2), q("l", 2))
    run(feed, ("l1", on("l", 1)), ("l2", on("l", 1)), ("a1", on("a", 2)), ("a2", on("a", 2)))
    if b_waits:
        assert outcome(feed.admit("b-next", on("b", 2)), "b-next") == ("deferred", "quota_lent_out")
    assert outcome(feed.admit("a-next", on("a", 1)), "a-next") == ("deferred", "cohort_quota_exhausted")
    # One GPU of l frees: too little for b's job, enough for a's.
    decisions = feed.send(JobFinished, job_id="l1")
    assert reserved(decisions) == ([] if b_waits else ["a-next"])


def test_a_new_borrower_job_is_not_reserved_while_a_lender_waits_for_its_lent_quota() -> None:
    feed = quota(q("lender", 6), q("borrower", 0))
    run(feed, ("b1", on("borrower", 1)))
    assert outcome(feed.admit("own", on("lender", 6)), "own") == ("deferred", "quota_lent_out")
    assert outcome(feed.admit("b2", on("borrower", 1)), "b2")[0] == "deferred"


# --- waiting jobs are re-considered when what held them back goes away -------------------------------------

def test_cancelling_the_job_that_held_others_back_lets_them_go() -> None:
    feed = quota(q("q", 4, cohort=""))
    run(feed, ("r", on("q", 2)))
    assert outcome(feed.admit("urgent", on("q", 4).priority("urgent")), "urgent") == (
        "deferred", "queue_quota_exhausted")
    assert outcome(feed.admit("batch", on("q", 1).priority("batch")), "batch") == (
        "deferred", "behind_higher_priority")
    assert reserved(feed.send(JobCancelled, job_id="urgent", reason="user_request")) == ["batch"]


def test_a_job_evicted_back_into_its_queue_is_told_why_it_waits() -> None:
    feed = quota(q("q", 4, cohort=""))
    run(feed, ("ann-1", on("q", 2, user="ann").priority("batch")), ("ann-2", on("q", 1, user="ann").priority("batch")),
        ("cid-1", on("q", 1, user="cid")))
    wait(feed, ("urgent", on("q", 4, user="dan").priority("urgent")),
         ("bob-1", on("q", 1, user="bob").priority("batch")))  # bob-1: behind_higher_priority
    decisions = feed.send(JobEvicted, job_id="ann-1", reason="preempted")
    # bob (holding nothing) comes before ann (holding 1) among batch jobs; bob-1 was told, ann-1 must be too.
    assert outcome(decisions, "ann-1") == ("deferred", "behind_higher_priority")


# --- reclaim (the whole pipeline: quota, placement, preemption) ---------------------------------------------

def cluster(*queues: QueueSpec, gpus: int = 12) -> EventFeed:
    feed = pipeline()
    settings(feed)
    feed.queues(*queues)
    feed.nodes(node("n1", 8), *([node("n2", gpus - 8)] if gpus > 8 else []))
    return feed


def start(feed: EventFeed, job_id: str, j: Job) -> None:
    assert kinds(feed.submit(job_id, j))[-1] == "JobPlaced", job_id


def b_switches_to_h100(feed: EventFeed) -> None:
    """Queue b's quota becomes quota of H100 GPUs, nominal 0 (it borrows whatever it holds)."""
    feed.send(QueuePolicyChanged, queue=q("b", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=0),)),
              version=3)


def victims(decisions: list[EventBase]) -> list[tuple[str, str, str, str]]:
    """(code, victim, its queue, reason) per PreemptionDecided."""
    return [(d.code, v.job_id, v.queue, v.reason) for d in of(decisions, PreemptionDecided) for v in d.victims]


@pytest.mark.parametrize(("b_priority", "l_priority", "gpus", "expected"), [
    pytest.param("batch", "training", 2, [("reclaim", "l4", "l", "reclaim")],
                 id="a queue under nominal reclaims the borrower's newest job, never the lower-priority jobs "
                    "of a queue within its nominal"),
    pytest.param("batch", "training", 4, [("reclaim", "l4", "l", "reclaim"), ("reclaim", "l3", "l", "reclaim")],
                 id="as many of the borrower's jobs as the preemptor needs"),
])
def test_reclaim_takes_quota_back_only_from_borrowing_queues(b_priority: str, l_priority: str, gpus: int,
                                                              expected: list[tuple[str, str, str, str]]) -> None:
    # a, b and l have 4 each of the cluster's 12 GPUs; b uses its 4, l its 4 and a's idle 4.
    feed = cluster(q("a", 4), q("b", 4), q("l", 4))
    for i in (1, 2):
        start(feed, f"b{i}", on("b", 2).priority(b_priority))
    for i in (1, 2, 3, 4):
        start(feed, f"l{i}", on("l", 2).priority(l_priority))
    decisions = feed.submit("a1", on("a", gpus))
    assert outcome(decisions, "a1") == ("deferred", "quota_lent_out")
    assert victims(decisions) == expected


def test_a_job_that_must_borrow_reclaims_nothing_reclaim_only_restores_nominal_quota() -> None:
    # a holds its nominal 4; l holds its 4 and b's idle 4. a's next job would have to borrow: l keeps its jobs.
    feed = cluster(q("a", 4), q("b", 4), q("l", 4))
    start(feed, "a1", on("a", 4).priority("urgent"))
    for i in (1, 2, 3, 4):
        start(feed, f"l{i}", on("l", 2).priority("batch"))
    decisions = feed.submit("a2", on("a", 2).priority("urgent"))
    assert outcome(decisions, "a2") == ("deferred", "cohort_quota_exhausted")
    assert victims(decisions) == []


@pytest.mark.parametrize(("grace_s", "ticks", "decided_at"), [
    pytest.param(0.0, [D + 60], D, id="without a grace reclaim starts at once"),
    pytest.param(300.0, [D + 100, D + 299, D + 300], D + 300, id="with a grace, not before it has passed"),
    pytest.param(300.0, [D + 100, D + 330], D + 330, id="a tick inside the minute after the grace triggers it"),
    pytest.param(300.0, [D + 100, D + 400], D + 400, id="so does a later tick when ticks are sparser than a minute"),
])
def test_reclaim_waits_for_the_queues_reclaim_grace(grace_s: float, ticks: list[float], decided_at: float) -> None:
    feed = cluster(q("a", 4, reclaim_after_s=grace_s), q("l", 4), gpus=8)
    feed.at(D - 60)
    for i in (1, 2, 3, 4):
        start(feed, f"l{i}", on("l", 2))
    feed.at(D)
    decided: list[float] = [d.ts for d in of(feed.submit("a1", on("a", 2)), PreemptionDecided)]
    for t in ticks:
        decided += [d.ts for d in of(feed.at(t).send(ClockTick), PreemptionDecided)]
    assert decided == [decided_at]


def test_once_reclaimed_the_preemptor_runs_and_the_borrowers_job_waits() -> None:
    feed = cluster(q("a", 4), q("l", 4), gpus=8)
    for i in (1, 2, 3, 4):
        start(feed, f"l{i}", on("l", 2))
    feed.submit("a1", on("a", 2))
    decisions = feed.send(JobEvicted, job_id="l4", reason="preempted")
    assert ("JobPlaced", "a1") in brief(decisions)
    assert not [d for d in of(decisions, JobPlaced) if d.job_id == "l4"]
    assert outcome(decisions, "l4")[0] == "deferred"


def test_an_over_budget_job_does_not_reclaim_quota_it_could_not_use() -> None:
    feed = cluster(budget("borrow"), q("l", 2), q("m", 0), gpus=8)
    start(feed, "spender", on("a", 2))
    feed.send(JobStarted, job_id="spender")
    feed.at(D + 1800)
    feed.send(JobFinished, job_id="spender")
    start(feed, "l1", on("l", 2))
    start(feed, "m1", on("m", 2))  # borrows a's idle 2
    decisions = feed.submit("over", on("a", 1))
    assert victims(decisions) == []


# --- quota lent to borrowers waiting for a place -----------------------------------------------------------

def unplaced_borrowers(code: str = "insufficient_gpus") -> EventFeed:
    """Queue a (nominal 2) lends it all to b (nominal 0): b1 then b2 borrow 1 each; placement places neither."""
    feed = quota(q("a", 2), q("b", 0))
    feed.send(NodeRegistered, node=node("n1", gpus=2))
    run(feed, ("b1", on("b", 1)), ("b2", on("b", 1)))
    for job_id in ("b1", "b2"):
        feed.send(PlacementDeferred, job_id=job_id, code=code, message="no node holds it")
    return feed


def test_an_unplaced_borrower_keeps_its_quota_until_its_placement_timeout() -> None:
    """Quota cannot know whether placement is placing the borrower right then (a reservation goes back only
    once placement lets its job go, asked at its placement timeout): the lender waits, no borrower grows, and
    the placement timeout asks the quota back."""
    feed = unplaced_borrowers()
    decisions = feed.admit("a1", on("a", 1))
    assert of(decisions, QuotaReleased) == []
    assert outcome(decisions, "a1") == ("deferred", "quota_lent_out")


def test_a_lender_told_its_quota_is_lent_out_hears_how_much_is_lent() -> None:
    feed = unplaced_borrowers()
    for job_id in ("b1", "b2"):
        feed.send(JobPlaced, job_id=job_id, placements=(
            ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000),))
    told = [d for d in of(feed.admit("a1", on("a", 1)), QuotaDeferred) if d.job_id == "a1"]
    assert [(d.code, d.shortfall_milli) for d in told] == [("quota_lent_out", 1000)]
    assert "2 GPUs of it are lent" in told[0].message


def test_a_placed_borrower_keeps_its_quota_for_a_reclaim_to_take() -> None:
    feed = unplaced_borrowers()
    for job_id in ("b1", "b2"):
        feed.send(JobPlaced, job_id=job_id, placements=(
            ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000),))
    decisions = feed.admit("a1", on("a", 1))
    assert of(decisions, QuotaReleased) == []
    assert outcome(decisions, "a1") == ("deferred", "quota_lent_out")


# --- usage follows the queue's current flavors --------------------------------------------------------------

@pytest.mark.parametrize(("flavor", "model", "limits", "expected"), [
    pytest.param("H100", "H100", ("H100", "A100"), "H100", id="a flavor the queue still has keeps its usage"),
    pytest.param("*", "H100", ("H100",), "H100", id="from any model to the flavor of the model it runs on"),
    pytest.param("H100", "H100", ("*",), "*", id="from a model's flavor to any model"),
    pytest.param("*", "", ("H100",), "*", id="a model unknown: no flavor of one model covers it, it stays"),
    pytest.param("A100", "A100", ("H100",), "A100", id="no flavor covers its model: it stays where it is"),
    pytest.param("A100", "A100", (), "A100", id="a queue without quota: it stays where it is"),
])
def test_a_reservation_is_charged_to_the_flavor_that_covers_its_model(flavor: str, model: str,
                                                                      limits: tuple[str, ...], expected: str) -> None:
    assert charged_flavor({f: Limits(nominal=1000, borrow=None, lend=1000) for f in limits}, flavor, model) == expected


def test_a_reservation_is_for_the_model_it_was_placed_on_else_its_flavors_else_the_one_its_job_asks() -> None:
    spec = spec_of(on("a", 1, gpu_models=("H100",)))
    assert reservation_model("*", "A100", spec) == "A100"
    assert reservation_model("H100", "", None) == "H100"
    assert reservation_model("*", "", spec) == "H100"
    assert reservation_model("*", "", spec_of(on("a", 1))) == ""


def test_a_queue_switched_from_any_model_to_a_models_flavor_borrows_what_its_running_job_holds() -> None:
    feed = quota(q("a", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)), q("b", 1))
    run(feed, ("b1", on("b", 1)))
    feed.send(JobPlaced, job_id="b1", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000, model="H100"),))
    b_switches_to_h100(feed)
    book = next(d for d in feed.deciders if isinstance(d, QuotaDecider)).state.book
    assert (book.usage("b", "*"), book.usage("b", "H100"), book.borrowed("b", "H100")) == (0, 1000, 1000)
    assert book.room("a", "H100") == 1000  # a lends the GPU b1 holds: a reclaim can take it back
    assert outcome(feed.admit("a1", on("a", 2)), "a1") == ("deferred", "quota_lent_out")


def test_a_reclaim_takes_back_what_a_queue_borrows_after_its_flavors_changed() -> None:
    feed = pipeline()
    settings(feed)
    feed.queues(q("a", cohort="c", reclaim_after_s=0, flavors=(FlavorQuota(model="H100", nominal_gpus=2),)),
                q("b", 1))
    feed.nodes(node("n1", 2, model="H100"))
    start(feed, "b1", on("b", 1))
    b_switches_to_h100(feed)
    assert victims(feed.submit("a1", on("a", 2))) == [("reclaim", "b1", "b", "reclaim")]
    assert ("JobPlaced", "a1") in brief(feed.send(JobEvicted, job_id="b1", reason="preempted"))


@pytest.mark.parametrize(("flavor", "placed_model", "expected"), [
    pytest.param("*", "H100", "H100", id="charged to a flavor its queue no longer has: to its placed model's"),
    pytest.param("H100", "H100", "H100", id="a flavor its queue still has keeps its usage"),
    pytest.param("*", "", "*", id="placed on no known model: it stays"),
    pytest.param("*", "A100", "*", id="no flavor covers its placed model: it stays where it is"),
])
def test_a_placed_reservation_charged_to_a_flavor_its_queue_no_longer_has_follows_its_placed_model(
        flavor: str, placed_model: str, expected: str) -> None:
    book = QuotaBook()
    book.set_queues([q("b", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=0),))])
    book.add("b", flavor, 1000)
    assert book.recharge_placed("b", flavor, placed_model, 1000) == expected
    assert book.usage("b", expected) == 1000


def test_an_any_model_reservation_switched_while_unplaced_is_charged_to_the_model_it_is_placed_on() -> None:
    feed = quota(q("a", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)), q("b", 1))
    run(feed, ("b1", on("b", 1)))
    b_switches_to_h100(feed)
    book = next(d for d in feed.deciders if isinstance(d, QuotaDecider)).state.book
    assert book.usage("b", "*") == 1000  # unplaced, any model: no model to charge it to yet
    feed.send(JobPlaced, job_id="b1", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000, model="H100"),))
    assert (book.usage("b", "*"), book.usage("b", "H100"), book.borrowed("b", "H100")) == (0, 1000, 1000)
    assert book.room("a", "H100") == 1000  # a lends the GPU b1 holds: a reclaim can take it back
    assert outcome(feed.admit("a1", on("a", 2)), "a1") == ("deferred", "quota_lent_out")


def test_a_reclaim_takes_back_what_a_borrower_switched_while_unplaced_holds_once_placed() -> None:
    feed = pipeline()
    settings(feed)
    feed.queues(q("a", cohort="c", reclaim_after_s=0, flavors=(FlavorQuota(model="H100", nominal_gpus=2),)),
                q("b", 1))
    feed.nodes(node("n1", 2, model="H100"))
    start(feed, "x", on("a", 2))
    assert "JobPlaced" not in kinds(feed.submit("b1", on("b", 1)))
    b_switches_to_h100(feed)
    assert ("JobPlaced", "b1") in brief(feed.send(JobFinished, job_id="x"))
    assert victims(feed.submit("a1", on("a", 2))) == [("reclaim", "b1", "b", "reclaim")]


def test_a_reservation_made_again_after_an_eviction_is_not_charged_by_the_model_its_last_run_had() -> None:
    feed = quota(q("a", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)), q("b", 1))
    run(feed, ("b1", on("b", 1)))
    feed.send(JobPlaced, job_id="b1", placements=(
        ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000, model="H100"),))
    assert reserved(feed.send(JobEvicted, job_id="b1", reason="node_pressure")) == ["b1"]  # back in line, again
    feed.send(QueuePolicyChanged, queue=q("b", cohort="c", flavors=(FlavorQuota(model="H100", nominal_gpus=0),
                                                                    FlavorQuota(model="A100", nominal_gpus=1))),
              version=3)
    book = next(d for d in feed.deciders if isinstance(d, QuotaDecider)).state.book
    assert (book.usage("b", "*"), book.usage("b", "H100")) == (1000, 0)  # unplaced: no model yet
    feed.send(JobPlaced, job_id="b1", placements=(
        ReplicaPlacement(replica=0, node="n2", gpu_indices=(0,), gpu_milli=1000, model="A100"),))
    assert (book.usage("b", "*"), book.usage("b", "A100")) == (0, 1000)
