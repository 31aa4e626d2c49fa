"""A job only a change of policy could serve (more than its queue's ceiling, no quota of its models, more than its
queue lets one user hold) is admitted and waits, holding nothing, told why at once; it runs once a policy change
gives it room. Whether it was submitted so or the quota was lowered under it makes no difference. The checker
leaves it alone while it is rightly inadmissible, and flags it if it stays waiting after a change gave it room."""

from __future__ import annotations

import pytest

from contracts import (
    ClockTick,
    EventBase,
    FlavorQuota,
    JobFinished,
    JobPlaced,
    JobRejected,
    QueuePolicyChanged,
    QueueSpec,
    QuotaDeferred,
)
from libs.audit.guarantees import check, check_liveness
from tests.unit.audit.test_guarantee_checker import Log, ids, spec
from tests.unit.audit.test_guarantee_checker import on as on_gpus
from tests.unit.builders import EventFeed, node, of
from tests.unit.quota_builders import D, cluster, on, q

LOWERED, RAISED = q("a", 2, cohort=""), q("a", 4, cohort="")


def logged(feed: EventFeed) -> list[tuple[int, EventBase]]:
    return list(enumerate(feed.log, start=1))


def quota_story(feed: EventFeed, job_id: str) -> list[str]:
    """What quota told the job, in order, and "placed" once it ran: the outcome two histories compare by."""
    return [d.code if isinstance(d, QuotaDeferred) else "placed" for d in feed.log
            if isinstance(d, QuotaDeferred | JobPlaced) and d.job_id == job_id]


def busy_queue() -> EventFeed:
    """Queue a (nominal 4, no cohort) on an 8-GPU node; r1 holds all 4 of its quota."""
    feed = cluster(RAISED)
    feed.nodes(node("n1", 8))
    feed.submit("r1", on("a", 4))
    return feed


@pytest.mark.parametrize("lowered_first", [pytest.param(True, id="quota lowered before the job is submitted"),
                                           pytest.param(False, id="quota lowered while the job waits")])
def test_a_job_over_its_queues_ceiling_waits_and_runs_alike_whenever_the_quota_was_lowered(
        lowered_first: bool) -> None:
    feed = busy_queue()
    if lowered_first:
        feed.queues(LOWERED)
    decisions = feed.at(D + 10).submit("big", on("a", 4))
    assert not of(decisions, JobRejected)
    if not lowered_first:
        assert quota_story(feed, "big") == ["queue_quota_exhausted"]
        feed.queues(LOWERED)
    assert quota_story(feed, "big")[-1] == "exceeds_queue_quota"
    # It holds nothing: r1's end frees quota the lowered queue could give a smaller job, not it.
    feed.at(D + 20).send(JobFinished, job_id="r1")
    feed.at(D + 25).submit("small", on("a", 1))
    assert {p.job_id for p in of(feed.log, JobPlaced)} == {"r1", "small"}
    feed.at(D + 30).send(JobFinished, job_id="small")
    for t in range(35, 60, 5):
        feed.at(D + t).send(ClockTick)
    assert check(logged(feed), liveness=True) == []  # rightly inadmissible: no liveness problem
    feed.at(D + 60).queues(RAISED)
    assert quota_story(feed, "big")[-1] == "placed"
    # The same history after the submission either way: told it exceeds the ceiling, then placed.
    told = quota_story(feed, "big")
    assert told[told.index("exceeds_queue_quota"):] == ["exceeds_queue_quota", "placed"]


