"""packing measures fragmentation against the typical shapes and also the rare ones that only a small part
of the cluster can host, so that work free to go anywhere leaves those nodes to them; FGD keeps its own
typical shapes."""

from __future__ import annotations

import pytest

from contracts import GpuSpec, JobSpec, NodeSpec
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.fragmentation import packing_shapes
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.shapes import Shape, typical_from_counts

ONE_GPU = Shape(cpu_milli=12000, gpu_milli=1000, gpus=1)
BIG_JOB = Shape(cpu_milli=120000, gpu_milli=1000, gpus=8)  # only the 128-core nodes can take it
HALF_GPU = Shape(cpu_milli=4000, gpu_milli=500, gpus=1)  # rare but fits every node
CPU_ONLY = Shape(cpu_milli=2000, gpu_milli=0, gpus=0)


def cluster_of(big: int, small: int, model: str = "G2") -> Cluster:
    cluster = Cluster()
    for n in range(big + small):
        gpus = tuple(GpuSpec(index=i, model=model, memory_mib=32000) for i in range(8))
        cpu = 128000 if n < big else 96000
        cluster.register(NodeSpec(name=f"n{n:02d}", gpus=gpus, cpu_milli=cpu, memory_mib=786432))
    return cluster


def test_the_rare_gpu_shapes_are_kept_apart_most_frequent_first() -> None:
    typical = typical_from_counts({ONE_GPU: 950, HALF_GPU: 30, BIG_JOB: 12, CPU_ONLY: 8})
    assert typical.shapes == (ONE_GPU,)
    assert typical.rare == (HALF_GPU, BIG_JOB)  # CPU-only shapes never fragment GPUs
    assert typical.rare_counts == (30, 12)


def test_packing_adds_the_rare_shapes_few_nodes_can_host() -> None:
    arrays = ClusterArrays(cluster_of(big=2, small=6))
    typical = typical_from_counts({ONE_GPU: 950, HALF_GPU: 30, BIG_JOB: 12})
    packing = packing_shapes(typical, arrays)
    assert packing.shapes == (ONE_GPU, BIG_JOB) and packing.counts == (950, 12)
    # With big nodes the majority of GPUs, the rare big shape is not scarce.
    assert packing_shapes(typical, ClusterArrays(cluster_of(big=5, small=3))).shapes == (ONE_GPU,)


def test_a_rare_shape_limited_to_a_scarce_model_is_added() -> None:
    cluster = cluster_of(big=0, small=6)
    cluster.register(NodeSpec(name="t4", gpus=tuple(GpuSpec(index=i, model="T4", memory_mib=16000)
                                                    for i in range(2)), cpu_milli=96000, memory_mib=65536))
    on_t4 = Shape(cpu_milli=4000, gpu_milli=1000, gpus=1, models=("T4",))
    typical = typical_from_counts({ONE_GPU: 970, on_t4: 30})
    assert packing_shapes(typical, ClusterArrays(cluster)).shapes == (ONE_GPU, on_t4)


def job(shape: Shape, name: str) -> JobSpec:
    return JobSpec(team="t", queue="q", name=name, gpus=shape.gpus, cpu_milli=shape.cpu_milli, memory_mib=1024)


@pytest.mark.parametrize("salt", range(6))
def test_packing_keeps_the_big_nodes_for_the_big_rare_job(salt: int) -> None:
    cluster = cluster_of(big=2, small=6)
    placer = Placer(cluster, typical_from_counts({ONE_GPU: 96, BIG_JOB: 4}))
    small_rows = {f"n{n:02d}" for n in range(2, 8)}
    for i in range(12):
        placed = placer.place_replica(job(ONE_GPU, f"one-{i}"), 0, "packing", salt=salt)
        assert placed is not None and placed.node in small_rows
    for i in range(2):
        assert placer.place_replica(job(BIG_JOB, f"big-{i}"), 0, "packing", salt=salt) is not None


def test_fgd_keeps_its_typical_shapes_next_to_packing() -> None:
    placer = Placer(cluster_of(big=2, small=6), typical_from_counts({ONE_GPU: 96, BIG_JOB: 4}))
    for policy in ("fgd", "packing"):
        assert placer.place_replica(job(ONE_GPU, f"j-{policy}"), 0, policy) is not None
    assert placer.frags["fgd"].cpu.tolist() == [ONE_GPU.cpu_milli]
    assert placer.frags["packing"].cpu.tolist() == [ONE_GPU.cpu_milli, BIG_JOB.cpu_milli]
    assert placer.frags["packing"].multi_copy and not placer.frags["fgd"].multi_copy


def test_fgd_alone_spends_the_big_nodes_for_some_salt() -> None:
    spent = 0
    for salt in range(6):
        placer = Placer(cluster_of(big=2, small=6), typical_from_counts({ONE_GPU: 96, BIG_JOB: 4}))
        for i in range(12):
            placed = placer.place_replica(job(ONE_GPU, f"one-{i}"), 0, "fgd", salt=salt)
            assert placed is not None
            spent += placed.node in ("n00", "n01")
    assert spent > 0
