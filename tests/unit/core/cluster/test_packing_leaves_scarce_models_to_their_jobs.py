"""packing breaks FGD's ties for a request of GPUs toward the least contended GPU model: work free to go
anywhere leaves the models that few GPUs serve to the requests limited to them."""

from __future__ import annotations

import pytest

from contracts import GpuSpec, NodeSpec
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.feasibility import Request
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.model import Cluster
from libs.core.cluster.score_cache import ShapeScores
from libs.core.cluster.scoring import choose
from libs.core.cluster.shapes import Shape, TypicalShapes


def cluster_of(models: list[str]) -> Cluster:
    cluster = Cluster()
    for n, model in enumerate(models):
        gpus = tuple(GpuSpec(index=i, model=model, memory_mib=16000) for i in range(2))
        cluster.register(NodeSpec(name=f"n{n:02d}", gpus=gpus, cpu_milli=32000, memory_mib=65536))
    return cluster


# One node of T4 (two GPUs) against three of A100 (six GPUs); as many requests limited to each model.
TYPICAL = TypicalShapes((Shape(cpu_milli=1000, gpu_milli=1000, gpus=1),
                         Shape(cpu_milli=1000, gpu_milli=1000, gpus=1, models=("T4",)),
                         Shape(cpu_milli=1000, gpu_milli=1000, gpus=1, models=("A100",))), (10, 10, 10))
FREE = Request(milli=1000, gpus=1, cpu=1000, mem=0, gpu_mem=0, rdma=0, models=())


def test_contention_is_demand_over_the_gpus_a_limited_shape_may_use() -> None:
    arrays = ClusterArrays(cluster_of(["T4", "A100", "A100", "A100"]))
    frag = FragModel(arrays, TYPICAL, multi_copy=True)
    t4 = 10 * 1000 * 1_000_000 // 2
    a100 = 10 * 1000 * 1_000_000 // 6
    assert [frag.contention[arrays.index[f"n{n:02d}"]] for n in range(4)] == [t4, a100, a100, a100]


@pytest.mark.parametrize("salt", range(8))
def test_packing_leaves_the_scarce_model_to_the_requests_that_need_it(salt: int) -> None:
    arrays = ClusterArrays(cluster_of(["T4", "A100", "A100", "A100"]))
    frag = FragModel(arrays, TYPICAL, multi_copy=True)
    t4 = arrays.index["n00"]
    choice = choose(arrays, frag, FREE, "packing", salt)
    assert choice is not None and choice.row != t4
    assert ShapeScores(arrays, frag, FREE, "packing", salt).pick() == choice
    # A request limited to T4 still goes there; FGD alone breaks the tie by the salted order.
    limited = Request(milli=1000, gpus=1, cpu=1000, mem=0, gpu_mem=0, rdma=0, models=("T4",))
    assert choose(arrays, frag, limited, "packing", salt) == choose(arrays, frag, limited, "fgd", salt)


def test_fgd_alone_sends_free_work_to_the_scarce_model_for_some_salt() -> None:
    arrays = ClusterArrays(cluster_of(["T4", "A100", "A100", "A100"]))
    frag = FragModel(arrays, TYPICAL, multi_copy=True)
    t4 = arrays.index["n00"]
    rows = set()
    for salt in range(16):
        choice = choose(arrays, frag, FREE, "fgd", salt)
        assert choice is not None
        rows.add(choice.row)
    assert t4 in rows