@pytest.mark.parametrize(("queue", "job", "code", "later"), [
    pytest.param(q("a", cohort="", flavors=(FlavorQuota(model="A100", nominal_gpus=4),)),
                 on("a", 2).models("H100"), "no_quota_for_models",
                 q("a", cohort="", flavors=(FlavorQuota(model="A100", nominal_gpus=4),
                                            FlavorQuota(model="H100", nominal_gpus=2))),
                 id="no quota of its model, until the queue gets some"),
    pytest.param(q("a", 8, cohort="", user_max_gpus=2), on("a", 3), "user_limit",
                 q("a", 8, cohort="", user_max_gpus=4), id="over its user limit alone, until it is raised"),
    pytest.param(q("a", 2), on("a", 3), "exceeds_queue_quota", q("a", 2, lending_limit_gpus=None),
                 id="over what its cohort could lend, until a queue joins the cohort"),
])
def test_a_job_a_policy_change_could_serve_waits_told_why_and_runs_after_the_change(
        queue: QueueSpec, job: object, code: str, later: QueueSpec) -> None:
    feed = cluster(queue)
    feed.nodes(node("n1", 8, extra={"H100": 4}))
    decisions = feed.submit("j", job)  # type: ignore[arg-type]
    assert not of(decisions, JobRejected)
    told = of(decisions, QuotaDeferred)
    assert [d.code for d in told] == [code] and told[0].message
    if code == "exceeds_queue_quota":
        feed.queues(later, q("b", 4))  # b joins cohort c and lends a what it lacks
    else:
        feed.queues(later)
    assert quota_story(feed, "j")[-1] == "placed"


def test_the_checker_flags_a_job_still_told_it_exceeds_its_ceiling_after_a_raise_gave_it_room() -> None:
    log = Log().nodes(node("n", gpus=8)).queues(QueueSpec(name="q", team="q", nominal_gpus=2))
    log.admitted("big", spec(gpus=4))
    log.add(QuotaDeferred, source="quota", job_id="big", queue="q", code="exceeds_queue_quota", message="2 at most")
    log.ticks(until=1_010.0)
    assert check_liveness(log.events) == []
    log.add(QueuePolicyChanged, queue=QueueSpec(name="q", team="q", nominal_gpus=4), version=2)
    found = check_liveness(log.ticks(until=1_020.0).events)
    assert ids(found) == {"no_idle_while_fitting_waits"} and found[0].jobs == ("big",)


def test_the_checker_flags_an_untrue_ceiling_reason_when_the_room_is_taken_but_the_ceiling_was_raised() -> None:
    # The raise lets the queue hold big one day, but another job holds the quota now: big is owed a quota
    # reason of the family that waits for others' use, not "its queue could never hold it".
    log = Log().nodes(node("n", gpus=8)).queues(QueueSpec(name="q", team="q", nominal_gpus=2))
    log.running("other", spec(gpus=2), on_gpus("n", 0, 1))
    log.admitted("big", spec(gpus=4))
    log.add(QuotaDeferred, source="quota", job_id="big", queue="q", code="exceeds_queue_quota", message="2 at most")
    log.add(QueuePolicyChanged, queue=QueueSpec(name="q", team="q", nominal_gpus=4), version=2)
    found = check_liveness(log.ticks(until=1_020.0).events)
    assert ids(found) == {"waiting_reason_true"} and found[0].jobs == ("big",)
    assert "could hold it" in found[0].detail


@pytest.mark.parametrize("lowered_first", [pytest.param(True, id="quota lowered before the job is submitted"),
                                           pytest.param(False, id="quota lowered while the job waits")])
def test_a_job_over_its_queues_ceiling_behind_a_job_of_higher_priority_hears_its_ceiling_either_way(
        lowered_first: bool) -> None:
    # No cycle tries a job held behind a higher one: the ceiling is told all the same, as it binds whoever waits.
    feed = cluster(q("a", 8, cohort=""))
    feed.nodes(node("n1", 8))
    feed.submit("r1", on("a", 6))
    feed.submit("hi", on("a", 4).priority("urgent"))
    if lowered_first:
        feed.queues(q("a", 5, cohort=""))
    decisions = feed.submit("lo", on("a", 6).priority("batch"))
    assert not of(decisions, JobRejected)
    if not lowered_first:
        feed.queues(q("a", 5, cohort=""))
    assert quota_story(feed, "lo")[-1] == "exceeds_queue_quota"
    assert quota_story(feed, "hi")[-1] != "exceeds_queue_quota"
