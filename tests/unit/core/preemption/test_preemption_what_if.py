"""Preemption's what-ifs are views: a simulation leaves the decider's quota book and cluster exactly as it found
them, whatever it tried (libs/core/preemption/what_if.py)."""

from __future__ import annotations

import copy

from contracts import NodeRegistered, PreemptionDecided, QueueSpec, ReplicaPlacement
from libs.core.cluster.job_fit import Shortfall
from libs.core.cluster.model import Cluster
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.preemption.candidates import candidates
from libs.core.preemption.decider import PreemptionDecider
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.what_if import ClusterStatement, quota_overlay
from tests.unit.builders import job, kinds, node, of, pipeline, queue, spec_of


def usage(book: QuotaBook) -> object:
    return copy.deepcopy((book.used, book.over, book.pool_used, book.subtree, book.subtree_all))


def free(cluster: Cluster) -> object:
    return [(n.name, n.free_cpu_milli, n.free_memory_mib, n.free_rdma_nics,
             [(g.index, g.free_milli, g.free_memory_mib, g.mig_held) for g in n.gpus])
            for n in cluster.sorted_nodes()], cluster.free_total


def one_node_cluster() -> Cluster:
    cluster = Cluster()
    cluster.apply_node_event(NodeRegistered(id="n", ts=0.0, source="test", node=node("a", 4)))
    return cluster


def on_gpus(*indices: int) -> tuple[ReplicaPlacement, ...]:
    return (ReplicaPlacement(replica=0, node="a", gpu_indices=indices, gpu_milli=1000),)


def test_a_cluster_statement_rolls_back_every_change_and_only_those_after_a_checkpoint() -> None:
    cluster = one_node_cluster()
    cluster.allocate(on_gpus(0, 1, 2, 3))
    before = free(cluster)
    with ClusterStatement(cluster) as statement:
        statement.release([on_gpus(0), on_gpus(1)])
        after_release = free(cluster)
        mark = statement.checkpoint()
        statement.release([on_gpus(2, 3)])
        placed = statement.place_gang(spec_of(job().gpus(4)))
        assert not isinstance(placed, Shortfall)
        assert free(cluster)[1] == 0
        statement.rollback(mark)
        assert free(cluster) == after_release
        assert isinstance(statement.place_gang(spec_of(job().gpus(4))), Shortfall)  # a shortfall changes nothing
        assert free(cluster) == after_release
    assert free(cluster) == before


def test_a_quota_overlay_changes_no_usage_of_its_book() -> None:
    book = QuotaBook()
    book.set_queues([QueueSpec(name="org", team="org"),
                     QueueSpec(name="a", team="a", parent="org", nominal_gpus=2),
                     QueueSpec(name="b", team="b", parent="org", nominal_gpus=2)])
    book.add("a", ANY, 3000)
    before = usage(book)
    view = quota_overlay(book)
    view.add("a", ANY, -3000)
    view.add("b", ANY, 4000, over_budget=True)
    assert usage(book) == before
    assert view.usage("a", ANY) == 0 and book.usage("a", ANY) == 3000
    assert view.limits is book.limits  # the queue tree is shared, never copied


def test_a_simulation_with_evictions_in_flight_leaves_the_deciders_book_and_cluster_as_they_were() -> None:
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    for job_id in ("v1", "v2", "v3", "v4"):
        assert kinds(feed.submit(job_id, job().gpus(2).priority("batch")))[-1] == "JobPlaced"
    assert of(feed.submit("p1", job().gpus(2).priority("urgent")), PreemptionDecided)  # v4's eviction in flight
    decider = next(d for d in feed.deciders if isinstance(d, PreemptionDecider))
    world = decider.world
    spec = spec_of(job().gpus(4).priority("urgent"))
    book_before, cluster_before = usage(world.policy.quotas), free(world.cluster)

    sim = Simulation(world.state, world.policy, world.cluster, spec, [], feed.now, "p2")
    found = candidates(world.state, world.policy, spec, "p2", feed.now)
    victims = sim.choose(found, lambda: sim.admits(ANY) and sim.fits(ANY))

    assert [v.job_id for v in victims] == ["v3", "v2"]  # v4's room is p1's: p2 needs the next two newest
    assert usage(world.policy.quotas) == book_before
    assert free(world.cluster) == cluster_before
