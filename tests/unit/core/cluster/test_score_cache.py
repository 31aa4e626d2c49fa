"""Scores kept per request shape pick exactly what scoring every node afresh picks, decision by decision, while
placements and releases change the cluster under them (random clusters, loads, requests and policies)."""

from __future__ import annotations

import random

import pytest

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster import score_cache
from libs.core.cluster.arrays import ClusterArrays
from libs.core.cluster.feasibility import Request
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.score_cache import ScoreCache, ShapeScores
from libs.core.cluster.scoring import choose
from tests.unit.core.cluster.test_replay_speed_scoring import (
    random_cluster,
    random_model,
    random_request,
    random_typical,
)


def spec_of(req: Request, replicas: int = 1) -> JobSpec:
    return JobSpec(team="t", queue="q", gpus=req.gpus, gpu_milli=req.milli if req.shared else 0, cpu_milli=req.cpu,
                   gpu_memory_mib=req.gpu_mem, gpu_models=req.models, replicas=replicas)


@pytest.mark.parametrize("seed", range(60))
def test_kept_scores_pick_what_choose_picks(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    cluster, arrays, frag = random_model(rng)
    # Small clusters: exercise both ways of catching up (plain and vectorised) and full rebuilds.
    monkeypatch.setattr(score_cache, "PLAIN_WORK", rng.choice([0, 48, 10_000]))
    monkeypatch.setattr(score_cache, "REBUILD_SHARE", rng.choice([0.0, 0.25, 1.0]))
    requests = [random_request(rng) for _ in range(4)]
    kept: dict[tuple[Request, str, int], ShapeScores] = {}
    placed: list[ReplicaPlacement] = []
    for _ in range(60):
        req = rng.choice(requests)
        policy = rng.choice(["packing", "fgd"])
        salt = rng.choice([0, 3])
        key = (req, policy, salt)
        if key not in kept:
            kept[key] = ShapeScores(arrays, frag, req, policy, salt)
        expected = _choose(arrays, frag, req, policy, salt)
        assert kept[key].pick() == expected, (req, policy, salt)
        if expected is not None and rng.random() < 0.8:  # take it (as the placer would), or give some back
            node = arrays.nodes[expected.row]
            take = ReplicaPlacement(replica=0, node=node.name,
                                    gpu_indices=tuple(node.gpus[j].index for j in expected.gpus),
                                    gpu_milli=req.milli if expected.gpus else 0, cpu_milli=req.cpu,
                                    gpu_memory_mib=req.gpu_mem if expected.gpus else 0)
            cluster.allocate([take])
            placed.append(take)
        elif placed:
            cluster.release([placed.pop(rng.randrange(len(placed)))])
        frag.update(arrays.refresh())


def _choose(arrays: ClusterArrays, frag: FragModel, req: Request, policy: str, salt: int) -> object:
    arrays.refresh()
    return choose(arrays, frag, req, policy, salt)


@pytest.mark.parametrize("seed", range(20))
def test_placer_places_the_same_with_and_without_kept_scores(seed: int) -> None:
    """Whole runs through Placer: the same placements, in the same order, with the cache on and off."""
    outcomes = []
    rng_state = random.Random(seed).getstate()
    for cache in (True, False):
        rng = random.Random()
        rng.setstate(rng_state)
        cluster = random_cluster(rng)
        placer = Placer(cluster, random_typical(rng), score_cache=cache)
        # Gangs of up to three replicas: each replica is placed after the one before changed the cluster.
        requests = [spec_of(random_request(rng), rng.choice([1, 1, 2, 3])) for _ in range(3)]
        log: list[object] = []
        held: list[tuple[ReplicaPlacement, ...]] = []
        for i in range(80):
            if held and rng.random() < 0.3:
                cluster.release(held.pop(rng.randrange(len(held))))
                continue
            spec = rng.choice(requests)
            result = placer.place_gang(spec, rng.choice(["packing", "fgd", "best-fit"]), salt=i % 2)
            if isinstance(result, tuple):
                held.append(result)
                log.append(tuple((p.node, p.gpu_indices, p.gpu_milli) for p in result))
            else:
                log.append(result.code)
        outcomes.append(log)
    assert outcomes[0] == outcomes[1]


def test_a_rare_shape_is_scored_afresh_until_it_comes_back() -> None:
    rng = random.Random(5)
    cluster = random_cluster(rng)
    while not cluster.sorted_nodes():
        cluster = random_cluster(rng)
    arrays = ClusterArrays(cluster)
    frag = FragModel(arrays, random_typical(rng))
    cache = ScoreCache()
    req = Request.of(JobSpec(team="t", queue="q", gpus=1))
    assert cache.scores(arrays, frag, req, "packing", 0) is None  # first ask: nothing kept
    scores = cache.scores(arrays, frag, req, "packing", 0)
    assert scores is not None  # back soon: kept from now on
    assert cache.scores(arrays, frag, req, "packing", 0) is scores
    # Another fragmentation model (new typical shapes): the kept scores are for the old one.
    other = FragModel(arrays, random_typical(rng))
    assert cache.scores(arrays, other, req, "packing", 0) is not scores
