"""Placement after a reservation of another flavor, and after the inventory changed: the spec a job is placed by
comes from its submitted spec and the flavor quota reserved now, and a job told no GPU of its models exists is
tried again (and told the true reason) when a node of its model registers, even with too few GPUs free."""

from __future__ import annotations

from contracts import JobPlaced, JobSubmitted, PlacementDeferred, QuotaRecalled, QuotaReleased, QuotaReserved
from libs.core.kernel.wait_reasons import RESERVATION_RETURNED
from libs.core.placement.decider import PlacementDecider
from tests.unit.builders import EventFeed, job, node, of, queue


def test_a_reservation_of_any_model_replaces_an_earlier_flavor() -> None:
    feed = EventFeed(PlacementDecider())
    feed.queues(queue("q", "t"))
    feed.nodes(node("t4", gpus=1, model="T4"))
    spec = job("t", "q", gpus=1).spec
    feed.send(JobSubmitted, job_id="j", spec=spec)
    first = feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=1000, flavor="A100")
    assert [d.code for d in of(first, PlacementDeferred)] == ["no_model_match"]
    feed.send(QuotaReleased, job_id="j", queue="q", gpu_milli=1000, reason="placement_timeout")
    again = feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=1000, flavor="")
    assert [p.placements[0].node for p in of(again, JobPlaced)] == ["t4"]


def test_a_reservation_of_another_flavor_narrows_from_the_submitted_spec() -> None:
    feed = EventFeed(PlacementDecider())
    feed.queues(queue("q", "t"))
    feed.nodes(node("h", gpus=1, model="H100"))
    spec = job("t", "q", gpus=1, gpu_models=("A100", "H100")).spec
    feed.send(JobSubmitted, job_id="j", spec=spec)
    assert of(feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=1000, flavor="A100"), PlacementDeferred)
    feed.send(QuotaReleased, job_id="j", queue="q", gpu_milli=1000, reason="placement_timeout")
    again = feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=1000, flavor="H100")
    assert [p.placements[0].node for p in of(again, JobPlaced)] == ["h"]


def test_no_model_match_is_told_again_when_a_node_of_the_model_registers_busy_or_small() -> None:
    feed = EventFeed(PlacementDecider())
    feed.queues(queue("q", "t"))
    feed.nodes(node("a", gpus=1, model="A100"))
    feed.reserve("big", job("t", "q", gpus=3, gpu_models=("H100",)))
    assert [d.code for d in of(feed.log, PlacementDeferred)] == ["no_model_match"]
    # One H100 registers: too few GPUs free for the job (it asks for three, two are free in all), yet its
    # model now exists.
    told = feed.nodes(node("h", gpus=1, model="H100"))
    assert [(d.job_id, d.code) for d in of(told, PlacementDeferred)] == [("big", "insufficient_gpus")]


def test_a_reservation_asked_back_lets_a_waiting_job_go_and_says_so() -> None:
    feed = EventFeed(PlacementDecider())
    feed.queues(queue("q", "t"))
    feed.nodes(node("t4", gpus=1, model="T4"))
    feed.send(JobSubmitted, job_id="j", spec=job("t", "q", gpus=2).spec)
    assert of(feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=2000), PlacementDeferred)
    answer = feed.send(QuotaRecalled, job_id="j", queue="q", reason="placement_timeout")
    assert [(d.job_id, d.code) for d in of(answer, PlacementDeferred)] == [("j", RESERVATION_RETURNED)]
    # Let go, it is not placed, even on a node that could hold it, until quota reserves it again.
    assert of(feed.nodes(node("big", gpus=2, model="T4")), JobPlaced) == []
    again = feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=2000)
    assert [p.placements[0].node for p in of(again, JobPlaced)] == ["big"]


def test_a_reservation_asked_back_after_its_job_was_placed_is_not_answered() -> None:
    feed = EventFeed(PlacementDecider())
    feed.queues(queue("q", "t"))
    feed.nodes(node("t4", gpus=1, model="T4"))
    feed.send(JobSubmitted, job_id="j", spec=job("t", "q", gpus=1).spec)
    assert of(feed.send(QuotaReserved, job_id="j", queue="q", gpu_milli=1000), JobPlaced)
    assert feed.send(QuotaRecalled, job_id="j", queue="q", reason="placement_timeout") == []
