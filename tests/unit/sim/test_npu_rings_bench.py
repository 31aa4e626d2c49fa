"""`sim npu-rings`: NPU jobs through a cluster of Ascend 910 servers in virtual time under the three placement
orders; rings kept whole by two of them, broken by the one that ignores them."""

from __future__ import annotations

from contracts import JobSpec
from libs.bench.npu_rings import SimJob, npu_count, npu_servers, run_policy, stranded_for_four
from libs.core.cluster.model import Cluster


def npu_job(i: int, at: float, gpus: int, runtime: float) -> SimJob:
    return SimJob(f"j{i}", at, runtime, JobSpec(team="t", queue="q", gpus=gpus, gpu_models=("Ascend910",)))


# Two 2-NPU jobs then a 1-NPU job, the first ending: rings ignored, the next 2-NPU job straddles two rings.
JOBS = [npu_job(0, 0, 2, 100), npu_job(1, 1, 1, 1000), npu_job(2, 2, 2, 1000), npu_job(3, 150, 2, 1000),
        npu_job(4, 160, 4, 1000)]


def test_keeping_rings_whole_places_no_replica_across_two() -> None:
    for policy in ("gpusched", "volcano"):
        figures = run_policy(policy, npu_servers(1), JOBS)
        assert figures.across_rings == 0 and figures.npu_started == len(JOBS)


def test_ignoring_rings_places_a_replica_across_two() -> None:
    figures = run_policy("ignore_rings", npu_servers(1), JOBS)
    assert figures.across_rings >= 1


def test_trace_counts_round_up_to_what_a_server_gives() -> None:
    assert [npu_count(g) for g in (1, 2, 3, 4, 5, 8, 16)] == [(1, 1), (1, 2), (1, 4), (1, 4), (1, 8), (1, 8), (2, 8)]


def test_stranded_npus_are_those_outside_a_ring_with_four_free() -> None:
    cluster = Cluster()
    for node in npu_servers(1):
        cluster.register(node)
    assert stranded_for_four(cluster) == 0
    node = cluster.nodes["ascend-000"]
    node.gpus[0].free_milli = 0  # ring 0 has 3 free: all 3 stranded for a 4-NPU replica
    assert stranded_for_four(cluster) == 3
