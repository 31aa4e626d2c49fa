"""Quota: reserve each admitted job's GPUs against its queue's nominal quota, in priority-then-arrival order."""

from __future__ import annotations

import msgspec
import pytest

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, brief, job, queue


def quota(nominal_gpus: int | None = 4) -> EventFeed:
    feed = EventFeed(QuotaDecider())
    feed.queues(queue("ml-train", "ml", nominal_gpus), queue("cv-train", "cv", 2))
    return feed


def state(feed: EventFeed) -> dict:
    return msgspec.json.decode(feed.deciders[0].snapshot())


def test_jobs_within_quota_are_reserved_as_they_are_admitted() -> None:
    feed = quota()
    [reserved] = feed.admit("a", job().gpus(3))
    assert isinstance(reserved, QuotaReserved)
    assert (reserved.job_id, reserved.queue, reserved.gpu_milli) == ("a", "ml-train", 3000)
    assert reserved.correlation_id == "a"
    assert brief(feed.admit("b", job().fraction(500))) == [("QuotaReserved", "b")]
    assert brief(feed.admit("c", job().fraction(500))) == [("QuotaReserved", "c")]
    assert state(feed)["used"] == {"ml-train": 4000}


def test_a_job_beyond_its_queues_free_quota_is_deferred_once_with_its_shortfall() -> None:
    feed = quota()
    feed.admit("a", job().gpus(3))
    [deferred] = feed.admit("big", job().gpus(2).replicas(2))
    assert isinstance(deferred, QuotaDeferred)
    assert (deferred.job_id, deferred.queue, deferred.code, deferred.shortfall_milli) == (
        "big", "ml-train", "queue_quota_exhausted", 3000)
    # Later triggers that still leave it short repeat nothing.
    assert brief(feed.admit("small", job().gpus(1))) == [("QuotaReserved", "small")]
    assert brief(feed.send(JobFinished, job_id="small")) == [("QuotaReleased", "small")]
    assert feed.queues(queue("ml-train", "ml", 5)) == []
    assert brief(feed.send(JobFinished, job_id="a")) == [("QuotaReleased", "a"), ("QuotaReserved", "big")]


def test_a_waiting_job_holds_back_lower_priority_ones_but_not_smaller_ones_of_its_own_priority() -> None:
    feed = quota()
    feed.admit("a", job().gpus(3))
    assert brief(feed.admit("urgent", job().gpus(3).priority("urgent"))) == [("QuotaDeferred", "urgent")]
    [held] = feed.admit("batch", job().gpus(1).priority("batch"))
    assert isinstance(held, QuotaDeferred) and held.code == "behind_higher_priority"
    assert brief(feed.admit("urgent-small", job().gpus(1).priority("urgent"))) == [("QuotaReserved", "urgent-small")]


def test_freed_quota_goes_to_pending_jobs_by_priority_then_arrival() -> None:
    feed = quota()
    feed.admit("a", job().gpus(4))
    assert brief(feed.admit("b1", job().gpus(2).priority("batch"))) == [("QuotaDeferred", "b1")]
    # b1 already knows it waits for quota: a job outranking it changes nothing it needs to hear.
    assert brief(feed.admit("u", job().gpus(4).priority("urgent"))) == [("QuotaDeferred", "u")]
    assert brief(feed.admit("b2", job().gpus(2).priority("batch"))) == [("QuotaDeferred", "b2")]
    # b2 was held behind u; now it waits for quota like b1: still waiting for quota, nothing new to tell.
    assert brief(feed.send(JobFinished, job_id="a")) == [("QuotaReleased", "a"), ("QuotaReserved", "u")]
    assert brief(feed.send(JobFinished, job_id="u")) == [
        ("QuotaReleased", "u"), ("QuotaReserved", "b1"), ("QuotaReserved", "b2")]


@pytest.mark.parametrize(("ending", "reason"), [
    pytest.param((JobFinished, {}), "finished", id="finished"),
    pytest.param((JobFailed, {"exit_code": 1, "reason": "oom"}), "failed", id="failed"),
    pytest.param((JobCancelled, {"reason": "user_request"}), "cancelled", id="cancelled"),
])
def test_a_reserved_job_that_ends_releases_its_quota_and_the_next_pending_job_is_served(
        ending: tuple[type[EventBase], dict], reason: str) -> None:
    feed = quota()
    feed.admit("a", job().gpus(4))
    feed.admit("b", job().gpus(3))
    event_type, fields = ending
    released, reserved = feed.send(event_type, job_id="a", **fields)
    assert isinstance(released, QuotaReleased)
    assert (released.job_id, released.queue, released.gpu_milli, released.reason) == ("a", "ml-train", 4000, reason)
    assert brief([reserved]) == [("QuotaReserved", "b")]
    assert state(feed)["used"] == {"ml-train": 3000}
    # The end is final: a second report of it (or an eviction afterwards) releases nothing again.
    assert feed.send(JobFinished, job_id="a") == []
    assert feed.send(JobEvicted, job_id="a", reason="node_lost") == []


