"""Accounting: job states, queue counts and GPU-seconds per team, folded from the whole pipeline's log."""

from __future__ import annotations

import pytest

from contracts import CancelJob, JobEvicted, JobFailed, JobFinished, JobStarted
from libs.core.accounting.ledger import Ledger
from libs.core.accounting.state import AdmissionWait
from tests.unit.builders import EventFeed, Job, job, node, pipeline, queue


def accounting(nominal_gpus: int | None = 8) -> EventFeed:
    feed = pipeline(ledger=True)
    feed.at(900.0).queues(queue("ml-train", "ml", nominal_gpus), queue("cv-train", "cv"))
    feed.nodes(node("a", 8), node("b", 8))
    return feed


def ledger(feed: EventFeed) -> Ledger:
    assert feed.ledger is not None
    return feed.ledger


def counts(feed: EventFeed, name: str = "ml-train") -> tuple[int, int]:
    q = ledger(feed).state.queues[name]
    return q.pending, q.running


def test_a_job_goes_from_pending_to_running_to_succeeded() -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job().gpus(2))
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.phase, view.submitted_at, view.admitted_at) == ("pending", "placed", 1000.0, 1000.0)
    assert [(p.node, p.gpu_indices) for p in view.placements] == [("a", (0, 1))]
    assert counts(feed) == (1, 0) and ledger(feed).state.queues["ml-train"].reserved_gpus == 2.0
    assert ledger(feed).node_view("a").allocated_gpus == 2.0

    feed.at(1010.0).send(JobStarted, job_id="j")
    assert (view.state, view.phase, view.started_at) == ("running", "running", 1010.0)
    assert counts(feed) == (0, 1)

    feed.at(1110.0).send(JobFinished, job_id="j")
    assert (view.state, view.phase, view.exit_code, view.finished_at) == ("succeeded", "succeeded", 0, 1110.0)
    assert (view.gpu_seconds, view.placements) == (200.0, ())
    assert counts(feed) == (0, 0) and ledger(feed).state.queues["ml-train"].reserved_gpus == 0.0
    assert ledger(feed).node_view("a").allocated_gpus == 0.0
    usage = ledger(feed).state.teams["ml"]
    assert (usage.gpu_seconds, usage.jobs_finished) == (200.0, 1)


@pytest.mark.parametrize(("ending", "state", "reason"), [
    pytest.param((JobFinished, {"exit_code": 3}), "failed", "", id="finished with an error"),
    pytest.param((JobFailed, {"exit_code": 2, "reason": "bad_input"}), "failed", "bad_input",
                 id="failed with an exit code that retrying cannot cure"),
])
def test_a_job_that_ends_badly_is_failed(ending, state: str, reason: str) -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job())
    feed.send(JobStarted, job_id="j")
    event_type, fields = ending
    feed.at(1030.0).send(event_type, job_id="j", **fields)
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.reason, view.exit_code, view.gpu_seconds) == (state, reason, fields["exit_code"], 30.0)
    assert ledger(feed).state.teams["ml"].jobs_finished == 1


def test_a_rejected_job_is_recorded_with_its_code_and_counts_nowhere() -> None:
    feed = accounting()
    feed.submit("j", job().gpus(0))
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.phase, view.reason) == ("rejected", "rejected", "invalid_resources")
    assert counts(feed) == (0, 0)


def test_a_job_cancelled_before_placement_is_cancelled_at_once() -> None:
    feed = accounting(nominal_gpus=2)
    feed.at(1000.0).submit("j1", job().gpus(2))
    feed.submit("j2", job().gpus(2))
    view = ledger(feed).state.jobs["j2"]
    assert (view.state, view.phase, view.reason) == ("pending", "admitted", "queue_quota_exhausted")
    assert counts(feed) == (2, 0)
    feed.at(1005.0).send(CancelJob, job_id="j2", reason="changed my mind")
    assert (view.state, view.phase, view.reason, view.finished_at) == ("cancelled", "cancelled", "changed my mind",
                                                                       1005.0)
    assert counts(feed) == (1, 0)


def test_a_running_job_that_is_cancelled_stays_running_until_its_eviction_is_reported() -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job().gpus(4))
    feed.send(JobStarted, job_id="j")
    feed.at(1010.0).send(CancelJob, job_id="j")
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.phase) == ("running", "cancelling")
    feed.at(1020.0).send(JobEvicted, job_id="j", reason="cancelled")
    assert (view.state, view.phase, view.gpu_seconds, view.finished_at) == ("cancelled", "cancelled", 80.0, 1020.0)
    assert counts(feed) == (0, 0)


def test_an_evicted_job_is_pending_again_with_its_evictions_counted_and_every_run_charged() -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job().gpus(2))
    feed.send(JobStarted, job_id="j")
    feed.at(1030.0).send(JobEvicted, job_id="j", reason="node_lost")  # quota and placement take it back at once
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.evictions, view.gpu_seconds) == ("pending", 1, 60.0)
    assert view.phase == "placed" and counts(feed) == (1, 0)
    feed.at(1100.0).send(JobStarted, job_id="j")
    feed.at(1150.0).send(JobFinished, job_id="j")
    assert (view.state, view.evictions, view.gpu_seconds) == ("succeeded", 1, 160.0)
    assert ledger(feed).state.teams["ml"].gpu_seconds == 160.0


