"""Admission: validate every spec with a reason code, de-duplicate submissions, accept cancellations."""

from __future__ import annotations

import pytest

from contracts import (
    CancelJob,
    FlavorQuota,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobRejected,
    JobSubmitted,
    NodeRegistered,
    QueueSpec,
)
from libs.core.admission.capacity import Inventory, Rejection
from libs.core.admission.decider import AdmissionDecider
from libs.core.admission.idempotency_keys import job_id_for_key
from libs.core.admission.validation import validate
from libs.core.kernel.decider import derived_id
from libs.core.kernel.inadmissible import waits_by_policy
from libs.core.kernel.policy import PolicyBook
from tests.unit.builders import EventFeed, Job, brief, job, node, queue

# Two teams; ml has a quota-bound and an unlimited queue. The cluster: 8 A100 on `a`, 4 H100 on `b`.
QUEUES = (queue("ml-train", "ml", 8), queue("ml-dev", "ml", None), queue("cv-train", "cv", 4))
NODES = (node("a", 8, "A100"), node("b", 4, "H100"))


def book() -> PolicyBook:
    policy = PolicyBook()
    policy.set_queues(QUEUES)
    return policy


def inventory() -> Inventory:
    inv = Inventory()
    for n in NODES:
        inv.register(NodeRegistered(id=n.name, ts=0.0, source="test", node=n))
    return inv


def admission() -> EventFeed:
    feed = EventFeed(AdmissionDecider())
    feed.queues(*QUEUES)
    feed.nodes(*NODES)
    return feed


@pytest.mark.parametrize(("j", "code"), [
    pytest.param(job(team="nobody"), "unknown_team", id="a team without any queue"),
    pytest.param(job(team="nobody", queue="nope"), "unknown_team", id="an unknown team is named before its queue"),
    pytest.param(job(queue="nope"), "unknown_queue", id="a queue that does not exist"),
    pytest.param(job(queue="cv-train"), "queue_not_of_team", id="another team's queue"),
    pytest.param(job().priority("vip"), "unknown_priority_class", id="an undeclared priority class"),
    pytest.param(job().replicas(0), "invalid_replicas", id="zero replicas"),
    pytest.param(job().replicas(-1), "invalid_replicas", id="negative replicas"),
    pytest.param(job().fraction(1000), "gpu_milli_out_of_range", id="a fraction of a whole GPU"),
    pytest.param(job().having(gpu_milli=-1), "gpu_milli_out_of_range", id="a negative fraction"),
    pytest.param(job().gpus(0), "invalid_resources", id="zero GPUs"),
    pytest.param(job().gpus(-2), "invalid_resources", id="negative GPUs"),
    pytest.param(job().having(gpu_milli=500, gpus=2), "invalid_resources", id="a fraction of two GPUs"),
    pytest.param(job().host(cpu_milli=-1), "invalid_resources", id="negative cpu"),
    pytest.param(job().host(memory_mib=-1), "invalid_resources", id="negative memory"),
    pytest.param(job().having(gpu_memory_mib=-1), "invalid_resources", id="negative GPU memory"),
    pytest.param(job().having(duration_s=0.0), "invalid_duration", id="a zero duration"),
    pytest.param(job().having(max_runtime_s=-5.0), "invalid_duration", id="a negative max runtime"),
    pytest.param(job().models("V100"), "unknown_gpu_model", id="a GPU model the cluster lacks"),
    pytest.param(job().models("A100", "V100"), "unknown_gpu_model", id="one unknown model among known ones"),
    pytest.param(job(queue="ml-dev").gpus(9), "exceeds_node_capacity", id="more GPUs than the largest node"),
    pytest.param(job(queue="ml-dev").gpus(5).models("H100"), "exceeds_node_capacity",
                 id="more GPUs than the largest node of the allowed model"),
    pytest.param(job(queue="ml-dev").gpus(8).replicas(2), "exceeds_cluster_capacity",
                 id="a gang larger than the cluster"),
    pytest.param(job(queue="ml-dev").gpus(3).replicas(2).models("H100"), "exceeds_cluster_capacity",
                 id="a gang larger than the cluster's GPUs of the allowed model"),
    pytest.param(job().gpus(4).replicas(3), "exceeds_one_gpu_model",
                 id="a gang that fits only over two GPU models (a gang runs on one)"),
])
def test_a_spec_that_can_never_run_is_rejected_with_its_own_code(j: Job, code: str) -> None:
    rejection = validate(j.spec, book(), inventory())
    assert rejection is not None
    assert rejection.code == code
    assert rejection.message


