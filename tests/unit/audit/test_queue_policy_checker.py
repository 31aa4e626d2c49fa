"""The checker's queue_policy: a preemption decision whose victim its preemptor's queue's setting does not allow
(within_queue_preemption, reclaim_within_cohort, borrow_within_cohort with its threshold), and a reservation past
the flavor its queue's when_can_preempt makes the job wait at, are each reported under queue_policy; the same
decisions the setting allows report nothing."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import FlavorQuota, PreemptionDecided, QueueSpec, Victim
from libs.audit.guarantees import Violation, check_safety
from tests.unit.audit.test_guarantee_checker import Log, ids, on, spec
from tests.unit.builders import node


def preempt(log: Log, preemptor: str, *victims: tuple[str, str, int, str]) -> list[Violation]:
    """Log the preemptor's decision evicting (job, queue, priority, reason) victims; the safety violations."""
    log.add(PreemptionDecided, source="preemption", preemptor_id=preemptor, code=victims[0][3],
            victims=tuple(Victim(job_id=j, queue=q, priority=p, gpu_milli=1000, reason=r) for j, q, p, r in victims))
    return check_safety(log.events)


def one_queue(**settings: Any) -> Log:
    """Queue q (2 GPUs) running low (batch) at 1000 s and same (training) at 1010 s; p (training) submitted at
    1005 s, between them."""
    log = Log().nodes(node("n", gpus=2)).queues(QueueSpec(name="q", team="q", nominal_gpus=2, **settings))
    log.running("low", spec(priority="batch"), on("n", 0))
    log.at(1_005.0).admitted("p", spec(priority="training"))
    log.at(1_010.0).running("same", spec(priority="training"), on("n", 1))
    return log


@pytest.mark.parametrize("setting, victim, broken", [
    ("never", ("low", "q", 100), True),
    ("lower-priority", ("low", "q", 100), False),
    ("lower-priority", ("same", "q", 500), True),
    ("lower-or-newer-equal-priority", ("same", "q", 500), False),
])
def test_a_victim_of_its_own_queue_the_setting_does_not_allow_breaks_queue_policy(
        setting: str, victim: tuple[str, str, int], broken: bool) -> None:
    found = preempt(one_queue(within_queue_preemption=setting), "p", (*victim, "within_queue_priority"))
    assert ids(found) == ({"queue_policy"} if broken else set())
    if broken:
        assert found[0].jobs == ("p", victim[0]) and f"within_queue_preemption '{setting}'" in found[0].detail


def test_an_older_job_of_its_priority_is_no_victim_of_lower_or_newer_equal_priority() -> None:
    log = one_queue(within_queue_preemption="lower-or-newer-equal-priority")
    log.at(1_020.0).admitted("late", spec(priority="training"))
    assert ids(preempt(log, "late", ("same", "q", 500, "within_queue_priority"))) == {"queue_policy"}


def cohort(a: dict[str, Any], *borrowers: tuple[str, str]) -> Log:
    """Queues a (1 GPU) and b (nominal 0) of cohort c and an idle lender l (3 GPUs); each borrower (job,
    class) runs 1 GPU in b."""
    log = Log().nodes(node("n", gpus=4))
    log.queues(QueueSpec(name="a", team="a", nominal_gpus=1, cohort="c", **a),
               QueueSpec(name="b", team="b", nominal_gpus=0, cohort="c"),
               QueueSpec(name="l", team="l", nominal_gpus=3, cohort="c"))
    for i, (job, cls) in enumerate(borrowers):
        log.running(job, spec("b", priority=cls), on("n", i))
    return log


@pytest.mark.parametrize("setting, victim_priority, broken", [
    ("any", 800, False), ("lower-priority", 100, False), ("lower-priority", 800, True), ("never", 100, True)])
def test_a_reclaim_victim_the_setting_does_not_allow_breaks_queue_policy(setting: str, victim_priority: int,
                                                                         broken: bool) -> None:
    log = cohort({"reclaim_within_cohort": setting}, ("b1", "urgent" if victim_priority == 800 else "batch"))
    log.admitted("p", spec("a", priority="training"))
    found = preempt(log, "p", ("b1", "b", victim_priority, "reclaim"))
    assert ids(found) == ({"queue_policy"} if broken else set())


@pytest.mark.parametrize("settings, victim_priority, broken", [
    ({}, 100, True),  # never, the default: a borrowing preemptor evicts in its own queue only
    ({"borrow_within_cohort": "lower-priority"}, 100, False),
    ({"borrow_within_cohort": "lower-priority"}, 500, True),  # of its own priority
    ({"borrow_within_cohort": "lower-priority", "borrow_within_cohort_max_priority": 300}, 100, False),
    ({"borrow_within_cohort": "lower-priority", "borrow_within_cohort_max_priority": 50}, 100, True),
])
def test_a_borrowing_preemptor_against_borrow_within_cohort_breaks_queue_policy(
        settings: dict[str, Any], victim_priority: int, broken: bool) -> None:
    log = cohort(settings, ("b1", "batch" if victim_priority == 100 else "training"))
    log.admitted("p", spec("a", gpus=3, priority="training"))
    found = preempt(log, "p", ("b1", "b", victim_priority, "borrow_within_cohort"))
    assert ids(found) == ({"queue_policy"} if broken else set())
    if broken:
        assert "borrow_within_cohort" in found[0].detail


@pytest.mark.parametrize("when_can_preempt, reclaim, holder_priority, broken", [
    ("preempt", "any", "training", True),
    ("try-next-flavor", "any", "training", False),
    # Its reclaim may take only borrowers of lower priority than p1 (training): none would serve it at A100...
    ("preempt", "lower-priority", "training", False),
    # ...but d1 of batch it may take.
    ("preempt", "lower-priority", "batch", True),
])
def test_a_reservation_past_the_flavor_its_job_waits_at_breaks_queue_policy(
        when_can_preempt: str, reclaim: str, holder_priority: str, broken: bool) -> None:
    # p's A100 quota is lent to d: with when_can_preempt preempt, p1 waits there for a reclaim, not on H100.
    log = Log().nodes(node("a", gpus=2, model="A100"), node("h", gpus=2, model="H100"))
    two = (FlavorQuota(model="A100", nominal_gpus=2), FlavorQuota(model="H100", nominal_gpus=2))
    log.queues(QueueSpec(name="p", team="p", cohort="x", when_can_preempt=when_can_preempt,
                         reclaim_within_cohort=reclaim, flavors=two),
               QueueSpec(name="d", team="d", cohort="x", flavors=(FlavorQuota(model="A100", nominal_gpus=0),)))
    log.reserved("d1", spec("d", gpus=2, priority=holder_priority), flavor="A100").placed("d1", on("a", 0, 1))
    log.reserved("p1", spec("p", gpus=2), flavor="H100")
    found = check_safety(log.events)
    assert ids(found) == ({"queue_policy"} if broken else set())
    if broken:
        assert found[0].jobs == ("p1",) and "past flavor A100" in found[0].detail
