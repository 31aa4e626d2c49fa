"""Reclaim on a fragmented cohort, with the real deciders: the cheapest victims spread one per node, and a
second preemptor deciding while the first one's victims are still leaving.

The setting of tests/e2e/test_preemption_scenario.py: 4 nodes x 4 GPUs; queues "a" and "b" in cohort "org",
nominal 8 each, "a" may borrow 8. Team A runs eight 2-GPU batch jobs (two to a node, in submission order:
a-0/a-1, a-2/a-3, a-4/a-5, a-6/a-7), borrowing the whole cluster; team B then asks for 2 x 4 GPUs. Reclaiming
takes evicting both jobs of a node, per B job.

No executor runs here: victims stay on their GPUs until the test reports them evicted, as the real executor
does a moment later, so the second B job's deferral is judged while the first's victims are still leaving.
"""

from __future__ import annotations

import pytest

from contracts import JobEvicted, JobPlaced, PlacementDeferred, PreemptionDecided, QueueSpec
from tests.unit.builders import EventFeed, job, node, of, pipeline, spec_of

T0 = 1_000.0


def cohort_full_of_a(checkpointing: set[int]) -> tuple[EventFeed, dict[str, tuple[str, ...]]]:
    """A's eight jobs placed; which of them checkpoint is the only difference between scenarios. Returns the
    feed and each job's nodes."""
    feed = pipeline()
    feed.queues(QueueSpec(name="org", team="org"),
                QueueSpec(name="a", team="a", parent="org", nominal_gpus=8, borrowing_limit_gpus=8),
                QueueSpec(name="b", team="b", parent="org", nominal_gpus=8))
    feed.nodes(*(node(f"pre-{i}", 4) for i in range(4)))
    where: dict[str, tuple[str, ...]] = {}
    for i in range(8):
        spec = job("a", "a").gpus(2).priority("batch").having(
            duration_s=60.0, checkpoint_interval_s=5.0 if i in checkpointing else None)
        for placed in of(feed.at(T0 + i).submit(f"a-{i}", spec), JobPlaced):
            where[placed.job_id] = tuple(p.node for p in placed.placements)
    if len(where) != 8 or any(where[f"a-{i}"] != where[f"a-{i + 1}"] for i in range(0, 8, 2)):
        pytest.fail(f"precondition: A's jobs pack two to a node in submission order, got {where}")
    return feed, where


def b_asks_for_its_quota(feed: EventFeed) -> list[PreemptionDecided]:
    """B submits its two jobs; then the executor evicts every victim chosen. The decisions made."""
    decisions = []
    for i in range(2):
        decisions += of(feed.at(T0 + 20 + i * 0.01).submit(f"b-{i}", job("b", "b").gpus(4).having(duration_s=3.0)),
                        PreemptionDecided)
    for d in decisions:
        for v in d.victims:
            feed.at(T0 + 20.1).send(JobEvicted, job_id=v.job_id, reason="preempted")
    return decisions


def test_reclaim_works_when_the_cheapest_victims_share_nodes() -> None:
    """The control: a-0..a-3 checkpoint (two whole nodes of them); B's jobs each get a node of them."""
    feed, _ = cohort_full_of_a({0, 1, 2, 3})
    decisions = b_asks_for_its_quota(feed)
    assert sorted(v.job_id for d in decisions for v in d.victims) == ["a-0", "a-1", "a-2", "a-3"]
    assert {p.job_id for p in of(feed.log, JobPlaced)} >= {"b-0", "b-1"}


def test_reclaim_finds_a_whole_node_when_the_cheapest_victims_are_spread_one_per_node() -> None:
    feed, _ = cohort_full_of_a({0, 2, 4, 6})  # "every other job checkpoints"
    decisions = b_asks_for_its_quota(feed)
    assert decisions, "no reclaim: B waits for A's jobs to finish"
    assert {p.job_id for p in of(feed.log, JobPlaced)} >= {"b-0", "b-1"}


def test_a_second_preemptor_does_not_count_on_the_node_freed_for_the_first() -> None:
    feed, where = cohort_full_of_a({0, 1, 2, 4})
    decisions = b_asks_for_its_quota(feed)
    if [(d.preemptor_id, sorted(v.job_id for v in d.victims)[:2]) for d in decisions][:1] != [("b-0", ["a-0", "a-1"])]:
        pytest.fail(f"precondition: b-0 reclaims node of a-0 and a-1 first, got {decisions}")
    second = decisions[-1]
    freed = [where[v.job_id][0] for v in second.victims]
    assert len(set(freed)) == 1, f"{second.preemptor_id}'s victims are on {freed}: no node is freed for it"
    assert not [d for d in of(feed.log, PlacementDeferred) if d.job_id.startswith("b-")]
    assert {p.job_id for p in of(feed.log, JobPlaced)} >= {"b-0", "b-1"}


def test_a_run_over_whose_quota_is_not_released_yet_counts_as_leaving_its_queue() -> None:
    """On the bus quota may release an evicted job's reservation after preemption has read a lender's deferral:
    in that window the job's quota is leaving its queue, not borrowed by it, so a reclaim must not take a job
    of that queue as if it borrowed (a queue that does not borrow loses nothing to a reclaim)."""
    from contracts import (
        JobAdmitted,
        JobStarted,
        JobSubmitted,
        QuotaDeferred,
        QuotaReleased,
        QuotaReserved,
        ReplicaPlacement,
    )
    from libs.core.preemption.decider import PreemptionDecider

    feed = EventFeed(PreemptionDecider(), t0=T0)
    feed.queues(QueueSpec(name="org", team="org"),
                QueueSpec(name="a", team="a", parent="org", nominal_gpus=2, reclaim_after_s=0.0),
                QueueSpec(name="b", team="b", parent="org", nominal_gpus=2, reclaim_after_s=0.0))
    feed.nodes(node("n0", 4))
    for gpu, (job_id, queue) in enumerate([("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")]):
        spec = spec_of(job(queue, queue).gpus(1).priority("batch"))
        feed.send(JobSubmitted, job_id=job_id, spec=spec)
        feed.send(JobAdmitted, job_id=job_id, queue=queue)
        feed.send(QuotaReserved, job_id=job_id, queue=queue, gpu_milli=1000)
        feed.send(JobPlaced, job_id=job_id, placements=(
            ReplicaPlacement(replica=0, node="n0", gpu_indices=(gpu,), gpu_milli=1000),))
        feed.send(JobStarted, job_id=job_id)
    # a2 is evicted; quota has not released its reservation yet when b2's deferral arrives.
    feed.at(T0 + 10).send(JobEvicted, job_id="a2", reason="preempted")
    spec = spec_of(job("b", "b").gpus(1).priority("batch"))
    feed.send(JobSubmitted, job_id="b2", spec=spec)
    feed.send(JobAdmitted, job_id="b2", queue="b")
    decisions = feed.send(QuotaDeferred, job_id="b2", queue="b", code="quota_lent_out", message="lent",
                          shortfall_milli=1000)
    decisions += feed.send(QuotaReleased, job_id="a2", queue="a", gpu_milli=1000, reason="evicted")
    # a holds 2 of its nominal 2 once a2's quota is gone: nothing of a's is taken.
    assert of(decisions, PreemptionDecided) == []
