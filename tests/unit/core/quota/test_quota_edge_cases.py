"""Edge cases of quota, the quota book, preemption, placement's starvation hold, the ledger's quota mirror
and the quota audit, each a minimal scenario that once went wrong: budgets renewing on a tick, flavors and
skipping, the users' round robin, priority class changes, borrowing per flavor, starvation with evictions,
user limits, unknown shadows, impossible jobs and other flavors, lending attribution, reclaim graces and
order, and decisions logged after later inputs.

Unless a test says otherwise the fair order sees current usage only (half-life 0) and nothing starves.
"""

from __future__ import annotations

from contracts import (
    ClockTick,
    EventBase,
    FlavorQuota,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFinished,
    JobStarted,
    JobSubmitted,
    PreemptionDecided,
    PriorityClass,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    QuotaDeferred,
    QuotaReserved,
)
from libs.audit.quota_audit import quota_violations
from libs.core.accounting.ledger import Ledger
from libs.core.kernel.decider import run_decider
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, Job, kinds, node, of, spec_of
from tests.unit.quota_builders import DAY, D, cluster, on, outcome, q, quota, reserved, run, wait


def budget_queue(name: str = "a") -> QueueSpec:
    """Nominal 2, one GPU-hour a day; once spent, further jobs only borrow peers' idle quota."""
    return q(name, 2, budget_gpu_hours=1, budget_period="day", over_budget="borrow")


# --- quota: budgets ----------------------------------------------------------------------------------------

def test_an_over_budget_job_is_reserved_on_the_tick_that_opens_a_new_budget_period() -> None:
    feed = quota(budget_queue(), q("l", 2))
    run(feed, ("spender", on("a", 2)))
    feed.send(JobStarted, job_id="spender")
    feed.at(D + 1800).send(JobFinished, job_id="spender")  # the day's GPU-hour is spent
    run(feed, ("l1", on("l", 2)))  # the peer lends nothing
    assert outcome(feed.admit("over", on("a", 1)), "over") == ("deferred", "over_budget_waits_for_idle_quota")
    assert reserved(feed.at(D + DAY).send(ClockTick)) == ["over"]


def test_a_queue_without_quota_over_budget_takes_free_capacity_no_quota_claims() -> None:
    # Owed nothing and holding no one's quota, it runs on as within budget: over budget (preemptible whatever its
    # class), borrowing from no cohort, rather than waiting for idle quota lent by a cohort it does not have.
    feed = quota(q("a", cohort="", budget_gpu_hours=1, budget_period="day", over_budget="borrow"), q("l", 2))
    run(feed, ("spender", on("a", 2)))
    feed.send(JobStarted, job_id="spender")
    feed.at(D + 1800).send(JobFinished, job_id="spender")  # the day's GPU-hour is spent
    decisions = feed.admit("over", on("a", 1))
    assert outcome(decisions, "over") == ("reserved", 0, "")
    assert [d.over_budget for d in of(decisions, QuotaReserved)] == [True]


# --- quota: the order inside a queue -----------------------------------------------------------------------

def test_skip_level_does_not_skip_a_job_that_asks_for_another_flavor() -> None:
    feed = quota(q("a", cohort="", flavors=(FlavorQuota(model="H100", nominal_gpus=2),
                                            FlavorQuota(model="A100", nominal_gpus=2))))
    run(feed, ("hh", on("a", 2).models("H100")), ("ha", on("a", 2).models("A100")))
    wait(feed, ("h1", on("a", 2).models("H100")), ("h2", on("a", 2).models("H100")),
         ("a1", on("a", 2).models("A100")))
    # Without h2 (so no skip_level) a1 is reserved here.
    assert reserved(feed.send(JobFinished, job_id="ha")) == ["a1"]


def test_a_users_job_that_did_not_get_quota_does_not_count_as_held_in_the_round_robin() -> None:
    feed = quota(q("q", 4, cohort=""))
    run(feed, ("bob-run", on("q", 2, user="bob")), ("cid-run", on("q", 1, user="cid")),
        ("dan-run", on("q", 1, user="dan")))
    wait(feed, ("ann-big", on("q", 4, user="ann")), ("ann-small", on("q", 1, user="ann")),
         ("bob-next", on("q", 1, user="bob")))
    assert reserved(feed.send(JobFinished, job_id="cid-run")) == ["ann-small"]


def test_waiting_jobs_are_ordered_by_the_current_priority_classes() -> None:
    feed = quota(q("q", 4, cohort=""))
    run(feed, ("r", on("q", 4)))
    wait(feed, ("t", on("q", 4).priority("training")), ("b", on("q", 4).priority("batch")))
    classes = tuple(PriorityClass(name=c.name, value=900 if c.name == "batch" else c.value,
                                  preemptible=c.preemptible) for c in DEFAULT_PRIORITY_CLASSES)
    feed.send(PriorityClassesChanged, classes=classes, version=2)
    assert reserved(feed.send(JobFinished, job_id="r")) == ["b"]


# --- quota: no borrower grows while a queue under nominal waits --------------------------------------------

