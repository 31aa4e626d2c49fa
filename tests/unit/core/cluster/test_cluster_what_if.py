"""Cluster.what_if: a trial of allocations and releases on the live cluster, rolled back as a whole."""

from __future__ import annotations

import pytest

from contracts import ReplicaPlacement
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from tests.unit.builders import job, node, spec_of


def whole(name: str, *indices: int, milli: int = 1000) -> tuple[ReplicaPlacement, ...]:
    return (ReplicaPlacement(replica=0, node=name, gpu_indices=indices, gpu_milli=milli, cpu_milli=1000,
                             memory_mib=1024),)


def two_nodes() -> Cluster:
    cluster = Cluster()
    cluster.register(node("a", gpus=4))
    cluster.register(node("b", gpus=4))
    cluster.allocate(whole("a", 0, 1))
    return cluster


def state(cluster: Cluster) -> tuple[object, ...]:
    return (cluster.free_total, tuple(
        (n.name, n.free_cpu_milli, n.free_memory_mib, n.free_rdma_nics,
         tuple((g.free_milli, g.free_memory_mib, g.mig_held, tuple(sorted(g.fractions.items()))) for g in n.gpus))
        for n in cluster.sorted_nodes()))


def test_every_change_inside_a_what_if_is_rolled_back_whoever_made_it() -> None:
    cluster = two_nodes()
    before = state(cluster)
    with cluster.what_if() as trial:
        trial.release(whole("a", 0, 1))
        cluster.allocate(whole("b", 2, milli=300))  # made on the cluster itself: recorded all the same
        Placer(cluster).place_gang(spec_of(job(gpus=4)))
        assert state(cluster) != before
    assert state(cluster) == before


def test_a_kept_what_if_stands_and_an_enclosing_one_rolls_it_back_with_its_own() -> None:
    cluster = two_nodes()
    before = state(cluster)
    with cluster.what_if():
        cluster.release(whole("a", 0))
        with cluster.what_if() as inner:
            cluster.allocate(whole("b", 0, 1, 2))
            inner.keep()
        kept = state(cluster)
        with cluster.what_if():
            cluster.allocate(whole("b", 3))
        assert state(cluster) == kept  # the nested trial that did not keep rolled back only its own change
    assert state(cluster) == before


def test_a_kept_what_if_outside_any_other_leaves_its_changes() -> None:
    cluster = two_nodes()
    with cluster.what_if() as trial:
        trial.allocate(whole("b", 0))
        trial.keep()
    assert cluster.nodes["b"].gpus[0].free_milli == 0
    with cluster.what_if():
        pass
    assert cluster.nodes["b"].gpus[0].free_milli == 0


def test_an_error_inside_a_what_if_still_rolls_it_back() -> None:
    cluster = two_nodes()
    before = state(cluster)
    with pytest.raises(ValueError), cluster.what_if():
        cluster.allocate(whole("b", 0))
        raise ValueError
    assert state(cluster) == before


def test_array_views_hear_of_every_node_a_rolled_back_trial_touched() -> None:
    cluster = two_nodes()
    arrays = ClusterArrays(cluster)
    arrays.refresh()
    with cluster.what_if():
        cluster.allocate(whole("b", 0))
        arrays.refresh()
    assert arrays.refresh() == [arrays.index["b"]]
    assert arrays.free_rows[arrays.index["b"]][0] == 1000


def test_node_events_are_refused_inside_a_what_if() -> None:
    cluster = two_nodes()
    with pytest.raises(RuntimeError), cluster.what_if():
        cluster.cordon("a", True)
    assert cluster.nodes["a"].online
