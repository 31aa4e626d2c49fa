"""The guarantee checker across policy changes, placement timeouts and late executor reports: a lending limit
lowered (or a cohort joined) while quota is lent binds later borrowing only; a job whose quota went back after
a placement timeout waits for quota, judged by quota's reason, and keeps its wait for a place toward
starvation; a report about a run that is over releases nothing of the job's current run."""

from __future__ import annotations

from contracts import (
    FlavorQuota,
    JobEvicted,
    JobFinished,
    PlacementDeferred,
    QueuePolicyChanged,
    QueueSpec,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettings,
    SchedulingSettingsChanged,
)
from libs.audit.guarantees import check_liveness, check_safety
from tests.unit.audit.test_guarantee_checker import Log, ids, on, spec
from tests.unit.builders import node


def _h100(nominal: int, lend: int | None = None) -> tuple[FlavorQuota, ...]:
    return (FlavorQuota(model="H100", nominal_gpus=nominal, lending_limit_gpus=lend),)


def _lent_then_limit_lowered() -> Log:
    """b borrows 1 H100 of a's lendable 2; then a's lending limit goes to 0 (the borrowing stays out)."""
    log = Log().queues(QueueSpec(name="org", team="org"),
                       QueueSpec(name="a", team="a", parent="org", flavors=_h100(2)),
                       QueueSpec(name="b", team="b", parent="org", flavors=_h100(0)))
    log.reserved("lent", spec("b"), flavor="H100", borrowed_milli=1000)
    log.add(QueuePolicyChanged, queue=QueueSpec(name="a", team="a", parent="org", flavors=_h100(8, lend=0)),
            version=4)
    return log


def test_a_lenders_own_reservation_after_its_lending_limit_was_lowered_keeps_lending_limit() -> None:
    log = _lent_then_limit_lowered()
    log.reserved("own", spec("a"), flavor="H100")
    assert check_safety(log.events) == []


def test_more_borrowing_after_a_lending_limit_was_lowered_breaks_lending_limit() -> None:
    log = _lent_then_limit_lowered()
    log.reserved("more", spec("b"), flavor="H100", borrowed_milli=1000)
    found = check_safety(log.events)
    assert ids(found) == {"lending_limit"} and found[0].jobs == ("more",)
    assert "borrow 2 H100 GPUs, above the 0 its queues may lend" in found[0].detail
    assert "it borrowed 1 before" in found[0].detail


def test_a_queue_that_joins_a_cohort_while_holding_quota_binds_only_later_borrowing() -> None:
    # b holds 1 GPU before it joins cohort org with nominal 0: the cohort then borrows 1 above the 0 it lends.
    log = Log().queues(QueueSpec(name="org", team="org"), QueueSpec(name="a", team="a"),
                       QueueSpec(name="b", team="b"))
    log.reserved("held", spec("b"))
    log.add(QueuePolicyChanged, queue=QueueSpec(name="b", team="b", parent="org", nominal_gpus=0), version=4)
    log.add(QueuePolicyChanged, queue=QueueSpec(name="a", team="a", parent="org"), version=5)
    log.reserved("unlimited", spec("a"))  # a has no quota: it draws nothing from the cohort
    assert check_safety(log.events) == []
    log.reserved("borrower", spec("b"))
    found = check_safety(log.events)
    assert ids(found) == {"lending_limit"} and found[0].jobs == ("borrower",)


def _timed_out(nominal_after: int) -> Log:
    """Job a (4 GPUs) is reserved, finds no place, and its quota goes back after the placement timeout; then
    the queue's nominal becomes `nominal_after` and an 8-GPU node registers, where a fits."""
    log = Log().nodes(node("small", gpus=2)).queues(QueueSpec(name="q", team="q", nominal_gpus=4))
    log.reserved("a", spec(gpus=4))
    log.add(PlacementDeferred, source="placement", job_id="a", code="insufficient_gpus", message="2 free")
    log.at(1_300.0).add(QuotaReleased, source="quota", job_id="a", queue="q", gpu_milli=4000,
                        reason="placement_timeout")
    log.add(QuotaDeferred, source="quota", job_id="a", queue="q", code="placement_timed_out", message="backs off")
    log.add(QueuePolicyChanged, queue=QueueSpec(name="q", team="q", nominal_gpus=nominal_after), version=2)
    return log.nodes(node("big", gpus=8))