def test_the_victims_of_a_preemption_are_marked_preempting() -> None:
    feed = accounting(nominal_gpus=2)
    feed.submit("v", job().gpus(2).priority("batch"))
    feed.submit("p", job().gpus(2).priority("urgent"))
    view = ledger(feed).state.jobs["v"]
    assert (view.phase, view.reason, view.state) == ("preempting", "within_queue_priority", "pending")


@pytest.mark.parametrize(("j", "seconds", "gpu_seconds"), [
    pytest.param(job().gpus(2), 100.0, 200.0, id="2 GPUs for 100 s"),
    pytest.param(job().gpus(4).replicas(2), 10.0, 80.0, id="2 replicas of 4 GPUs for 10 s"),
    pytest.param(job().fraction(250), 100.0, 25.0, id="a quarter GPU for 100 s"),
    pytest.param(job().fraction(500).replicas(3), 10.0, 15.0, id="3 replicas of half a GPU for 10 s"),
])
def test_gpu_seconds_are_the_run_time_times_the_gpus_held(j: Job, seconds: float, gpu_seconds: float) -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", j)
    feed.send(JobStarted, job_id="j")
    feed.at(1000.0 + seconds).send(JobFinished, job_id="j")
    assert ledger(feed).state.jobs["j"].gpu_seconds == pytest.approx(gpu_seconds)
    assert ledger(feed).state.teams["ml"].gpu_seconds == pytest.approx(gpu_seconds)


def test_gpu_seconds_add_up_per_team() -> None:
    feed = accounting()
    for job_id, j in (("m1", job().gpus(1)), ("m2", job().gpus(3)), ("c1", job("cv", "cv-train").gpus(2))):
        feed.at(1000.0).submit(job_id, j)
        feed.send(JobStarted, job_id=job_id)
    feed.at(1010.0)
    for job_id in ("m1", "m2", "c1"):
        feed.send(JobFinished, job_id=job_id)
    teams = ledger(feed).state.teams
    assert {t: (u.gpu_seconds, u.jobs_finished) for t, u in teams.items()} == {"ml": (40.0, 2), "cv": (20.0, 1)}


def test_queue_counts_follow_every_transition() -> None:
    feed = accounting()
    for job_id in ("a", "b", "c"):
        feed.submit(job_id, job())
    assert counts(feed) == (3, 0)
    feed.send(JobStarted, job_id="a")
    feed.send(JobStarted, job_id="b")
    assert counts(feed) == (1, 2)
    feed.send(JobFinished, job_id="a")
    assert counts(feed) == (1, 1)
    feed.send(CancelJob, job_id="c")
    assert counts(feed) == (1, 1)  # c was placed: cancelling until its eviction is reported
    feed.send(JobEvicted, job_id="c", reason="cancelled")
    assert counts(feed) == (0, 1)
    q = ledger(feed).queue_view("ml-train")
    assert (q.team, q.nominal_gpus, q.reserved_gpus) == ("ml", 8, 1.0)


def test_the_wait_for_quota_is_recorded_per_queue_and_priority() -> None:
    feed = accounting(nominal_gpus=2)
    feed.at(1000.0).submit("j1", job().gpus(2))
    feed.submit("j2", job().gpus(2).priority("batch"))
    feed.at(1050.0).send(JobFinished, job_id="j1")
    assert ledger(feed).state.waits == [AdmissionWait("ml-train", "training", 0.0),
                                        AdmissionWait("ml-train", "batch", 50.0)]


def test_a_retryable_failure_puts_the_job_back_to_wait_for_its_retry() -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job())
    feed.send(JobStarted, job_id="j")
    feed.at(1030.0).send(JobFailed, job_id="j", exit_code=137, reason="oom_killed")
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.phase, view.retries, view.exit_code) == ("pending", "retrying", 1, 137)
    assert ledger(feed).state.teams["ml"].jobs_finished == 0


def test_long_jobs_and_their_interruptions_are_counted() -> None:
    feed = accounting()
    feed.at(1000.0).submit("long", job().having(duration_s=7200.0))
    feed.submit("short", job().having(duration_s=60.0))
    feed.send(JobStarted, job_id="long")
    feed.send(JobStarted, job_id="short")
    feed.at(1100.0).send(JobEvicted, job_id="long", reason="preempted")
    feed.send(JobEvicted, job_id="short", reason="preempted")
    assert ledger(feed).state.long_started == ["ml-train"]
    assert ledger(feed).state.long_interrupted == [("ml-train", "preempted")]


@pytest.mark.parametrize("reason", ["cancelled", "preempted"])
def test_a_start_that_crossed_a_cancel_still_ends_cancelled(reason: str) -> None:
    feed = accounting()
    feed.at(1000.0).submit("j", job())
    feed.at(1001.0).send(CancelJob, job_id="j", team="ml")
    view = ledger(feed).state.jobs["j"]
    assert (view.state, view.phase) == ("pending", "cancelling")  # placed: the executor must stop it
    feed.at(1002.0).send(JobStarted, job_id="j")  # it started before it saw the cancel
    feed.at(1003.0).send(JobEvicted, job_id="j", reason=reason)
    assert (view.state, view.phase) == ("cancelled", "cancelled")
    assert counts(feed) == (0, 0)
