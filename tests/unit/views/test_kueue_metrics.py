"""Kueue's figures from a hand-made timed log: wall time, time to admission, queue usage, counts."""

from __future__ import annotations

from contracts import (
    EventBase,
    JobEvicted,
    JobFinished,
    JobSpec,
    PreemptionDecided,
    QueuePolicyChanged,
    QueueSpec,
    QuotaReleased,
    QuotaReserved,
    SubmitJob,
)
from libs.bench.kueue_metrics import compute_metrics
from libs.bench.kueue_scenario import CLASS_LABEL


def submit(job: str, queue: str, cls: str, gpus: int = 1) -> SubmitJob:
    return SubmitJob(id=f"s-{job}", ts=0.0, source="bench", job_id=job,
                     spec=JobSpec(team=queue, queue=queue, gpus=gpus, labels={CLASS_LABEL: cls}))


def reserve(job: str, queue: str, gpus: int) -> QuotaReserved:
    return QuotaReserved(id=f"r-{job}", ts=0.0, source="quota", job_id=job, queue=queue, gpu_milli=gpus * 1000)


def release(job: str, queue: str, gpus: int) -> QuotaReleased:
    return QuotaReleased(id=f"x-{job}", ts=0.0, source="quota", job_id=job, queue=queue, gpu_milli=gpus * 1000,
                         reason="finished")


def finished(job: str) -> JobFinished:
    return JobFinished(id=f"f-{job}", ts=0.0, source="sim", job_id=job)


def policy(name: str) -> QueuePolicyChanged:
    return QueuePolicyChanged(id=f"p-{name}", ts=0.0, source="operator", version=1,
                              queue=QueueSpec(name=name, team=name, cohort="c", nominal_gpus=4))


# (stored at, event): queue a holds 4 GPUs for 5 of the 10 s, queue b 2 GPUs for 10 s (borrowing none).
TIMELINE: list[tuple[float, EventBase]] = [
    (-5.0, policy("a")), (-5.0, policy("b")),
    (100.0, submit("a1", "a", "small")), (100.0, submit("b1", "b", "large", gpus=2)),
    (101.0, reserve("b1", "b", 2)), (102.0, reserve("a1", "a", 4)),
    (103.0, submit("a2", "a", "small")),
    (104.0, PreemptionDecided(id="pd", ts=0.0, source="preemption", preemptor_id="a2", victims=(), code="x")),
    (104.0, JobEvicted(id="ev", ts=0.0, source="sim", job_id="a1", reason="preempted")),
    (104.5, release("a1", "a", 4)), (104.5, reserve("a2", "a", 4)),
    (106.0, release("a2", "a", 4)), (106.0, finished("a2")),
    (106.0, reserve("a1", "a", 4)),  # a second reservation of a1 does not count toward its admission time
    (108.0, release("a1", "a", 4)),
    (108.0, finished("a1")), (110.0, finished("b1")), (111.0, release("b1", "b", 2)),
]
LOG = [(seq, at, e) for seq, (at, e) in enumerate(TIMELINE, start=1)]


def test_metrics_from_a_timed_log() -> None:
    m = compute_metrics(LOG)
    assert m["wall_time_s"] == 10.0
    assert m["time_to_admission_s"] == {"large": 1.0, "small": 1.75}  # a1 2 s, a2 1.5 s
    assert m["time_to_admission_p50_s"] == {"large": 1.0, "small": 1.5}
    assert m["time_to_admission_p90_s"] == {"large": 1.0, "small": 2.0}
    # a: 4 GPUs over 102-104.5, 104.5-106, 106-108 = 4 * 6 GPU-s over 10 s of a 4-GPU nominal: 60 %.
    # b: 2 GPUs from 101 to the end of the window (110) = 18 GPU-s: 45 %.
    assert (m["min_queue_usage_pct"], m["mean_queue_usage_pct"]) == (45.0, 52.5)
    assert (m["jobs_submitted"], m["jobs_completed"], m["jobs_rejected"]) == (3, 3, 0)
    assert (m["evictions"], m["preemptions"], m["quota_violations"], m["events"]) == (1, 1, 0, len(LOG))


def test_an_empty_log_has_no_figures() -> None:
    m = compute_metrics([])
    assert m["wall_time_s"] is None and m["min_queue_usage_pct"] is None and m["time_to_admission_s"] == {}
