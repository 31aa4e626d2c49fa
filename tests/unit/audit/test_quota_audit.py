"""The auditor's quota check: reservations folded into the quota book, a violation per over-limit one."""

from __future__ import annotations

from contracts import EventBase, QueuePolicyChanged, QueueSpec, QuotaReleased, QuotaReserved
from libs.audit.quota_audit import quota_violations


def policy(name: str, nominal: int, borrow: int | None = None, cohort: str = "c") -> QueuePolicyChanged:
    return QueuePolicyChanged(id=f"p-{name}", ts=0.0, source="operator", version=1,
                              queue=QueueSpec(name=name, team=name, cohort=cohort, nominal_gpus=nominal,
                                              borrowing_limit_gpus=borrow))


def reserve(job: str, queue: str, gpus: int) -> QuotaReserved:
    return QuotaReserved(id=f"r-{job}", ts=1.0, source="quota", job_id=job, queue=queue, gpu_milli=gpus * 1000)


def release(job: str, queue: str) -> QuotaReleased:
    # The event's own amount is deliberately wrong: the audit undoes what was reserved.
    return QuotaReleased(id=f"x-{job}", ts=2.0, source="quota", job_id=job, queue=queue, gpu_milli=1,
                         reason="finished")


def test_borrowing_idle_quota_within_the_limits_is_no_violation() -> None:
    events: list[EventBase] = [
        policy("a", 4, borrow=2), policy("b", 4),
        reserve("j1", "a", 4), reserve("j2", "a", 2),  # a borrows 2 of b's idle 4
        release("j2", "a"), reserve("j3", "b", 4),  # b takes its whole nominal back once a returned it
        release("j1", "a"), release("j3", "b"), reserve("j4", "a", 6),
    ]
    assert quota_violations(events) == []


def test_above_the_borrowing_limit_or_beyond_what_the_cohort_lends_is_a_violation() -> None:
    over_limit = [policy("a", 4, borrow=2), policy("b", 4), reserve("j1", "a", 7)]
    assert len(quota_violations(over_limit)) == 1
    over_pool: list[EventBase] = [policy("a", 4, borrow=4), policy("b", 4), reserve("j1", "a", 6),
                                  reserve("j2", "b", 4), reserve("j3", "b", 1)]
    found = quota_violations(over_pool)
    assert [line.split(" ")[0] for line in found] == ["j2", "j3"]
    assert "cohort c" in found[0]


def test_a_queue_without_a_cohort_may_not_exceed_its_nominal() -> None:
    assert len(quota_violations([policy("solo", 2, cohort=""), reserve("j1", "solo", 3)])) == 1