@pytest.mark.parametrize("j", [
    pytest.param(job(), id="one GPU in a quota-bound queue"),
    pytest.param(job().gpus(8), id="exactly the queue's quota on one node"),
    pytest.param(job().gpus(4).replicas(2), id="a gang of exactly the quota"),
    pytest.param(job().fraction(500), id="half a GPU"),
    pytest.param(job().having(gpus=0, gpu_milli=250), id="a quarter GPU with gpus=0"),
    pytest.param(job(queue="ml-dev").gpus(4).replicas(2), id="a gang of a whole model in an unlimited queue"),
    pytest.param(job().gpus(4).models("H100"), id="the largest node of an allowed model"),
    pytest.param(job().having(duration_s=60.0, max_runtime_s=120.0).priority("urgent"), id="durations and class"),
])
def test_a_spec_the_cluster_and_its_queue_can_hold_is_accepted(j: Job) -> None:
    assert validate(j.spec, book(), inventory()) is None


# What a change of policy could serve is admitted: it waits, holding nothing, told why at once.
WAITING_BOOK = (QueueSpec(name="small", team="ml", flavors=(FlavorQuota(model="A100", nominal_gpus=2),),
                          user_max_gpus=3),
                QueueSpec(name="lender", team="ml", cohort="c", nominal_gpus=4),
                QueueSpec(name="borrower", team="ml", cohort="c", nominal_gpus=1))


@pytest.mark.parametrize(("j", "code"), [
    pytest.param(job(team="cv", queue="cv-train").gpus(3).replicas(2).models("A100"), "exceeds_queue_quota",
                 id="a gang larger than its queue's quota"),
    pytest.param(job(team="cv", queue="cv-train").gpus(5), "exceeds_queue_quota", id="one replica over quota"),
    pytest.param(job(queue="small").gpus(3), "exceeds_queue_quota", id="over its queue's quota of its model"),
    pytest.param(job(queue="small").models("H100"), "no_quota_for_models", id="no quota of the job's model"),
    pytest.param(job(queue="small").gpus(4), "user_limit", id="more than one user may hold, checked first"),
    pytest.param(job(queue="borrower").gpus(6), "exceeds_queue_quota", id="more than it could borrow"),
    pytest.param(job(queue="borrower").gpus(2).priority("production-inference"), "exceeds_queue_quota",
                 id="over nominal, and a job that cannot be preempted never borrows"),
])
def test_a_spec_over_what_its_queue_allows_now_is_accepted_and_waits_by_policy(j: Job, code: str) -> None:
    policy = book()
    policy.set_queues((*QUEUES, *WAITING_BOOK))
    assert validate(j.spec, policy, inventory()) is None
    found = waits_by_policy(j.spec, policy)
    assert found is not None and found[0] == code and found[1]


@pytest.mark.parametrize("j", [
    pytest.param(job(queue="borrower").gpus(5), id="all its cohort could lend it"),
    pytest.param(job(queue="small").gpus(2), id="its queue's quota of its model"),
    pytest.param(job(queue="ml-dev").gpus(8), id="a queue without quota"),
])
def test_a_spec_its_queue_could_hold_waits_for_nothing_by_policy(j: Job) -> None:
    policy = book()
    policy.set_queues((*QUEUES, *WAITING_BOOK))
    assert waits_by_policy(j.spec, policy) is None


def test_before_any_node_registers_capacity_is_unknown_and_rejects_nothing_but_policy_still_does() -> None:
    assert validate(job(queue="ml-dev").gpus(64).models("TPU").spec, book(), Inventory()) is None
    assert validate(job().gpus(64).spec, book(), Inventory()) is None  # over quota: it waits
    assert validate(job(queue="cv-train").spec, book(), Inventory()) == Rejection(
        "queue_not_of_team", "queue 'cv-train' belongs to team 'cv'")


