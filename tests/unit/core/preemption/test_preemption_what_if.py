"""Preemption's what-ifs run on the decider's own book and cluster inside their what-ifs (QuotaBook.what_if,
Cluster.what_if): a simulation leaves both exactly as it found them, whatever it tried."""

from __future__ import annotations

import copy

import pytest

from contracts import PreemptionDecided
from libs.core.cluster.model import Cluster
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.preemption.candidates import candidates
from libs.core.preemption.decider import PreemptionDecider
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import World
from tests.unit.builders import EventFeed, job, kinds, node, of, pipeline, queue, spec_of


def usage(book: QuotaBook) -> object:
    """Every usage tally of the book, keys and insertion order included."""
    return copy.deepcopy([list(t.items()) for t in (book.used, book.over, book.pool_used, book.subtree,
                                                    book.subtree_all)])


def free(cluster: Cluster) -> object:
    return [(n.name, n.free_cpu_milli, n.free_memory_mib, n.free_rdma_nics,
             [(g.index, g.free_milli, g.free_memory_mib, g.mig_held, sorted(g.fractions.items())) for g in n.gpus])
            for n in cluster.sorted_nodes()], cluster.free_total


def one_in_flight() -> tuple[EventFeed, World]:
    """ml-train (8 GPUs) full of four batch jobs of 2 GPUs on node a; p1's eviction of v4 in flight."""
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    for job_id in ("v1", "v2", "v3", "v4"):
        assert kinds(feed.submit(job_id, job().gpus(2).priority("batch")))[-1] == "JobPlaced"
    assert of(feed.submit("p1", job().gpus(2).priority("urgent")), PreemptionDecided)  # v4's eviction in flight
    decider = next(d for d in feed.deciders if isinstance(d, PreemptionDecider))
    return feed, decider.world


def test_a_simulation_with_evictions_in_flight_leaves_the_deciders_book_and_cluster_as_they_were() -> None:
    feed, world = one_in_flight()
    spec = spec_of(job().gpus(4).priority("urgent"))
    book_before, cluster_before = usage(world.policy.quotas), free(world.cluster)

    with Simulation(world.state, world.policy, world.cluster, spec, [], feed.now, "p2") as sim:
        assert sim.book is world.policy.quotas  # the decider's own book, no copy
        found = candidates(world.state, world.policy, spec, "p2", feed.now)
        victims = sim.choose(found, lambda: sim.admits(ANY) and sim.fits(ANY))
        assert free(world.cluster) == cluster_before  # each placement question rolled back at once

    assert [v.job_id for v in victims] == ["v3", "v2"]  # v4's room is p1's: p2 needs the next two newest
    assert usage(world.policy.quotas) == book_before
    assert free(world.cluster) == cluster_before


def test_a_simulation_that_fails_leaves_the_book_as_it_was() -> None:
    feed, world = one_in_flight()
    spec = spec_of(job().gpus(4).priority("urgent"))
    book_before = usage(world.policy.quotas)
    with pytest.raises(ValueError), Simulation(world.state, world.policy, world.cluster, spec, [], feed.now,
                                               "p2") as sim:
        sim.evict(world.state.running["v1"])
        assert world.policy.quotas.usage("ml-train", ANY) == 6000  # the live book, while the simulation lasts
        raise ValueError("the simulation failed")
    assert usage(world.policy.quotas) == book_before


def test_a_placement_question_rolls_back_the_claims_it_placed() -> None:
    feed, world = one_in_flight()
    spec = spec_of(job().gpus(2).priority("urgent"))
    cluster_before = free(world.cluster)
    with Simulation(world.state, world.policy, world.cluster, spec, [], feed.now, "p2") as sim:
        assert not sim.fits(ANY)  # the node is full, v4's GPUs are p1's claim
        sim.evict(world.state.running["v1"])
        assert sim.fits(ANY)
        assert free(world.cluster) == cluster_before

