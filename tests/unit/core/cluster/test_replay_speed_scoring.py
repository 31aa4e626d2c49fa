"""The plain-integer paths of scoring (a few rows of the fragmentation model, a few candidate nodes under FGD
and packing) give exactly what the vectorised ones give, on random clusters, loads and requests."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from contracts import GpuSpec, JobSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster import arrays as arrays_module
from libs.core.cluster import feasibility, fragmentation, scoring
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.feasibility import Request, feasible_rows
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.model import Cluster
from libs.core.cluster.nodes import FULL
from libs.core.cluster.scoring import choose
from libs.core.cluster.shapes import Shape, TypicalShapes, shared_pairing

MODELS = ("A100", "V100", "T4")


def random_cluster(rng: random.Random) -> Cluster:
    cluster = Cluster()
    mixing = rng.choice([0.0, 0.1])  # the chance of a GPU of another model than its node's first
    for n in range(rng.randint(1, 12)):
        model = rng.choice(MODELS)
        gpus = tuple(
            GpuSpec(index=i, model=model if rng.random() >= mixing else rng.choice(MODELS),
                    memory_mib=rng.choice([0, 16000, 40000]), healthy=rng.random() < 0.95,
                    mig_enabled=rng.random() < 0.05, nvlink_group=rng.choice([-1, 0, 1]))
            for i in range(rng.choice([1, 2, 4, 8])))
        cluster.register(NodeSpec(name=f"n{n:02d}", gpus=gpus, cpu_milli=rng.choice([8000, 32000, 96000]),
                                  memory_mib=rng.choice([65536, 262144]), rdma_nics=rng.choice([0, 2])))
    for node in cluster.sorted_nodes():  # load: whole and shared GPUs, CPU
        for g in node.gpus:
            r = rng.random()
            if r < 0.35:
                take = FULL
            elif r < 0.6:
                take = rng.choice([100, 250, 500, 750])
            else:
                continue
            cluster.allocate([ReplicaPlacement(replica=0, node=node.name, gpu_indices=(g.index,), gpu_milli=take,
                                               cpu_milli=rng.choice([0, 1000, 4000]))])
    return cluster


def random_typical(rng: random.Random) -> TypicalShapes:
    shapes = {Shape(cpu_milli=rng.choice([100, 2000, 8000]), gpu_milli=rng.choice([0, 250, 350, 500, 650, 1000]),
                    gpus=rng.choice([1, 2, 4]), models=rng.choice([(), (), ("A100",), ("T4", "V100")]))
              for _ in range(rng.randint(1, 7))}
    ordered = sorted(shapes)
    return TypicalShapes(tuple(ordered), tuple(rng.randint(1, 200) for _ in ordered))


def random_request(rng: random.Random) -> Request:
    shared = rng.random() < 0.4
    spec = JobSpec(team="t", queue="q", gpus=rng.choice([0, 1, 1, 2, 4]) if not shared else 1,
                   gpu_milli=rng.choice([100, 250, 350, 500, 650]) if shared else 0,
                   cpu_milli=rng.choice([0, 0, 1000, 16000]), gpu_memory_mib=rng.choice([0, 0, 20000]),
                   gpu_models=rng.choice([(), (), ("A100",), ("V100", "T4")]))
    return Request.of(spec)


def random_model(rng: random.Random) -> tuple[Cluster, ClusterArrays, FragModel]:
    """A random loaded cluster, its arrays and a fragmentation model against random typical shapes."""
    cluster = random_cluster(rng)
    arrays = ClusterArrays(cluster)
    typical = random_typical(rng)
    multi = rng.random() < 0.7
    pairing = shared_pairing(typical) if multi and rng.random() < 0.7 else None
    return cluster, arrays, FragModel(arrays, typical, multi_copy=multi, pairing=pairing)


@pytest.mark.parametrize("seed", range(150))
def test_fragmentation_rows_and_scoring_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    cluster, arrays, frag = random_model(rng)
    n = len(arrays.nodes)

    # A few rows in plain integers, as numpy would (after the load changed under them).
    for node in rng.sample(cluster.sorted_nodes(), min(3, n)):
        cluster.release([ReplicaPlacement(replica=0, node=node.name, gpu_indices=(node.gpus[0].index,),
                                          gpu_milli=rng.choice([100, 250]), cpu_milli=500)])
    rows = arrays.refresh()
    tables = ("spare", "fragp", "fits", "cpu_slack", "idle", "frag", "frag_multi")
    saved = {t: getattr(frag, t).copy() for t in tables}
    frag._update_few(np.asarray(rows, dtype=np.int64))
    few = {t: getattr(frag, t).copy() for t in tables}
    for t in tables:
        getattr(frag, t)[...] = saved[t]
    monkeypatch.setattr(fragmentation, "FEW_ROWS", -1)
    frag.update(rows)
    for t in tables:
        assert (getattr(frag, t) == few[t]).all(), t

    # Usable GPUs and their free share, row by row as over the whole array.
    for models in ((), ("A100",), ("V100", "T4"), ("H100",)):
        for whole in (True, False):
            rowwise = arrays.usable_free(models, whole)
            monkeypatch.setattr(arrays_module, "FEW_NODES", -1)
            assert arrays.usable_free(models, whole) == rowwise
            monkeypatch.setattr(arrays_module, "FEW_NODES", 64)

    # Feasible rows, row by row as over the whole array.
    for _ in range(20):
        req = random_request(rng)
        allowed = None if rng.random() < 0.5 else np.array([rng.random() < 0.6 for _ in range(n)], dtype=bool)
        feasible = feasible_rows(arrays, req, allowed)
        monkeypatch.setattr(arrays_module, "FEW_NODES", -1)
        monkeypatch.setattr(feasibility, "FEW_NODES", -1)
        assert (feasible_rows(arrays, req, allowed) == feasible).all()
        assert feasible.dtype == np.bool_
        monkeypatch.setattr(arrays_module, "FEW_NODES", 64)
        monkeypatch.setattr(feasibility, "FEW_NODES", 64)

    # Candidates scored in plain integers choose what the vectorised scoring chooses.
    for _ in range(40):
        req = random_request(rng)
        policy = rng.choice(["packing", "fgd"])
        salt = rng.choice([0, 0, 7])
        allowed = None if rng.random() < 0.7 else np.array([rng.random() < 0.6 for _ in range(n)], dtype=bool)
        ok = feasible_rows(arrays, req, allowed)
        args = (arrays, frag, req, policy, salt, allowed, ok)
        monkeypatch.setattr(scoring, "FEW_CANDIDATES", 64)
        fast = outcome(*args)
        monkeypatch.setattr(scoring, "FEW_CANDIDATES", -1)
        slow = outcome(*args)
        assert fast == slow, (req, policy)


def outcome(*args: Any) -> object:
    """choose's answer, or the error it raised (odd clusters can make it fail; both paths alike)."""
    try:
        return choose(*args)
    except Exception as err:
        return type(err), str(err)
