"""Placement: best-fit of whole GPUs and GPU fractions, gangs all or nothing (fit.py), and the decider."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import (
    GpuHealthChanged,
    JobCancelled,
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobSpec,
    NodeLost,
    PlacementDeferred,
    QuotaReserved,
    ReplicaPlacement,
)
from libs.core.cluster.job_fit import fits, place_gang, place_replica
from libs.core.cluster.model import Cluster
from libs.core.cluster.shortfall import Shortfall
from libs.core.placement.decider import PlacementDecider
from tests.unit.builders import EventFeed, Job, brief, job, kinds, node, of, pipeline, queue


def cluster(*specs, busy: dict[str, int] | None = None, partial: dict[tuple[str, int], int] | None = None) -> Cluster:
    """`busy`: the first N GPUs of a node are taken whole; `partial`: (node, index) -> milli taken."""
    c = Cluster()
    for s in specs:
        c.register(s)
    for name, n in (busy or {}).items():
        c.allocate([ReplicaPlacement(replica=0, node=name, gpu_indices=tuple(range(n)), gpu_milli=1000)])
    for (name, index), milli in (partial or {}).items():
        c.allocate([ReplicaPlacement(replica=0, node=name, gpu_indices=(index,), gpu_milli=milli)])
    return c


def free(c: Cluster) -> dict[str, tuple]:
    return {n.name: (n.free_cpu_milli, n.free_memory_mib, tuple((g.free_milli, g.free_memory_mib) for g in n.gpus))
            for n in c.sorted_nodes()}


def where(result) -> list[tuple[str, tuple[int, ...]]]:
    assert not isinstance(result, Shortfall), result
    return [(p.node, p.gpu_indices) for p in result]


THREE = (node("a"), node("b"), node("c"))


@pytest.mark.parametrize(("busy", "gpus", "expected"), [
    pytest.param({"b": 5, "c": 7}, 2, ("b", (5, 6)), id="the node left with the fewest idle GPUs"),
    pytest.param({"b": 5, "c": 7}, 1, ("c", (7,)), id="a single GPU fills the last hole"),
    pytest.param({"b": 5, "c": 7}, 3, ("b", (5, 6, 7)), id="an exact fit"),
    pytest.param({"b": 5, "c": 7}, 4, ("a", (0, 1, 2, 3)), id="only the idle node is big enough"),
])
def test_best_fit_puts_a_whole_gpu_replica_on_the_node_leaving_the_fewest_idle_gpus(busy, gpus, expected) -> None:
    c = cluster(*THREE, busy=busy)
    p = place_replica(c, job().gpus(gpus).spec, replica=0)
    assert p is not None and (p.node, p.gpu_indices, p.gpu_milli, p.model) == (*expected, 1000, "A100")
    assert [g.free_milli for g in c.nodes[expected[0]].gpus if g.index in expected[1]] == [0] * gpus


def test_ties_go_to_a_pseudo_random_but_reproducible_node() -> None:
    chosen = set()
    for salt in range(12):
        c = cluster(*THREE, busy={"a": 4, "b": 4, "c": 4})
        p = place_gang(c, job().gpus(4).spec, salt=salt)
        again = place_gang(cluster(*THREE, busy={"a": 4, "b": 4, "c": 4}), job().gpus(4).spec, salt=salt)
        assert not isinstance(p, Shortfall) and p == again
        chosen.add(p[0].node)
    assert chosen == {"a", "b", "c"}  # every tied node gets its turn


@pytest.mark.parametrize(("milli", "expected"), [
    pytest.param(250, ("a", 0), id="the most used GPU that still fits"),
    pytest.param(300, ("a", 0), id="an exact fit of the remaining share"),
    pytest.param(500, ("b", 1), id="the next most used GPU"),
    pytest.param(700, ("a", 1), id="an idle GPU only when no used one fits"),
])
def test_a_fractional_replica_goes_to_the_most_used_gpu_that_fits(milli: int, expected) -> None:
    c = cluster(node("a", 2), node("b", 2), partial={("a", 0): 700, ("b", 1): 400})
    p = place_replica(c, job().fraction(milli).spec, replica=0)
    assert p is not None and (p.node, p.gpu_indices[0]) == expected and p.gpu_milli == milli
    was = {("a", 0): 300, ("b", 1): 600}.get(expected, 1000)
    assert c.nodes[expected[0]].gpu(expected[1]).free_milli == was - milli


@pytest.mark.parametrize(("j", "expected"), [
    pytest.param(job().gpus(2).models("H100"), [("h", (0, 1))], id="an allowed model over a better fit"),
    pytest.param(job().gpus(2).models("A100"), [("a", (6, 7))], id="the best fit among the allowed model"),
    pytest.param(job().gpus(5), [("m", (2, 3, 4, 5, 6))], id="one model per replica: the most idle model of a node"),
    pytest.param(job().gpus(2).models("L4"), [("m", (0, 1))], id="the allowed model of a mixed node"),
    pytest.param(job().fraction(500).models("H100"), [("h", (0,))], id="a fraction honours models too"),
])
def test_allowed_gpu_models_are_honoured(j: Job, expected) -> None:
    c = cluster(node("a", 8), node("h", 4, "H100"), node("m", 2, "L4", extra={"H100": 6}), busy={"a": 6})
    assert where(place_gang(c, j.spec)) == expected


def test_a_replica_never_mixes_gpu_models() -> None:
    c = cluster(node("m", 2, "L4", extra={"H100": 2}))
    assert isinstance(place_gang(c, job().gpus(3).spec), Shortfall)


def test_a_gang_spreads_over_nodes_and_numbers_its_replicas() -> None:
    c = cluster(node("a", 4), node("b", 4))
    result = place_gang(c, job().gpus(4).replicas(2).host(cpu_milli=1000, memory_mib=2048).spec)
    assert [(p.replica, p.node, p.gpu_indices, p.cpu_milli, p.memory_mib) for p in result] == [
        (0, "a", (0, 1, 2, 3), 1000, 2048), (1, "b", (0, 1, 2, 3), 1000, 2048)]


@pytest.mark.parametrize("j", [
    pytest.param(job().gpus(4).replicas(3), id="whole GPUs: two of three replicas fit"),
    pytest.param(job().fraction(600).replicas(9), id="fractions: eight of nine replicas fit"),
    pytest.param(job().gpus(2).replicas(2).host(cpu_milli=40_000), id="cpu: one of two replicas fit"),
])
def test_a_gang_that_does_not_fit_whole_leaves_the_cluster_exactly_as_it_was(j: Job) -> None:
    c = cluster(node("a", 4), node("b", 4, cpu_milli=8000))
    before = free(c)
    assert isinstance(place_gang(c, j.spec), Shortfall)
    assert free(c) == before
    assert fits(c, j.spec) is False and free(c) == before


def test_fits_answers_without_taking_anything() -> None:
    c = cluster(node("a", 4))
    before = free(c)
    assert fits(c, job().gpus(4).spec) is True
    assert free(c) == before


def test_unhealthy_gpus_and_lost_nodes_are_never_chosen() -> None:
    c = cluster(node("a", 4), node("b", 4))
    c.set_gpu_health("a", 0, False)
    assert where(place_gang(c, job().gpus(3).spec)) == [("a", (1, 2, 3))]
    c.set_online("b", False)
    assert (place_gang(c, job().gpus(1).spec).code, place_gang(c, job().fraction(1).spec).code) == (
        "insufficient_gpus", "insufficient_gpus")
    c.set_online("a", False)
    assert place_gang(c, job().fraction(1).spec).code == "no_model_match"


SCATTERED = (node("a", 4), node("b", 4, cpu_milli=8000))


@pytest.mark.parametrize(("j", "code", "shortfall"), [
    pytest.param(job().gpus(1).models("H100"), "no_model_match", 1000, id="no GPU of an allowed model"),
    pytest.param(job().gpus(4), "insufficient_gpus", 2000, id="fewer idle GPUs than asked"),
    pytest.param(job().fraction(900).replicas(4), "insufficient_gpus", 400, id="less free share than asked"),
    pytest.param(job().gpus(2), "fragmentation", 2000, id="enough idle GPUs, but on different nodes"),
    pytest.param(job().fraction(800).replicas(3), "gang", 800, id="enough share, one replica fits but not all"),
    pytest.param(job().gpus(1).host(cpu_milli=70_000), "insufficient_cpu_memory", 0, id="no node with the cpu"),
])
def test_a_placement_that_fails_explains_why(j: Job, code: str, shortfall: int) -> None:
    # a: GPU 3 idle; b: GPU 1 idle, GPU 2 and 3 with 700 and 500 free; 3200 share free in all.
    c = cluster(*SCATTERED, busy={"a": 3, "b": 1}, partial={("b", 2): 300, ("b", 3): 500})
    result = place_gang(c, j.spec)
    assert isinstance(result, Shortfall)
    assert (result.code, result.shortfall_milli) == (code, shortfall)


# --- the invariant: whatever is placed and released, nothing is ever over-allocated -------------

SMALL = (node("a", 2, cpu_milli=8000, memory_mib=32_000, gpu_memory_mib=40_000),
         node("b", 4, "H100", cpu_milli=16_000, memory_mib=64_000, gpu_memory_mib=80_000),
         node("c", 1, "L4", extra={"A100": 2}, cpu_milli=4000, memory_mib=16_000, gpu_memory_mib=24_000))

specs = st.builds(
    lambda whole, n, milli, replicas, cpu, mem, gmem, models: JobSpec(
        team="ml", queue="q", gpus=n if whole else 1, gpu_milli=0 if whole else milli, replicas=replicas,
        cpu_milli=cpu, memory_mib=mem, gpu_memory_mib=gmem, gpu_models=tuple(models)),
    st.booleans(), st.integers(1, 4), st.integers(1, 999), st.integers(1, 3), st.integers(0, 9000),
    st.integers(0, 40_000), st.integers(0, 50_000), st.lists(st.sampled_from(["A100", "H100", "L4"]), max_size=2))
steps = st.lists(st.one_of(st.tuples(st.just("place"), specs), st.tuples(st.just("release"), st.integers(0, 50))),
                 max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_random_placements_and_releases_never_over_allocate_anything(ops) -> None:
    c = cluster(*SMALL)
    initial = free(c)
    running: list[tuple[ReplicaPlacement, ...]] = []
    for op, arg in ops:
        if op == "place":
            before = free(c)
            result = place_gang(c, arg)
            if isinstance(result, Shortfall):
                assert free(c) == before
            else:
                assert len(result) == arg.replicas
                for p in result:
                    gpus = [c.nodes[p.node].gpu(i) for i in p.gpu_indices]
                    assert len(set(p.gpu_indices)) == len(gpus) == (1 if arg.gpu_milli else arg.gpus)
                    assert {g.model for g in gpus} == {p.model}
                    assert not arg.gpu_models or p.model in arg.gpu_models
                running.append(result)
        elif running:
            c.release(running.pop(arg % len(running)))
        for n in c.sorted_nodes():
            assert n.free_cpu_milli >= 0 and n.free_memory_mib >= 0
            for g in n.gpus:
                assert 0 <= g.free_milli <= 1000 and 0 <= g.free_memory_mib <= g.memory_mib
        # The running total placement reads instead of summing every GPU agrees with the sum.
        assert c.usable_free_milli() == sum(g.free_milli for n in c.sorted_nodes() if n.online for g in n.gpus
                                            if g.healthy)
    for placements in running:
        c.release(placements)
    assert free(c) == initial


# --- the decider ----------------------------------------------------------------------------------

def placement(*nodes) -> EventFeed:
    feed = EventFeed(PlacementDecider())
    feed.nodes(*(nodes or (node("a", 4), node("b", 4))))
    return feed


def test_a_job_with_reserved_quota_is_placed_at_once() -> None:
    feed = placement()
    [placed] = feed.reserve("j", job().gpus(3).host(cpu_milli=500))
    assert isinstance(placed, JobPlaced) and placed.policy == "packing" and placed.correlation_id == "j"
    assert placed.placements == (ReplicaPlacement(replica=0, node="a", gpu_indices=(0, 1, 2), gpu_milli=1000,
                                                  cpu_milli=500, model="A100"),)
    assert [p.node for p in of(feed.reserve("k", job().gpus(1)), JobPlaced)[0].placements] == ["a"]


@pytest.mark.parametrize(("j", "code"), [
    pytest.param(job().gpus(4).replicas(2), "insufficient_gpus", id="insufficient_gpus"),
    pytest.param(job().gpus(1).models("H100"), "no_model_match", id="no_model_match"),
    pytest.param(job().gpus(2), "fragmentation", id="fragmentation"),
])
def test_a_job_that_does_not_fit_is_deferred_with_the_reason(j: Job, code: str) -> None:
    feed = placement()
    feed.reserve("x", job().gpus(3))  # a tie: the first node, a
    feed.reserve("y", job().gpus(3))  # a has one idle GPU left, so b
    [deferred] = feed.reserve("j", j)
    assert isinstance(deferred, PlacementDeferred) and (deferred.job_id, deferred.code) == ("j", code)


def test_a_deferral_is_emitted_once_per_reason_and_the_job_is_placed_when_room_appears() -> None:
    feed = placement(node("a", 4))
    feed.reserve("x", job().gpus(3))
    assert [d.code for d in feed.reserve("y", job().gpus(2))] == ["insufficient_gpus"]
    assert [d.code for d in feed.nodes(node("b", 1))] == ["fragmentation"]
    assert feed.nodes(node("c", 1)) == []
    assert feed.send(GpuHealthChanged, node="c", index=0, healthy=True, reason="ok") == []
    [placed] = feed.send(JobFinished, job_id="x")
    assert [(p.node, p.gpu_indices) for p in placed.placements] == [("a", (0, 1))]


def test_freed_capacity_goes_to_waiting_jobs_by_priority_and_a_big_one_does_not_block_the_rest() -> None:
    feed = placement(node("a", 4))
    feed.reserve("x", job().gpus(4))
    feed.reserve("batch", job().gpus(2).priority("batch"))
    feed.reserve("training", job().gpus(4))
    feed.reserve("urgent", job().gpus(2).priority("urgent"))
    feed.reserve("urgent2", job().gpus(2).priority("urgent"))
    assert brief(feed.send(JobFinished, job_id="x")) == [("JobPlaced", "urgent"), ("JobPlaced", "urgent2")]
    assert brief(feed.send(JobFinished, job_id="urgent")) == [("JobPlaced", "batch")]
    assert feed.send(JobFinished, job_id="urgent2") == []  # 2 GPUs free: not even tried
    assert brief(feed.send(JobFinished, job_id="batch")) == [("JobPlaced", "training")]


def test_a_cancelled_waiting_job_is_never_placed() -> None:
    feed = placement(node("a", 4))
    feed.reserve("x", job().gpus(4))
    feed.reserve("y", job().gpus(2))
    assert feed.send(JobCancelled, job_id="y", reason="user_request") == []
    assert feed.send(JobFinished, job_id="x") == []
    assert feed.send(QuotaReserved, job_id="y", queue="ml-train", gpu_milli=2000) == []


def test_a_late_end_report_for_a_job_waiting_again_ends_its_wait_and_breaks_nothing() -> None:
    """An executor's late word on an earlier run (finished) while the job waits with quota reserved again: the job
    is over, and the jobs behind it are placed as before."""
    feed = placement(node("a", 4))
    feed.reserve("x", job().gpus(4))
    feed.reserve("y", job().gpus(2))  # waits behind x
    assert brief(feed.send(JobEvicted, job_id="x", reason="preempted")) == [("JobPlaced", "y")]
    assert kinds(feed.send(QuotaReserved, job_id="x", queue="ml-train", gpu_milli=4000)) == ["PlacementDeferred"]
    assert feed.send(JobFinished, job_id="x") == []  # about the evicted run, late
    assert brief(feed.send(JobFinished, job_id="y")) == []  # x no longer waits: nothing to place, no error
    feed.reserve("z", job().gpus(4))
    assert [type(e).__name__ for e in feed.log[-2:]] == ["QuotaReserved", "JobPlaced"]


def test_an_evicted_job_gives_its_gpus_back_and_is_placed_again_when_its_quota_is_reserved_again() -> None:
    feed = placement(node("a", 4))
    feed.reserve("x", job().gpus(4))
    feed.reserve("y", job().gpus(2))
    assert brief(feed.send(JobEvicted, job_id="x", reason="preempted")) == [("JobPlaced", "y")]
    [deferred] = feed.send(QuotaReserved, job_id="x", queue="ml-train", gpu_milli=4000)
    assert isinstance(deferred, PlacementDeferred) and deferred.code == "insufficient_gpus"


def test_a_lost_node_takes_no_new_work() -> None:
    feed = placement()
    feed.send(NodeLost, node="a", reason="heartbeat")
    assert [p.node for p in feed.reserve("j", job().gpus(1))[0].placements] == ["b"]
    assert [d.code for d in feed.reserve("k", job().gpus(4))] == ["insufficient_gpus"]


def test_a_job_waiting_for_capacity_past_the_starvation_limit_gets_it_held_while_short_jobs_backfill() -> None:
    from contracts import ClockTick, PlacementDeferred, SchedulingSettings, SchedulingSettingsChanged

    feed = pipeline()
    feed.queues(queue("ml-train", "ml"))
    feed.nodes(node("a", 4))
    feed.send(SchedulingSettingsChanged, version=1, settings=SchedulingSettings(starvation_after_s=100.0))
    feed.at(0.0)
    for i in range(4):
        feed.submit(f"s{i}", job().gpus(1).having(duration_s=1000.0))
    assert kinds(feed.at(1.0).submit("big", job().gpus(4)))[-1] == "PlacementDeferred"
    feed.at(2.0).send(JobFinished, job_id="s0")
    # Before the limit a small job simply takes the free GPU.
    assert kinds(feed.at(3.0).submit("early", job().gpus(1).having(duration_s=500.0)))[-1] == "JobPlaced"
    feed.at(200.0).send(ClockTick)
    feed.at(201.0).send(JobFinished, job_id="s1")
    # Past it: a job without a declared runtime would delay the big job, so it is held...
    held = of(feed.at(202.0).submit("late", job().gpus(1)), PlacementDeferred)
    assert [(d.job_id, d.code) for d in held] == [("late", "held_for_starving_job")]
    # ...while one that ends before the big job could start (the others end at 1000) backfills.
    # (an estimate is not enough: only a limit the executor enforces makes it sure to end in time)
    assert kinds(feed.at(203.0).submit("guess", job().gpus(1).having(duration_s=10.0)))[-1] == "PlacementDeferred"
    assert kinds(feed.at(203.0).submit("short", job().gpus(1).having(max_runtime_s=10.0)))[-1] == "JobPlaced"
