"""The checker's flavor_fungibility: a reservation that took a flavor while one its queue's flavor fungibility
tries first had room for the job (when_can_borrow try-next-flavor: a flavor it need not borrow in; borrow: the
queue's order) is reported; the reservation the rule makes, or one a hold of the deciders explains, is not."""

from __future__ import annotations

import pytest

from contracts import FlavorQuota, JobFinished, QueueSpec, QuotaReleased, QuotaReserved
from libs.audit.guarantees import check_liveness
from tests.unit.audit.test_guarantee_checker import Log, ids, on, spec
from tests.unit.builders import node


def cohort(when_can_borrow: str, a_a100: int = 2) -> Log:
    """Cohort x: queue a (A100: `a_a100` GPUs, H100: 2 GPUs) and an idle lender l (A100: 2 GPUs); a0 runs 2
    A100 GPUs of a."""
    log = Log().nodes(node("a", gpus=4, model="A100"), node("h", gpus=2, model="H100"))
    flavors = (FlavorQuota(model="A100", nominal_gpus=a_a100), FlavorQuota(model="H100", nominal_gpus=2))
    log.queues(QueueSpec(name="a", team="a", cohort="x", when_can_borrow=when_can_borrow, flavors=flavors),
               QueueSpec(name="l", team="l", cohort="x", flavors=(FlavorQuota(model="A100", nominal_gpus=2),)))
    return log.reserved("a0", spec("a", gpus=2, gpu_models=("A100",)), flavor="A100").placed("a0", on("a", 0, 1))


@pytest.mark.parametrize("when_can_borrow, flavor, broken", [
    ("try-next-flavor", "A100", True),  # borrowed A100 while its own H100 quota held it
    ("try-next-flavor", "H100", False),
    ("borrow", "A100", False),  # the first flavor with room, borrowed
    ("borrow", "H100", True),  # passed over A100, where it could borrow
])
def test_a_reservation_past_a_flavor_tried_first_with_room_breaks_flavor_fungibility(
        when_can_borrow: str, flavor: str, broken: bool) -> None:
    log = cohort(when_can_borrow)
    borrowed = 2000 if flavor == "A100" else 0
    log.at(1_010.0).reserved("a1", spec("a", gpus=2), flavor=flavor, borrowed_milli=borrowed)
    found = check_liveness(log.events)
    assert ids(found) == ({"flavor_fungibility"} if broken else set())
    if broken:
        assert found[0].jobs == ("a1",) and f"took flavor {flavor}" in found[0].detail


def test_a_job_of_higher_priority_waiting_first_explains_the_flavor_passed_over() -> None:
    # urgent (4 GPUs) waits for a's quota: it holds a1 back in the flavors it could use, so a1's choice is not
    # judged against a flavor it may have been kept from.
    log = cohort("try-next-flavor")
    log.admitted("urgent", spec("a", gpus=4, priority="urgent"))
    log.at(1_010.0).reserved("a1", spec("a", gpus=2), flavor="A100", borrowed_milli=2000)
    assert "flavor_fungibility" not in ids(check_liveness(log.events))


@pytest.mark.parametrize("release_known, broken", [(False, False), (True, True)])
def test_a_release_logged_after_the_trigger_by_another_reaction_leaves_the_choice_unjudged(
        release_known: bool, broken: bool) -> None:
    # h0 holds a's H100 quota when a1's admission triggers quota; h0's quota comes back before a1's reservation
    # is logged. Released by another reaction (h0's finish), it came too late for the decider to know: a1
    # borrowing A100 is not judged. Released in the same reaction as the reservation, the decider knew it.
    log = cohort("try-next-flavor")
    log.reserved("h0", spec("a", gpus=2, gpu_models=("H100",)), flavor="H100").placed("h0", on("h", 0, 1))
    log.at(1_010.0).admitted("a1", spec("a", gpus=2))
    trigger = len(log.events)
    log.add(JobFinished, source="sim-executor", job_id="h0")
    log.add(QuotaReleased, source="quota", job_id="h0", queue="a", gpu_milli=2000, reason="finished",
            trigger_seq=trigger if release_known else len(log.events))
    log.add(QuotaReserved, source="quota", job_id="a1", queue="a", gpu_milli=2000, flavor="A100",
            borrowed_milli=2000, trigger_seq=trigger)
    assert ids(check_liveness(log.events)) == ({"flavor_fungibility"} if broken else set())