def test_a_job_waiting_for_quota_after_a_placement_timeout_is_judged_by_quotas_reason() -> None:
    log = _timed_out(nominal_after=2)
    log.add(QuotaDeferred, source="quota", job_id="a", queue="q", code="exceeds_queue_quota", message="holds 2")
    log.ticks(until=1_400.0)
    # It fits the big node, but it waits for quota, which its queue no longer has: not a wait for a place.
    assert check_liveness(log.events) == []


def test_a_job_back_in_its_queue_after_a_placement_timeout_waits_for_quota() -> None:
    log = _timed_out(nominal_after=4).ticks(until=1_400.0)
    found = check_liveness(log.events)
    assert ids(found) == {"no_idle_while_fitting_waits"} and found[0].jobs == ("a",)
    assert "waits for quota since 1300 (placement_timed_out)" in found[0].detail


def test_a_job_keeps_its_wait_for_a_place_over_a_placement_timeout_as_placement_keeps_it() -> None:
    # s (2 GPUs) waits for a place from 1000 s, times out at 1300 s and is reserved again at 1360 s: placement
    # counts its wait toward starvation (100 s) from 1000 s, and holds the free GPU for it against b.
    log = Log().nodes(node("n", gpus=2)).queues(QueueSpec(name="q", team="q"))
    log.add(SchedulingSettingsChanged, settings=SchedulingSettings(starvation_after_s=100.0), version=2)
    log.running("r", spec(), on("n", 0))
    log.reserved("s", spec(gpus=2))
    log.add(PlacementDeferred, source="placement", job_id="s", code="insufficient_gpus", message="1 free")
    log.at(1_300.0).add(QuotaReleased, source="quota", job_id="s", queue="q", gpu_milli=2000,
                        reason="placement_timeout")
    log.at(1_360.0).add(QuotaReserved, source="quota", job_id="s", queue="q", gpu_milli=2000)
    log.add(PlacementDeferred, source="placement", job_id="s", code="insufficient_gpus", message="1 free")
    log.reserved("b", spec())
    log.add(PlacementDeferred, source="placement", job_id="b", code="held_for_starving_job", message="for s")
    log.ticks(until=1_400.0)
    assert check_liveness(log.events) == []


def _ran_twice(log: Log) -> tuple[Log, str, str]:
    """Job a runs on n[0], is evicted, and runs there again: the ids of its two runs (their JobPlaced)."""
    log.running("a", spec(), on("n", 0))
    first = log.events[-1][1].id
    log.add(JobEvicted, source="executor", job_id="a", run=first, reason="preempted")
    log.add(QuotaReleased, source="quota", job_id="a", queue="q", gpu_milli=1000, reason="evicted")
    log.add(QuotaReserved, source="quota", job_id="a", queue="q", gpu_milli=1000).placed("a", on("n", 0))
    return log, first, log.events[-1][1].id


def test_a_late_report_about_an_earlier_run_releases_nothing_of_the_current_run() -> None:
    log, first, second = _ran_twice(Log().nodes(node("n", gpus=1)).queues(QueueSpec(name="q", team="q")))
    log.add(JobFinished, source="executor", job_id="a", run=first)  # the first run's word, read late
    log.running("b", spec(), on("n", 0))
    found = check_safety(log.events)
    assert ids(found) == {"gpu_capacity"} and found[0].jobs == ("b",)
    # The current run's own report does release it.
    log, first, second = _ran_twice(Log().nodes(node("n", gpus=1)).queues(QueueSpec(name="q", team="q")))
    log.add(JobFinished, source="executor", job_id="a", run=second)
    log.running("b", spec(), on("n", 0))
    assert check_safety(log.events) == []


def test_a_late_report_about_an_earlier_run_frees_no_capacity_for_waiting_jobs() -> None:
    log, first, _ = _ran_twice(Log().nodes(node("n", gpus=1)).queues(QueueSpec(name="q", team="q")))
    log.add(JobFinished, source="executor", job_id="a", run=first)
    log.reserved("b", spec())
    log.add(PlacementDeferred, source="placement", job_id="b", code="insufficient_gpus", message="none free")
    log.ticks(until=1_010.0)
    # a still runs on the only GPU: b rightly waits for a place.
    assert check_liveness(log.events) == []
