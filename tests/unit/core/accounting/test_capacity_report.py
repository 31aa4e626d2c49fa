"""The capacity trend: per model and day, peak demand (held + waiting) against healthy capacity, and a
straight-line forecast that says when demand will outgrow the model."""

from __future__ import annotations

import pytest

from contracts import GpuHealthChanged, JobFinished, JobStarted, NodeLost
from libs.reports.capacity import DAY_S, capacity_report, linear_fit
from tests.unit.builders import EventFeed, job, node, pipeline, queue


def growing_demand(days: int = 4) -> EventFeed:
    """Each day one A100 job twice the size of the day before's... plus one that any model would do."""
    feed = pipeline(ledger=True)
    feed.at(10.0).queues(queue("ml-train", "ml"))
    feed.nodes(node("a", 8), node("t", 4, model="T4"))
    for d in range(days):
        t = d * DAY_S
        feed.at(t + 100).submit(f"a{d}", job().gpus(2 * (d + 1)).models("A100"))
        feed.at(t + 200).send(JobStarted, job_id=f"a{d}")
        feed.at(t + 300).send(JobFinished, job_id=f"a{d}")
        feed.at(t + 400).submit(f"x{d}", job().gpus(1))
        feed.send(JobStarted, job_id=f"x{d}")
        feed.at(t + 500).send(JobFinished, job_id=f"x{d}")
    return feed


def test_daily_peaks_and_a_forecast_that_crosses_capacity() -> None:
    feed = growing_demand()
    report = capacity_report(enumerate(feed.log, start=1), horizon=3)
    a100 = next(m for m in report["models"] if m["model"] == "A100")
    assert [p["peak_demand"] for p in a100["periods"]] == [2.0, 4.0, 6.0, 8.0]
    assert [p["capacity"] for p in a100["periods"]] == [8, 8, 8, 8]
    assert a100["slope_gpus_per_period"] == 2.0
    assert [f["peak_demand"] for f in a100["forecast"]] == [10.0, 12.0, 14.0]
    assert a100["demand_exceeds_capacity_at"] == "1970-01-05"
    everything = next(m for m in report["models"] if m["model"] == "all")
    assert everything["capacity"] == 12
    assert [p["peak_demand"] for p in everything["periods"]] == [2.0, 4.0, 6.0, 8.0]
    t4 = next(m for m in report["models"] if m["model"] == "T4")
    assert t4["demand_exceeds_capacity_at"] is None and t4["capacity"] == 4


def test_waiting_jobs_count_toward_demand_and_lost_capacity_leaves_the_count() -> None:
    feed = pipeline(ledger=True)
    feed.at(10.0).queues(queue("ml-train", "ml"))
    feed.nodes(node("a", 8), node("b", 8))
    feed.at(20.0).submit("held", job().gpus(8).models("A100"))
    feed.send(JobStarted, job_id="held")
    feed.at(30.0).submit("waits", job().gpus(8).replicas(2).models("A100"))  # cannot fit: waits
    feed.at(40.0).send(GpuHealthChanged, node="b", index=0, healthy=False, reason="xid", xid=79)
    feed.at(50.0).send(NodeLost, node="a", reason="heartbeat")
    assert feed.ledger is not None
    assert feed.ledger.state.demand()["A100"] == 24.0
    report = capacity_report(enumerate(feed.log, start=1), horizon=1)
    a100 = next(m for m in report["models"] if m["model"] == "A100")
    assert a100["periods"][0]["peak_demand"] == 24.0 and a100["periods"][0]["peak_allocated"] == 8.0
    assert a100["periods"][0]["capacity"] == 16  # the peak of the day, before the losses
    assert a100["capacity"] == 16


def test_the_oldest_waiting_job_per_queue() -> None:
    feed = pipeline(ledger=True)
    feed.at(10.0).queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    feed.at(20.0).submit("runs", job().gpus(8))
    feed.send(JobStarted, job_id="runs")
    feed.at(30.0).submit("first", job().gpus(8))
    feed.at(40.0).submit("second", job().gpus(8))
    assert feed.ledger is not None
    feed.at(100.0).send(JobStarted, job_id="nothing")  # only moves the ledger's clock
    assert feed.ledger.state.oldest_pending_s("ml-train") == 70.0
    feed.at(110.0).send(JobFinished, job_id="runs")
    feed.at(111.0).send(JobStarted, job_id="first")
    assert feed.ledger.state.oldest_pending_s("ml-train") == 71.0  # "second", waiting since 40
    assert feed.ledger.state.oldest_pending_s("nobody") == 0.0


@pytest.mark.parametrize(("ys", "fit"), [([], (0.0, 0.0)), ([5.0], (5.0, 0.0)), ([1.0, 3.0, 5.0], (1.0, 2.0))])
def test_the_straight_line(ys: list[float], fit: tuple[float, float]) -> None:
    assert linear_fit(ys) == pytest.approx(fit)
