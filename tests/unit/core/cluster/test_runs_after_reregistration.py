"""Which runs must stop when their node registers again with another spec."""

from __future__ import annotations

from contracts import GpuSpec, NodeSpec, ReplicaPlacement
from libs.core.cluster.runs_after_reregistration import RunOnNode, runs_to_stop


def node(gpus: int = 2, model: str = "A100", memory: int = 81920, cpu: int = 64000, mem: int = 524288,
         mig: bool = False, rdma: int = 0) -> NodeSpec:
    return NodeSpec(name="n0", gpus=tuple(GpuSpec(index=i, model=model, memory_mib=memory, mig_enabled=mig)
                                          for i in range(gpus)), cpu_milli=cpu, memory_mib=mem, rdma_nics=rdma)


def run(job: str, at: float, indices: tuple[int, ...] = (0,), milli: int = 1000, gpu_mem: int = 0, cpu: int = 0,
        mem: int = 0, rdma: int = 0, models: tuple[str, ...] = (), profile: str = "", where: str = "n0",
        bound: str = "") -> RunOnNode:
    piece = ReplicaPlacement(replica=0, node=where, gpu_indices=indices, gpu_milli=milli, gpu_memory_mib=gpu_mem,
                             cpu_milli=cpu, memory_mib=mem, rdma_nics=rdma)
    return RunOnNode(job, at, (piece,), models, profile, bound)


def test_runs_that_fit_keep_running() -> None:
    runs = [run("a", 0, (0,)), run("b", 1, (1,), cpu=32000, mem=1000)]
    assert runs_to_stop(node(), runs) == []


def test_a_gpu_index_gone_stops_its_run() -> None:
    assert runs_to_stop(node(gpus=1), [run("a", 0, (0,)), run("b", 1, (1,))]) == ["b"]


def test_a_model_the_job_does_not_allow_stops_it() -> None:
    runs = [run("a", 0, models=("A100",)), run("b", 1, (1,))]
    assert runs_to_stop(node(model="H100"), runs) == ["a"]


def test_a_model_other_than_the_one_its_quota_flavor_bound_it_to_stops_it() -> None:
    """A job allowing any model, reserved under A100 quota, was placed on A100 alone and is charged to A100:
    it does not go on on H100; one reserved under the any-model flavor does."""
    runs = [run("bound", 0, bound="A100"), run("any", 1, (1,), models=("A100", "H100"))]
    assert runs_to_stop(node(model="H100"), runs) == ["bound"]
    assert runs_to_stop(node(model="A100"), runs) == []


def test_mig_switched_off_under_a_slice_stops_it() -> None:
    assert runs_to_stop(node(gpus=1, model="H100"), [run("s", 0, milli=142, profile="1g.10gb")]) == ["s"]


def test_mig_switched_on_under_a_share_lets_it_finish() -> None:
    assert runs_to_stop(node(gpus=1, model="H100", mig=True), [run("w", 0, milli=500)]) == []


def test_a_profile_the_new_product_does_not_offer_stops_it() -> None:
    runs = [run("big", 0, milli=571, profile="4g.40gb")]
    assert runs_to_stop(node(gpus=1, model="A100", memory=40960, mig=True), runs) == ["big"]
    assert runs_to_stop(node(gpus=1, model="H100", memory=81920, mig=True), runs) == []


def test_less_cpu_stops_the_latest_placed_run_until_the_rest_fit() -> None:
    runs = [run("early", 0, (0,), cpu=10000), run("late", 5, (1,), cpu=10000), run("gpu-only", 9, (1,), milli=0)]
    assert runs_to_stop(node(cpu=12000), runs) == ["late"]


def test_less_gpu_memory_stops_the_fraction_that_overflows() -> None:
    runs = [run("f1", 0, milli=500, gpu_mem=60000), run("f2", 1, milli=200)]
    # f2 holds its share (20% of the GPU); f1's 60000 MiB cannot fit a 40960 MiB GPU even alone.
    assert runs_to_stop(node(memory=40960), runs) == ["f2", "f1"]
    assert runs_to_stop(node(memory=81920), runs) == []


def test_ties_in_placement_time_break_on_job_id() -> None:
    runs = [run("b", 3, (0,), mem=100), run("a", 3, (1,), mem=100)]
    assert runs_to_stop(node(mem=150), runs) == ["b"]


def test_fewer_rdma_nics_stop_a_run_using_them() -> None:
    runs = [run("a", 0, (0,), rdma=2), run("b", 1, (1,), rdma=2)]
    assert runs_to_stop(node(rdma=2), runs) == ["b"]


def test_runs_on_other_nodes_are_not_judged() -> None:
    assert runs_to_stop(node(gpus=1), [run("elsewhere", 0, (5,), where="n1")]) == []
