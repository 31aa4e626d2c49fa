"""The starvation rule and the present inventory: a job no node present could hold, with every running job gone,
is no starving job (for quota and for placement, which then let the next-oldest job that could be held starve)
and holds nobody in quota (no job below it, no borrower), and says why it waits; once a node that could hold it
is back it starves again (tests/scenarios/starving-job-*.yaml and job-no-node-could-hold-*.yaml run the same
through the whole pipeline)."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import (
    ClockTick,
    GpuHealthChanged,
    GpuSpec,
    JobSpec,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    PlacementDeferred,
    SchedulingSettings,
    SchedulingSettingsChanged,
)
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.starvation import CAPACITY_HELD, longest_waiting
from libs.core.placement.codes import HELD_FOR_STARVING_JOB
from libs.core.placement.decider import PlacementDecider
from libs.core.quota.decider import NO_NODE_COULD_HOLD
from libs.core.quota.fleet import Fleet
from tests.unit.builders import EventFeed, job, kinds, of
from tests.unit.quota_builders import D, on, outcome, q, quota, run, wait

BIG = JobSpec(team="a", queue="a", gpus=8)


def _spec(name: str, gpus: int, model: str = "A100") -> NodeSpec:
    return NodeSpec(name=name, gpus=tuple(GpuSpec(index=i, model=model) for i in range(gpus)))


def _fleet(*events: Any) -> Fleet:
    fleet = Fleet()
    for event in events:
        fleet.evolve(event)
    return fleet


def _registered(name: str, gpus: int, model: str = "A100") -> NodeRegistered:
    return NodeRegistered(id=f"reg-{name}", ts=0.0, source="test", node=_spec(name, gpus, model))


def test_the_inventory_holds_a_job_only_on_a_schedulable_node_big_enough() -> None:
    fleet = _fleet(_registered("n0", 8), _registered("n1", 6))
    assert fleet.could_place((ANY,), BIG)
    # A cordoned node takes no job: it holds none either.
    fleet.evolve(NodeCordoned(id="c", ts=0.0, source="test", node="n0"))
    assert not fleet.could_place((ANY,), BIG)
    fleet.evolve(NodeUncordoned(id="u", ts=0.0, source="test", node="n0"))
    assert fleet.could_place((ANY,), BIG)
    fleet.evolve(GpuHealthChanged(id="h", ts=0.0, source="test", node="n0", index=3, healthy=False,
                                   reason="xid"))
    assert not fleet.could_place((ANY,), BIG)
    fleet.evolve(NodeLost(id="l", ts=0.0, source="test", node="n0", reason="gone"))
    assert not fleet.could_place((ANY,), BIG)
    fleet.evolve(_registered("n0", 8))  # back, every GPU healthy
    assert fleet.could_place((ANY,), BIG)


def test_the_inventory_is_asked_by_the_flavors_model_and_every_dimension_placement_checks() -> None:
    fleet = _fleet(_registered("n0", 8), _registered("n1", 8, "H100"))
    assert fleet.could_place(("A100",), BIG)
    assert not fleet.could_place(("T4",), BIG)
    # Two 8-GPU replicas fit one on each node only when the gang may mix models: it may not.
    assert not fleet.could_place((ANY,), JobSpec(team="a", queue="a", gpus=8, replicas=2))
    # A node's CPUs bound it too (the nodes here declare none).
    assert not fleet.could_place((ANY,), JobSpec(team="a", queue="a", gpus=1, cpu_milli=1000))


def test_before_any_node_registers_the_inventory_is_not_judged() -> None:
    assert _fleet().could_place((ANY,), BIG)


def _feed_with(*nodes: NodeSpec) -> Any:
    feed = quota(q("a", 8, cohort=""), starvation_after_s=600)
    for node in nodes:
        feed.send(NodeRegistered, node=node)
    return feed


def test_a_starving_job_no_node_could_hold_holds_nobody_and_says_why() -> None:
    feed = _feed_with(_spec("n0", 8), _spec("n1", 6))
    feed.send(NodeCordoned, node="n0")
    run(feed, ("r1", on("a", 2)))
    assert outcome(feed.admit("big", on("a", 8)), "big") == ("deferred", NO_NODE_COULD_HOLD)
    feed.at(D + 700)
    # big waited past the limit, but no schedulable node could hold it: a later job takes the idle quota.
    assert outcome(feed.admit("later", on("a", 1)), "later") == ("reserved", 0, "")


def test_a_node_that_could_hold_it_coming_back_makes_it_the_starving_job_again() -> None:
    feed = _feed_with(_spec("n0", 8), _spec("n1", 6))
    feed.send(NodeCordoned, node="n0")
    run(feed, ("r1", on("a", 2)))
    wait(feed, ("big", on("a", 8)))
    feed.at(D + 700)
    decisions = feed.send(NodeUncordoned, node="n0")
    # Told its quota reason anew (the queue holds 2 of 8), it starves: a later job is held for it.
    assert outcome(decisions, "big") == ("deferred", "queue_quota_exhausted")
    assert outcome(feed.admit("later", on("a", 1)), "later") == ("deferred", "held_for_starving_job")


def test_the_starving_job_is_the_longest_waiting_one_that_could_be_held() -> None:
    waits = [(0.0, "never"), (10.0, "could"), (20.0, "later"), (500.0, "recent")]
    assert longest_waiting(waits, 200.0, 100.0, lambda j: j != "never") == "could"
    # Nobody past the limit could be held: the walk stops at the first job not yet past it.
    assert longest_waiting(waits, 200.0, 100.0, lambda j: j == "recent") is None


def test_placement_lets_the_next_oldest_job_starve_when_no_node_could_hold_the_oldest() -> None:
    feed = EventFeed(PlacementDecider())
    feed.at(0.0).nodes(_spec("a", 8), _spec("b", 4))
    feed.send(SchedulingSettingsChanged, version=1, settings=SchedulingSettings(starvation_after_s=100.0))
    feed.send(NodeLost, node="a", reason="gone")
    assert kinds(feed.reserve("run", job().gpus(3)))[-1] == "JobPlaced"
    # big: no node present could hold it; mid: b could, once run is gone.
    assert kinds(feed.reserve("big", job().gpus(8)))[-1] == "PlacementDeferred"
    assert kinds(feed.at(10.0).reserve("mid", job().gpus(4)))[-1] == "PlacementDeferred"
    told = of(feed.at(200.0).send(ClockTick), PlacementDeferred)
    assert [(d.job_id, d.code) for d in told] == [("mid", CAPACITY_HELD)]
    # The last free GPU of b is mid's room: a job of no higher priority without a declared end waits for it.
    held = of(feed.at(201.0).reserve("small", job().gpus(1)), PlacementDeferred)
    assert [(d.job_id, d.code) for d in held] == [("small", HELD_FOR_STARVING_JOB)]


def _two_nodes(*queues: Any) -> Any:
    """n0 (8 GPUs, the only node that could hold an 8-GPU job) and n1 (6), for quota alone."""
    feed = quota(*queues)
    feed.nodes(_spec("n0", 8), _spec("n1", 6))
    return feed


def test_a_job_no_node_could_hold_holds_no_lower_job_of_its_queue() -> None:
    feed = _two_nodes(q("a", 8, cohort=""))
    feed.send(NodeLost, node="n0", reason="gone")
    run(feed, ("r1", on("a", 2)))
    assert outcome(feed.admit("urgent", on("a", 8, priority="urgent")), "urgent") == ("deferred", NO_NODE_COULD_HOLD)
    # 6 GPUs of quota are idle and a node could hold the small job: it goes.
    assert outcome(feed.admit("low", on("a", 1)), "low") == ("reserved", 0, "")


def test_a_job_whose_only_node_goes_is_told_so_and_lets_what_it_held_go() -> None:
    feed = _two_nodes(q("a", 8, cohort=""))
    run(feed, ("r1", on("a", 2)))
    assert outcome(feed.admit("urgent", on("a", 8, priority="urgent")), "urgent") == (
        "deferred", "queue_quota_exhausted")
    assert outcome(feed.admit("low", on("a", 1)), "low") == ("deferred", "behind_higher_priority")
    decisions = feed.send(NodeLost, node="n0", reason="gone")
    assert outcome(decisions, "urgent") == ("deferred", NO_NODE_COULD_HOLD)
    assert outcome(decisions, "low") == ("reserved", 0, "")


@pytest.mark.parametrize("again", [
    pytest.param(_spec("n0", 4), id="with fewer GPUs"),
    pytest.param(NodeSpec(name="n0", gpus=tuple(GpuSpec(index=i, model="A100", mig_enabled=True) for i in range(8))),
                 id="with MIG on"),
])
def test_a_job_whose_only_node_registers_again_too_small_is_told_so_and_lets_what_it_held_go(again: NodeSpec
                                                                                              ) -> None:
    feed = _two_nodes(q("a", 8, cohort=""))
    run(feed, ("r1", on("a", 2)))
    assert outcome(feed.admit("urgent", on("a", 8, priority="urgent")), "urgent") == (
        "deferred", "queue_quota_exhausted")
    assert outcome(feed.admit("low", on("a", 1)), "low") == ("deferred", "behind_higher_priority")
    # A registration is no growth only: n0 is back, but no node present could hold urgent now.
    decisions = feed.send(NodeRegistered, node=again)
    assert outcome(decisions, "urgent") == ("deferred", NO_NODE_COULD_HOLD)
    assert outcome(decisions, "low") == ("reserved", 0, "")


def test_a_lender_whose_job_no_node_could_hold_freezes_no_borrowing() -> None:
    feed = _two_nodes(q("a", 8), q("b", 2))
    feed.send(NodeLost, node="n0", reason="gone")
    assert outcome(feed.admit("b-run", on("b", 4)), "b-run") == ("reserved", 2, "")
    # a-big fits a's nominal quota, not the room b's borrowing leaves it; no node present could hold it.
    assert outcome(feed.admit("a-big", on("a", 8)), "a-big") == ("deferred", NO_NODE_COULD_HOLD)
    assert outcome(feed.admit("b-more", on("b", 1)), "b-more") == ("reserved", 1, "")
