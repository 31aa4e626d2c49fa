"""Determinism: the same log always yields the same decisions, byte for byte, and the same state."""

from __future__ import annotations

import msgspec
import pytest

from contracts import CancelJob, GpuHealthChanged, JobEvicted, JobFailed, JobFinished, JobStarted, NodeLost
from contracts.codec import decode, encode
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import run_decider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, job, node, pipeline, queue


def script(feed: EventFeed) -> EventFeed:
    """A busy afternoon: quotas, gangs, fractions, a rejection, preemption, eviction, failures, lost hardware."""
    feed.queues(queue("ml-train", "ml", 12), queue("ml-dev", "ml"), queue("cv-train", "cv", 6))
    feed.nodes(node("a", 8), node("b", 4, "H100"), node("c", 2, "L4", extra={"A100": 2}))
    submissions = [
        ("t1", job().gpus(4).replicas(2).priority("batch")),
        ("t2", job().gpus(2).priority("experiment")),
        ("d1", job(queue="ml-dev").fraction(250)),
        ("d2", job(queue="ml-dev").fraction(500).replicas(3)),
        ("c1", job("cv", "cv-train").gpus(4).models("H100")),
        ("c2", job("cv", "cv-train").gpus(2)),
        ("bad", job().gpus(16)),
        ("u1", job().gpus(4).priority("urgent")),
        ("l4", job(queue="ml-dev").gpus(2).models("L4")),
    ]
    for i, (job_id, j) in enumerate(submissions):
        feed.at(1000.0 + i).submit(job_id, j)
    feed.submit("t1", job())  # a duplicate
    for job_id in ("t2", "d1", "c1"):
        feed.send(JobStarted, job_id=job_id)
    feed.at(1100.0).send(JobEvicted, job_id="t1", reason="preempted")
    feed.send(JobFinished, job_id="d1")
    feed.send(JobFailed, job_id="c1", exit_code=1, reason="oom")
    feed.send(CancelJob, job_id="c2")
    feed.send(GpuHealthChanged, node="a", index=3, healthy=False, reason="xid", xid=79)
    feed.send(NodeLost, node="c", reason="heartbeat")
    feed.at(1200.0).send(JobFinished, job_id="u1")
    feed.send(GpuHealthChanged, node="a", index=3, healthy=True, reason="recovered")
    feed.nodes(node("d", 8))
    return feed


def test_the_script_exercises_every_decision_type() -> None:
    decided = {type(e).__name__ for e in script(pipeline()).log if e.source != "test"}
    assert decided >= {"JobSubmitted", "JobAdmitted", "JobRejected", "JobCancelled", "QuotaReserved", "QuotaReleased",
                       "QuotaDeferred", "JobPlaced", "PlacementDeferred", "PreemptionDecided"}


def test_two_fresh_pipelines_fed_the_same_inputs_log_identical_bytes_and_snapshots() -> None:
    first, second = script(pipeline(ledger=True)), script(pipeline(ledger=True))
    assert [encode(e) for e in first.log] == [encode(e) for e in second.log]
    assert [d.snapshot() for d in first.deciders] == [d.snapshot() for d in second.deciders]
    assert msgspec.json.encode(first.ledger.state.jobs) == msgspec.json.encode(second.ledger.state.jobs)
    assert msgspec.json.encode(first.ledger.state.teams) == msgspec.json.encode(second.ledger.state.teams)


def test_every_logged_event_survives_the_codec_unchanged() -> None:
    for event in script(pipeline()).log:
        assert decode(encode(event)) == event


@pytest.mark.parametrize("decider_type", [AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider])
def test_replaying_a_deciders_inputs_into_a_fresh_one_reproduces_its_decisions_and_state(decider_type) -> None:
    live = script(pipeline())
    [original] = [d for d in live.deciders if isinstance(d, decider_type)]
    fresh = decider_type()
    consumed = tuple(fresh.input_types())
    replayed = [e for seq, ev in enumerate(live.log, start=1) if type(ev) in consumed
                for e in run_decider(fresh, ev, seq)]
    decided = [e for e in live.log if e.source == fresh.name]
    assert decided, "the script should make this decider decide something"
    assert [encode(e) for e in replayed] == [encode(e) for e in decided]
    assert fresh.snapshot() == original.snapshot()
