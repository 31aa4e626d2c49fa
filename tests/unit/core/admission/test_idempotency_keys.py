"""Idempotency keys in the admission core (the bus path): the same key and spec again decide nothing, the same
key with another spec is refused with `idempotency_key_reused` naming what differs, and the job that holds the
key is never touched."""

from __future__ import annotations

from typing import Any

from contracts import JobFinished, JobRejected, JobSpec
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.idempotency_keys import KEY_REUSED, KeyBook, refused_id, spec_differences, spec_fingerprint
from tests.unit.builders import EventFeed, brief, job, node, queue

QUEUES = (queue("ml-train", "ml", 8), queue("cv-train", "cv", 4))


def admission() -> EventFeed:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*QUEUES)
    feed.nodes(node("a", 8, "A100"))
    return feed


def keyed(key: str = "k1", **fields: Any) -> JobSpec:
    return job(**fields).having(idempotency_key=key).spec


def decider(feed: EventFeed) -> AdmissionDecider:
    d = feed.deciders[0]
    assert isinstance(d, AdmissionDecider)
    return d


def test_the_same_key_and_spec_again_decide_nothing() -> None:
    feed = admission()
    assert brief(feed.submit("j1", keyed())) == [("JobSubmitted", "j1"), ("JobAdmitted", "j1")]
    assert feed.submit("j1", keyed()) == []


def test_the_same_key_with_another_spec_is_refused_and_the_job_holding_it_is_untouched() -> None:
    feed = admission()
    feed.submit("j1", keyed())
    [refused] = feed.submit("j1", keyed(gpus=2, duration_s=60.0))
    assert isinstance(refused, JobRejected)
    assert refused.job_id == refused_id("j1", keyed(gpus=2, duration_s=60.0)) != "j1"
    assert refused.code == KEY_REUSED
    assert "gpus (stored 1, sent 2)" in refused.message and "duration_s (stored null, sent 60.0)" in refused.message
    assert refused.spec == keyed(gpus=2, duration_s=60.0)
    assert decider(feed).state.jobs["j1"] == "admitted"
    # The very same refused spec again is refused once only.
    assert feed.submit("j1", keyed(gpus=2, duration_s=60.0)) == []


def test_a_key_held_by_another_job_id_rejects_the_new_id_whatever_its_spec() -> None:
    feed = admission()
    feed.submit("j1", keyed())
    [same] = feed.submit("j2", keyed())
    assert isinstance(same, JobRejected) and (same.job_id, same.code) == ("j2", KEY_REUSED)
    assert "belongs to job j1, submitted with this same spec" in same.message
    [other] = feed.submit("j3", keyed(gpus=3))
    assert isinstance(other, JobRejected) and (other.job_id, other.code) == ("j3", KEY_REUSED)
    assert "was used for job j1" in other.message and "gpus (stored 1, sent 3)" in other.message
    # The key is the team's: another team may use it.
    assert brief(feed.submit("j4", keyed(team="cv", queue="cv-train"))) == [("JobSubmitted", "j4"),
                                                                           ("JobAdmitted", "j4")]


def test_a_job_that_is_over_still_holds_its_key() -> None:
    feed = admission()
    feed.submit("j1", keyed())
    feed.send(JobFinished, job_id="j1", exit_code=0)
    assert feed.submit("j1", keyed()) == []
    [refused] = feed.submit("j1", keyed(gpus=2))
    assert isinstance(refused, JobRejected) and refused.code == KEY_REUSED
    assert "the job is over" in refused.message


def test_a_rejected_submission_holds_its_key_too() -> None:
    feed = admission()
    [rejected] = feed.submit("j1", keyed(gpus=64))
    assert isinstance(rejected, JobRejected) and rejected.code != KEY_REUSED
    assert feed.submit("j1", keyed(gpus=64)) == []
    [refused] = feed.submit("j1", keyed())
    assert isinstance(refused, JobRejected) and refused.code == KEY_REUSED


def test_without_a_key_the_first_outcome_of_a_job_id_stands_whatever_comes_after() -> None:
    feed = admission()
    feed.submit("j1", job())
    assert feed.submit("j1", job().gpus(2)) == []
    # A keyed spec under an id taken without a key is another spec: refused, the job untouched.
    [refused] = feed.submit("j1", keyed())
    assert isinstance(refused, JobRejected) and refused.code == KEY_REUSED and refused.job_id != "j1"


def test_replaying_the_inputs_re_derives_the_same_refusals_and_key_holders() -> None:
    feed = admission()
    feed.submit("j1", keyed())
    feed.submit("j1", keyed(gpus=2))
    feed.submit("j2", keyed())
    again = EventFeed(AdmissionDecider())
    decisions = [d for e in feed.log if e.source != "admission" for d in again.deliver(e)]
    assert decisions == [e for e in feed.log if e.source == "admission"]
    again_keys = decider(again).state.keys
    assert again_keys == decider(feed).state.keys and again_keys.holders == {("ml", "k1"): "j1"}


def test_fingerprints_ignore_how_a_spec_was_built() -> None:
    a = JobSpec(team="t", queue="q", duration_s=5, labels={"x": "1", "y": "2"})
    b = JobSpec(team="t", queue="q", duration_s=5.0, labels={"y": "2", "x": "1"})
    assert spec_fingerprint(a) == spec_fingerprint(b)
    assert spec_fingerprint(a) != spec_fingerprint(JobSpec(team="t", queue="q", duration_s=6.0))
    assert spec_differences(b, JobSpec(team="t", queue="q", gpus=2)) == ["gpus", "duration_s", "labels"]


def test_a_spec_without_a_key_is_never_a_resubmission() -> None:
    book = KeyBook()
    book.decided("j1", JobSpec(team="t", queue="q"))
    assert book.holders == {} and book.resubmission("j1", JobSpec(team="t", queue="q"), {"j1"}) is None
