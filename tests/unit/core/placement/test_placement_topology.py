"""Placement beyond counting GPUs: NVLink domains, racks and blocks, spread, MIG, RDMA, and the policies.
Plus the invariant over random clusters and requests: nothing is ever allocated beyond its capacity, a gang
is all or nothing, and a required topology is never violated."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import GpuSpec, JobSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import MIG_SLICES
from libs.core.cluster.scoring import POLICIES
from libs.core.cluster.shapes import typical_shapes
from libs.core.cluster.shortfall import Shortfall


def spec(**fields: object) -> JobSpec:
    return JobSpec(team="ml", queue="ml", **fields)  # type: ignore[arg-type]


def node(name: str, gpus: int = 8, model: str = "A100", nvlink: int = 0, mig: bool = False, rack: str = "",
         block: str = "", rdma: int = 0, cpu: int = 96_000) -> NodeSpec:
    labels = {k: v for k, v in (("rack", rack), ("block", block)) if v}
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=1_000_000, rdma_nics=rdma, labels=labels,
                    gpus=tuple(GpuSpec(index=i, model=model, memory_mib=81_920, mig_enabled=mig,
                                       nvlink_group=i // nvlink if nvlink else -1) for i in range(gpus)))


def cluster(*nodes: NodeSpec) -> Cluster:
    c = Cluster()
    for n in nodes:
        c.register(n)
    return c


def take(c: Cluster, name: str, *indices: int) -> None:
    c.allocate([ReplicaPlacement(replica=0, node=name, gpu_indices=indices, gpu_milli=1000)])


# --- NVLink ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "expected"), [
    pytest.param(4, (4, 5, 6, 7), id="four GPUs come from the one NVLink domain that has four idle"),
    pytest.param(2, (2, 3), id="two GPUs take the smaller domain's remainder and keep the whole one intact"),
    pytest.param(5, (2, 3, 4, 5, 6), id="no domain is big enough: the lowest idle GPUs"),
])
def test_a_multi_gpu_replica_gets_gpus_of_one_nvlink_domain_when_possible(gpus: int, expected: tuple[int, ...]) -> None:
    c = cluster(node("a", nvlink=4))
    take(c, "a", 0, 1)
    result = Placer(c).place_gang(spec(gpus=gpus))
    assert not isinstance(result, Shortfall) and result[0].gpu_indices == expected


# --- racks, blocks and spread ----------------------------------------------------------------------------

RACKS = (node("a1", rack="r1", block="b1"), node("a2", rack="r1", block="b1"),
         node("b1", rack="r2", block="b1"), node("b2", rack="r2", block="b2"))


def test_a_gang_that_prefers_a_rack_lands_in_one_rack() -> None:
    c = cluster(*RACKS)
    take(c, "a1", 0)  # rack r1 can no longer host two 8-GPU replicas
    result = Placer(c).place_gang(spec(gpus=8, replicas=2, topology="rack"))
    assert not isinstance(result, Shortfall)
    assert {p.node for p in result} == {"b1", "b2"}


def test_a_preferred_rack_that_is_too_small_does_not_block_the_gang() -> None:
    c = cluster(*RACKS)
    take(c, "a1", 0)
    take(c, "b1", 0)
    result = Placer(c).place_gang(spec(gpus=8, replicas=2, topology="rack"))
    assert not isinstance(result, Shortfall) and {p.node for p in result} == {"a2", "b2"}


def test_a_required_rack_is_never_violated() -> None:
    c = cluster(*RACKS)
    take(c, "a1", 0)
    take(c, "b1", 0)
    result = Placer(c).place_gang(spec(gpus=8, replicas=2, topology="rack", topology_required=True))
    assert isinstance(result, Shortfall) and result.code == "topology"
    assert all(g.free_milli == 1000 for n in ("a2", "b2") for g in c.nodes[n].gpus)  # nothing half-placed


def test_a_required_block_keeps_every_replica_in_the_block() -> None:
    c = cluster(*RACKS)
    result = Placer(c).place_gang(spec(gpus=4, replicas=4, topology="block", topology_required=True))
    assert not isinstance(result, Shortfall)
    assert {c.nodes[p.node].labels["block"] for p in result} == {"b1"}


def test_spread_replicas_land_on_distinct_nodes_even_when_one_node_could_hold_them_all() -> None:
    c = cluster(node("a"), node("b"), node("c"))
    result = Placer(c).place_gang(spec(gpus=1, replicas=3, spread=True), policy="packing")
    assert not isinstance(result, Shortfall) and sorted(p.node for p in result) == ["a", "b", "c"]
    assert isinstance(Placer(c).place_gang(spec(gpus=1, replicas=4, spread=True)), Shortfall)


# --- MIG and RDMA -------------------------------------------------------------------------------------------

def test_mig_profiles_take_slices_of_mig_enabled_gpus_only_and_never_more_than_seven() -> None:
    c = cluster(node("plain", gpus=1), node("mig", gpus=1, mig=True))
    placer = Placer(c)
    first = placer.place_gang(spec(gpus=0, mig_profile="3g.40gb"))
    second = placer.place_gang(spec(gpus=0, mig_profile="4g.40gb"))
    assert not isinstance(first, Shortfall) and not isinstance(second, Shortfall)
    assert [(p.node, p.mig_slices) for p in (*first, *second)] == [("mig", 3), ("mig", 4)]
    assert c.nodes["mig"].gpus[0].free_slices == 0
    assert isinstance(placer.place_gang(spec(gpus=0, mig_profile="1g.10gb")), Shortfall)
    whole = placer.place_gang(spec(gpus=1))  # a whole GPU never lands on a MIG-enabled one
    assert not isinstance(whole, Shortfall) and whole[0].node == "plain"
    assert isinstance(placer.place_gang(spec(gpus=1)), Shortfall)


def test_rdma_nics_are_a_capacity_like_gpus() -> None:
    c = cluster(node("a", rdma=1), node("b", rdma=0))
    placer = Placer(c)
    first = placer.place_gang(spec(gpus=1, rdma_nics=1))
    assert not isinstance(first, Shortfall) and first[0].node == "a"
    assert isinstance(placer.place_gang(spec(gpus=1, rdma_nics=1)), Shortfall)


# --- policies ---------------------------------------------------------------------------------------------------

def test_spread_prefers_the_emptiest_node_and_best_fit_the_fullest() -> None:
    def where(policy: str) -> str:
        c = cluster(node("busy"), node("empty"))
        take(c, "busy", 0, 1, 2, 3, 4)
        result = Placer(c).place_gang(spec(gpus=2), policy=policy)
        assert not isinstance(result, Shortfall)
        return result[0].node

    assert where("spread") == "empty"
    assert where("best-fit") == "busy"
    assert where("packing") == "busy"


def test_fragmentation_aware_policies_keep_whole_gpus_for_the_shapes_that_need_them() -> None:
    # Typical work: mostly 600-milli shares. A 400-milli request should fill the GPU already holding 600 - so
    # the idle GPU stays whole for the next 600 - under both FGD and packing.
    typical = typical_shapes([spec(gpus=1, gpu_milli=600)] * 9 + [spec(gpus=1, gpu_milli=400)])
    for policy in ("fgd", "packing"):
        c = cluster(node("a", gpus=2))
        c.allocate([ReplicaPlacement(replica=0, node="a", gpu_indices=(0,), gpu_milli=600)])
        result = Placer(c, typical).place_gang(spec(gpus=1, gpu_milli=400), policy=policy)
        assert not isinstance(result, Shortfall) and result[0].gpu_indices == (0,), policy


# --- the invariant, over random clusters and requests ----------------------------------------------------------

nodes_st = st.lists(st.builds(
    node, name=st.sampled_from(["n0", "n1", "n2", "n3", "n4"]), gpus=st.integers(1, 8),
    model=st.sampled_from(["A100", "H100"]), nvlink=st.sampled_from([0, 2, 4]), mig=st.booleans(),
    rack=st.sampled_from(["", "r1", "r2"]), rdma=st.integers(0, 2), cpu=st.integers(4_000, 64_000)),
    min_size=1, max_size=5, unique_by=lambda n: n.name)
requests_st = st.lists(st.tuples(
    st.sampled_from(["whole", "fraction", "mig", "cpu"]), st.integers(1, 4), st.integers(1, 999),
    st.integers(1, 3), st.sampled_from(["", "rack", "node"]), st.booleans(), st.booleans(),
    st.integers(0, 16_000), st.sampled_from(POLICIES), st.booleans()), max_size=30)


# The profiles of the 80 GB GPUs the strategy registers, and one no GPU has.
MIG_PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "banana")


def request_spec(kind: str, gpus: int, milli: int, replicas: int, topology: str, required: bool, spread: bool,
                 cpu: int) -> JobSpec:
    shape: dict[str, object] = {"gpus": gpus}
    if kind == "fraction":
        shape = {"gpus": 1, "gpu_milli": milli}
    elif kind == "mig":
        shape = {"gpus": 0, "mig_profile": MIG_PROFILES[milli % len(MIG_PROFILES)]}
    elif kind == "cpu":
        shape = {"gpus": 0}
    return spec(replicas=replicas, topology=topology, topology_required=required, spread=spread, cpu_milli=cpu,
                rdma_nics=milli % 2, **shape)


@settings(max_examples=150, deadline=None)
@given(nodes_st, requests_st)
def test_nothing_is_ever_allocated_beyond_capacity_and_gangs_are_all_or_nothing(nodes, requests) -> None:
    c = cluster(*nodes)
    placer = Placer(c, typical_shapes([spec(gpus=1, gpu_milli=500), spec(gpus=2)]))
    live: list[tuple[ReplicaPlacement, ...]] = []
    for kind, gpus, milli, replicas, topology, required, spread, cpu, policy, release in requests:
        if release and live:
            c.release(live.pop(0))
            continue
        before = msgspec.json.encode([[g.free_milli for g in n.gpus] for n in c.sorted_nodes()])
        s = request_spec(kind, gpus, milli, replicas, topology, required, spread, cpu)
        result = placer.place_gang(s, policy=policy)
        if isinstance(result, Shortfall):
            assert msgspec.json.encode([[g.free_milli for g in n.gpus] for n in c.sorted_nodes()]) == before
            continue
        assert len(result) == s.replicas
        if spread:
            assert len({p.node for p in result}) == s.replicas
        if topology and required:
            key = (lambda p: p.node) if topology == "node" else (lambda p: c.nodes[p.node].labels.get("rack", ""))
            assert len({key(p) for p in result}) == 1 and key(result[0]) != ""
        for p in result:
            n = c.nodes[p.node]
            assert len({n.gpu(i).model for i in p.gpu_indices}) <= 1  # one model per replica
            assert all(n.gpu(i).mig_enabled == bool(s.mig_profile) for i in p.gpu_indices)
        live.append(result)
        for n in c.sorted_nodes():
            assert n.free_cpu_milli >= 0 and n.free_memory_mib >= 0 and n.free_rdma_nics >= 0
            for g in n.gpus:
                assert 0 <= g.free_milli <= 1000 and 0 <= g.free_slices <= MIG_SLICES and g.free_memory_mib >= 0
                assert g.mig_instances == 0 or g.free_milli + g.mig_milli == 1000  # MIG or shares, never both
    for placements in live:
        c.release(placements)
    assert all(g.free_milli == 1000 for n in c.sorted_nodes() for g in n.gpus)