def test_an_accepted_submission_is_logged_as_submitted_then_admitted_to_its_queue() -> None:
    feed = admission()
    spec = job().gpus(2).spec
    out = feed.submit("j1", spec)
    submitted, admitted = out
    assert isinstance(submitted, JobSubmitted) and submitted.job_id == "j1" and submitted.spec == spec
    assert isinstance(admitted, JobAdmitted) and admitted.job_id == "j1" and admitted.queue == "ml-train"
    trigger = feed.log[-3]
    for d, index in ((submitted, 0), (admitted, 1)):
        assert d.id == derived_id("admission", trigger.id, index)
        assert (d.source, d.ts, d.causation_id, d.correlation_id) == ("admission", trigger.ts, trigger.id, "j1")
        assert d.trigger_seq == feed.seq - 2


def test_the_same_job_id_submitted_twice_is_decided_only_once() -> None:
    feed = admission()
    assert brief(feed.submit("j1", job())) == [("JobSubmitted", "j1"), ("JobAdmitted", "j1")]
    assert feed.submit("j1", job()) == []
    assert feed.submit("j1", job().gpus(2)) == []


def test_a_rejected_spec_is_logged_with_its_code_and_spec_and_stays_rejected_when_resubmitted() -> None:
    feed = admission()
    spec = job(queue="cv-train").spec
    [rejected] = feed.submit("j1", spec)
    assert isinstance(rejected, JobRejected)
    assert (rejected.job_id, rejected.code, rejected.spec) == ("j1", "queue_not_of_team", spec)
    assert feed.submit("j1", job()) == []


def test_a_queue_declared_after_a_rejection_admits_the_next_submission() -> None:
    feed = EventFeed(AdmissionDecider())
    feed.nodes(*NODES)
    assert [r.code for r in feed.submit("j1", job())] == ["unknown_team"]
    feed.queues(*QUEUES)
    assert brief(feed.submit("j2", job())) == [("JobSubmitted", "j2"), ("JobAdmitted", "j2")]


def test_cancelling_a_live_job_is_accepted_with_its_reason() -> None:
    feed = admission()
    feed.submit("j1", job())
    [cancelled] = feed.send(CancelJob, job_id="j1", team="ml", reason="no longer needed")
    assert brief([cancelled]) == [("JobCancelled", "j1")]
    assert cancelled.reason == "no longer needed"
    assert feed.send(CancelJob, job_id="j1") == []


@pytest.mark.parametrize(("ending", "state"), [
    pytest.param((JobFinished, {"exit_code": 0}), "succeeded", id="finished"),
    pytest.param((JobFinished, {"exit_code": 3}), "failed", id="finished with an error"),
    pytest.param((JobFailed, {"exit_code": 1, "reason": "oom"}), "failed", id="failed"),
])
def test_cancelling_a_finished_job_decides_nothing(ending: tuple[type, dict], state: str) -> None:
    feed = admission()
    feed.submit("j1", job())
    event_type, fields = ending
    feed.send(event_type, job_id="j1", **fields)
    assert feed.send(CancelJob, job_id="j1") == []
    assert feed.deciders[0].cancel_refusal("j1", "") == Rejection("job_final", f"job j1 is already {state}")


def test_cancelling_an_unknown_job_or_another_teams_job_decides_nothing() -> None:
    feed = admission()
    feed.submit("j1", job())
    assert feed.send(CancelJob, job_id="nope") == []
    assert feed.send(CancelJob, job_id="j1", team="cv") == []
    assert feed.deciders[0].cancel_refusal("j1", "cv") == Rejection("unknown_job", "job j1 not found")


def test_cancelling_a_rejected_job_decides_nothing() -> None:
    feed = admission()
    feed.submit("j1", job().gpus(0))
    assert feed.send(CancelJob, job_id="j1") == []


def test_job_id_for_key_is_stable_per_team_and_key_and_differs_across_teams_and_keys() -> None:
    assert job_id_for_key("ml", "k1") == job_id_for_key("ml", "k1")
    assert job_id_for_key("ml", "k1") != job_id_for_key("cv", "k1")
    assert job_id_for_key("ml", "k1") != job_id_for_key("ml", "k2")
    assert job_id_for_key("ml/nlp", "k1") != job_id_for_key("ml", "nlp/k1")  # no two (team, key) join alike


def test_re_registering_a_node_replaces_its_gpus_in_the_inventory() -> None:
    inv = inventory()
    inv.register(NodeRegistered(id="r", ts=0.0, source="test", node=node("a", 2, "A100", extra={"L4": 1})))
    assert (inv.max_per_node, inv.total) == ({"A100": 2, "H100": 4, "L4": 1}, {"A100": 2, "H100": 4, "L4": 1})