def test_waiting_for_lent_quota_of_one_flavor_does_not_stop_borrowing_of_another() -> None:
    feed = quota(q("a", flavors=(FlavorQuota(model="A100", nominal_gpus=2),)),
                 q("b", flavors=(FlavorQuota(model="A100", nominal_gpus=0), FlavorQuota(model="H100", nominal_gpus=0))),
                 q("l", flavors=(FlavorQuota(model="H100", nominal_gpus=2),)))
    run(feed, ("b1", on("b", 2).models("A100")))  # borrows a's A100
    assert outcome(feed.admit("a1", on("a", 2).models("A100")), "a1") == ("deferred", "quota_lent_out")
    # Without a1 waiting, b2 borrows l's idle H100 at once.
    assert outcome(feed.admit("b2", on("b", 1).models("H100")), "b2") == ("reserved", 1, "H100")


def test_an_over_budget_job_does_not_borrow_while_a_queue_under_nominal_waits_for_lent_quota() -> None:
    feed = quota(budget_queue(), q("b", 2), q("l", 2))
    run(feed, ("a1", on("a", 2)), ("l1", on("l", 1)), ("l2", on("l", 1)), ("l3", on("l", 2)))  # l borrows b's 2
    feed.send(JobStarted, job_id="a1")
    feed.at(D + 1800)  # a1 has spent a's GPU-hour by now
    assert outcome(feed.admit("b1", on("b", 2)), "b1") == ("deferred", "quota_lent_out")
    assert outcome(feed.admit("a-over", on("a", 1)), "a-over") == ("deferred", "over_budget_waits_for_idle_quota")
    assert reserved(feed.send(JobFinished, job_id="l1")) == []


# --- quota: starvation -------------------------------------------------------------------------------------

def test_an_evicted_job_does_not_hide_a_starving_job() -> None:
    feed = quota(q("q", 4, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("q", 2, duration_s=3600)), ("e", on("q", 1)))
    wait(feed, ("big", on("q", 4)))
    feed.at(D + 700)
    assert outcome(feed.send(JobEvicted, job_id="e", reason="node_lost"), "e") == (
        "deferred", "held_for_starving_job")


def test_an_old_job_waiting_at_its_user_limit_does_not_switch_starvation_protection_off() -> None:
    feed = quota(q("q", 6, cohort="", user_max_gpus=3), starvation_after_s=600)
    run(feed, ("ann-run", on("q", 3, user="ann")), ("bob-run", on("q", 2, user="bob")))
    assert outcome(feed.admit("ann-next", on("q", 1, user="ann")), "ann-next") == ("deferred", "user_limit")
    wait(feed, ("big", on("q", 3, user="cid")))
    feed.at(D + 700)
    # Without ann-next, dan's job is held for big.
    assert outcome(feed.admit("dan", on("q", 1, user="dan")), "dan") == ("deferred", "held_for_starving_job")


def test_no_backfill_when_the_starving_jobs_start_is_unknown() -> None:
    feed = quota(q("q", 4, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("q", 2)))  # no declared runtime: nobody knows when big could start
    wait(feed, ("big", on("q", 4)))
    feed.at(D + 700)
    assert outcome(feed.admit("long", on("q", 1, duration_s=1_000_000)), "long") == (
        "deferred", "held_for_starving_job")


def test_a_starving_job_that_can_never_fit_does_not_block_its_queue_forever() -> None:
    feed = quota(q("q", 4, cohort=""), starvation_after_s=600)
    run(feed, ("r1", on("q", 2)))
    wait(feed, ("big", on("q", 4)))
    feed.queues(q("q", 3, cohort=""))  # big can never fit any more
    feed.at(D + 700)
    # big can never fit: nothing is held for it, small goes at once.
    assert reserved(feed.admit("small", on("q", 1))) == ["small"]


def test_a_job_of_another_flavor_is_not_held_for_a_starving_job() -> None:
    feed = quota(q("a", cohort="", flavors=(FlavorQuota(model="H100", nominal_gpus=4),
                                            FlavorQuota(model="A100", nominal_gpus=4))), starvation_after_s=600)
    run(feed, ("r1", on("a", 2).models("H100")))
    wait(feed, ("big", on("a", 4).models("H100")))
    feed.at(D + 700)
    assert outcome(feed.admit("other", on("a", 1).models("A100")), "other") == ("reserved", 0, "A100")


# --- placement: the starvation hold -----------------------------------------------------------------------

def test_placement_does_not_hold_a_job_that_cannot_delay_the_starving_job() -> None:
    feed = cluster(q("a", None, cohort=""), starvation_after_s=600)
    feed.nodes(node("n1", 8), node("n2", 2, "L4"))
    assert kinds(feed.submit("r1", on("a", 4).models("A100")))[-1] == "JobPlaced"
    assert kinds(feed.submit("big", on("a", 8).models("A100")))[-1] == "PlacementDeferred"
    feed.at(D + 700).send(ClockTick)  # big now starves
    assert kinds(feed.submit("small", on("a", 1).models("L4")))[-1] == "JobPlaced"