def test_an_evicted_job_releases_its_quota_and_is_reserved_again_when_nothing_outranks_it() -> None:
    feed = quota()
    feed.admit("a", job().gpus(2))
    released, reserved = feed.send(JobEvicted, job_id="a", reason="node_lost")
    assert (released.reason, released.gpu_milli) == ("evicted", 2000)
    assert brief([reserved]) == [("QuotaReserved", "a")]
    assert state(feed)["used"] == {"ml-train": 2000}


def test_an_evicted_job_waits_behind_the_higher_priority_job_that_takes_its_quota() -> None:
    feed = quota()
    feed.admit("victim", job().gpus(4).priority("batch"))
    feed.admit("urgent", job().gpus(4).priority("urgent"))
    assert brief(feed.send(JobEvicted, job_id="victim", reason="preempted")) == [
        ("QuotaReleased", "victim"), ("QuotaReserved", "urgent"), ("QuotaDeferred", "victim")]
    assert brief(feed.send(JobFinished, job_id="urgent")) == [("QuotaReleased", "urgent"), ("QuotaReserved", "victim")]


def test_an_evicted_job_keeps_its_original_arrival_among_equal_priority_jobs() -> None:
    feed = quota(nominal_gpus=2)
    feed.admit("first", job().gpus(2))
    feed.admit("second", job().gpus(2))
    feed.admit("third", job().gpus(2))
    assert brief(feed.send(JobEvicted, job_id="first", reason="node_lost")) == [
        ("QuotaReleased", "first"), ("QuotaReserved", "first")]


def test_a_cancelled_pending_job_leaves_its_queue_and_is_never_reserved() -> None:
    feed = quota()
    feed.admit("a", job().gpus(4))
    feed.admit("b", job().gpus(2))
    assert feed.send(JobCancelled, job_id="b", reason="user_request") == []
    assert brief(feed.send(JobFinished, job_id="a")) == [("QuotaReleased", "a")]
    assert state(feed)["pending"] == {}
    assert "b" not in state(feed)["jobs"]


@pytest.mark.parametrize("declare", [True, False], ids=["nominal_gpus None", "queue never declared"])
def test_a_queue_without_a_nominal_quota_reserves_everything(declare: bool) -> None:
    feed = EventFeed(QuotaDecider())
    if declare:
        feed.queues(queue("ml-train", "ml", None))
    decisions = [d for i in range(5) for d in feed.admit(f"j{i}", job().gpus(8).replicas(4))]
    assert brief(decisions) == [("QuotaReserved", f"j{i}") for i in range(5)]
    assert state(feed)["used"] == {"ml-train": 160_000}


def test_quotas_are_per_queue() -> None:
    feed = quota()
    feed.admit("ml", job().gpus(4))
    assert brief(feed.admit("cv", job("cv", "cv-train").gpus(2))) == [("QuotaReserved", "cv")]
    assert brief(feed.admit("cv2", job("cv", "cv-train").gpus(1))) == [("QuotaDeferred", "cv2")]
    assert brief(feed.send(JobFinished, job_id="ml")) == [("QuotaReleased", "ml")]


def test_raising_a_queues_quota_serves_its_pending_jobs_in_order() -> None:
    feed = quota()
    feed.admit("a", job().gpus(4))
    feed.admit("b", job().gpus(2).priority("batch"))
    feed.admit("u", job().gpus(2).priority("urgent"))
    assert brief(feed.queues(queue("ml-train", "ml", 6))) == [("QuotaReserved", "u")]
    assert brief(feed.queues(queue("ml-train", "ml", None))) == [("QuotaReserved", "b")]


def test_a_redelivered_admission_reserves_nothing_twice() -> None:
    feed = quota()
    feed.admit("a", job().gpus(2))
    assert feed.send(JobAdmitted, job_id="a", queue="ml-train") == []
    assert feed.admit("a", job().gpus(2)) == []
    assert state(feed)["used"] == {"ml-train": 2000}


def test_endings_of_unknown_jobs_decide_nothing() -> None:
    feed = quota()
    for event_type, fields in ((JobFinished, {}), (JobEvicted, {"reason": "x"}), (JobCancelled, {"reason": "x"})):
        assert feed.send(event_type, job_id="ghost", **fields) == []
