"""Request shapes carry the mean memory of their requests; packing's multi-copy measure counts a node's
GPUs that its free memory could not serve as fragment, as it does for CPU."""

from __future__ import annotations

import numpy as np

from contracts import GpuSpec, JobSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.model import Cluster
from libs.core.cluster.shapes import Shape, ShapeWindow, typical_from_counts, typical_shapes

ONE_GPU = Shape(cpu_milli=8000, gpu_milli=1000, gpus=1)


def spec(memory_mib: int, cpu_milli: int = 8000) -> JobSpec:
    return JobSpec(team="t", queue="q", gpus=1, cpu_milli=cpu_milli, memory_mib=memory_mib)


def test_typical_shapes_keep_the_mean_memory_of_each_shape() -> None:
    typical = typical_shapes([spec(1000), spec(3000), spec(2000, cpu_milli=4000)] * 10)
    assert typical.shapes == (ONE_GPU, Shape(cpu_milli=4000, gpu_milli=1000, gpus=1))
    assert typical.memory == (2000, 2000)
    assert typical_from_counts({ONE_GPU: 3}).memory == ()  # unknown when only counts are given


def test_the_window_forgets_the_memory_of_the_submissions_it_drops() -> None:
    window = ShapeWindow(size=2, every=1)
    for mib in (9000, 1000, 3000):
        window.add(spec(mib))
    assert window.typical is not None and window.typical.memory == (2000,)


def two_nodes() -> Cluster:
    cluster = Cluster()
    for name in ("a", "b"):
        gpus = tuple(GpuSpec(index=i, model="A100", memory_mib=40000) for i in range(4))
        cluster.register(NodeSpec(name=name, gpus=gpus, cpu_milli=64000, memory_mib=64000))
    # b's memory is nearly all taken by a CPU-only job: its GPUs can serve one more 16 GiB request, not four.
    cluster.allocate([ReplicaPlacement(replica=0, node="b", gpu_indices=(), gpu_milli=0, memory_mib=40000)])
    return cluster


def test_gpus_that_memory_cannot_serve_count_as_fragment() -> None:
    with_memory = typical_shapes([spec(16000)] * 10)
    arrays = ClusterArrays(two_nodes())
    arrays.refresh()
    frag = FragModel(arrays, with_memory, multi_copy=True)
    a, b = arrays.index["a"], arrays.index["b"]
    assert frag.frag_multi[b] > frag.frag_multi[a]
    # The same shape without its memory: both nodes look alike.
    blind = FragModel(arrays, typical_from_counts({ONE_GPU: 10}), multi_copy=True)
    assert blind.frag_multi[b] == blind.frag_multi[a]
    # after() and after_one() agree with each other on the memory left.
    rows = np.array([a, b], dtype=np.int64)
    v = np.array([1000, 1000], dtype=np.int64)
    vector = frag.after(rows, v, 1, 1000, 8000, multi=True, uniform=True, mem=16000).tolist()
    assert vector == [frag.after_one(r, 1000, 1, 1000, 8000, multi=True, mem=16000) for r in (a, b)]