# --- quota book ---------------------------------------------------------------------------------------------

def test_an_over_budget_queue_is_not_shown_lending_what_it_borrows() -> None:
    ledger = Ledger()
    feed = quota(budget_queue(), q("l", 2), ledger=ledger)
    run(feed, ("spender", on("a", 2)))
    feed.send(JobStarted, job_id="spender")
    feed.at(D + 1800).send(JobFinished, job_id="spender")
    assert outcome(feed.admit("over", on("a", 1)), "over") == ("reserved", 1, "")
    lent = {name: ledger.queue_view(name).flavors[0].lent_gpus for name in ("a", "l")}
    assert lent == {"a": 0.0, "l": 1.0}


# --- preemption --------------------------------------------------------------------------------------------

def test_the_tick_that_ends_a_reclaim_grace_reclaims_for_the_job_it_ended_for() -> None:
    feed = cluster(q("a", 4, reclaim_after_s=300.0), q("l", 4))
    feed.nodes(node("n1", 8))
    feed.at(D - 60)
    for i in (1, 2, 3, 4):
        assert kinds(feed.submit(f"l{i}", on("l", 2)))[-1] == "JobPlaced"  # l borrows a's 4
    feed.at(D)
    assert outcome(feed.submit("a-big", on("a", 6)), "a-big") == ("deferred", "cohort_quota_exhausted")
    assert outcome(feed.submit("a-small", on("a", 2)), "a-small") == ("deferred", "quota_lent_out")
    decided = of(feed.at(D + 300).send(ClockTick), PreemptionDecided)
    assert [d.preemptor_id for d in decided] == ["a-small"]


def test_reclaim_evicts_borrowers_before_the_preemptors_own_jobs() -> None:
    feed = cluster(q("a", 4), q("l", 4))
    feed.nodes(node("n1", 8))
    feed.at(D - 60)
    assert kinds(feed.submit("own", on("a", 2).priority("batch")))[-1] == "JobPlaced"
    for i in (1, 2, 3):
        assert kinds(feed.submit(f"l{i}", on("l", 2).priority("batch")))[-1] == "JobPlaced"  # l borrows 2
    feed.at(D)
    decisions = feed.submit("p", on("a", 2))
    assert outcome(decisions, "p") == ("deferred", "quota_lent_out")
    assert [(d.code, [v.queue for v in d.victims]) for d in of(decisions, PreemptionDecided)] == [("reclaim", ["l"])]


def test_a_deferral_logged_after_the_cancellation_leaves_no_waiting_job_behind() -> None:
    feed = EventFeed(PreemptionDecider(), t0=D)
    feed.queues(q("a", 4, cohort=""))
    feed.send(JobSubmitted, job_id="x", spec=spec_of(on("a", 1)))
    feed.send(JobCancelled, job_id="x", reason="user_request")
    feed.send(QuotaDeferred, job_id="x", queue="a", code="queue_quota_exhausted", message="")
    decider = feed.deciders[0]
    assert isinstance(decider, PreemptionDecider)
    assert decider.state.waiting == {}
    assert not any(decider.state.waiting_priorities.values())


# --- the ledger's quota mirror and the audit: decisions land after later inputs -------------------------

def admitted_then_reserved(spec_queue: QueueSpec, j: Job) -> tuple[QuotaDecider, list[EventBase], list[EventBase]]:
    """A live quota decider fed a queue policy and one admission; its inputs and its decisions."""
    decider = QuotaDecider()
    inputs: list[EventBase] = [
        QueuePolicyChanged(id="p1", ts=D, source="operator", version=1, queue=spec_queue),
        JobSubmitted(id="s", ts=D, source="admission", job_id="x", spec=spec_of(j)),
        JobAdmitted(id="ad", ts=D, source="admission", job_id="x", queue=spec_of(j).queue)]
    decided = [e for seq, ev in enumerate(inputs, 1) for e in run_decider(decider, ev, seq)]
    assert kinds(decided) == ["QuotaReserved"]
    return decider, inputs, decided


def test_the_ledger_folds_a_reservation_logged_after_the_jobs_cancellation() -> None:
    decider, inputs, decided = admitted_then_reserved(q("a", 4, cohort=""), on("a", 1))
    cancel = JobCancelled(id="c", ts=D + 1, source="admission", job_id="x", reason="user_request")
    released = run_decider(decider, cancel, 5)
    assert kinds(released) == ["QuotaReleased"]
    ledger = Ledger()
    for seq, ev in enumerate([*inputs, cancel, *decided, *released], 1):  # as a batching quota service logs it
        ledger.fold(ev, seq)
    assert ledger.queue_view("a").reserved_gpus == 0.0


def test_the_audit_judges_a_reservation_by_the_policy_it_was_decided_under() -> None:
    _, inputs, decided = admitted_then_reserved(q("a", 4, cohort=""), on("a", 4))
    lowered = QueuePolicyChanged(id="p2", ts=D, source="operator", version=2, queue=q("a", 2, cohort=""))
    assert quota_violations([*inputs, lowered, *decided]) == []
