"""MIG instances: only profiles the GPU has (NVIDIA's tables per model and memory), counted by compute slices
and memory slices; a GPU serves MIG instances or shares (fractions, whole GPUs), never both at once; and one
figure, compute slices over 7, is the share of a GPU an instance is charged by quota, placement and
accounting alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import GpuSpec, JobFinished, JobPlaced, JobSpec, NodeSpec, PlacementDeferred, QuotaReserved
from libs.core.accounting.state import requested_gpus
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.shortfall import Shortfall
from libs.core.kernel.mig_profiles import compute_slices, instance_milli, lookup, memory_slices, product
from libs.core.kernel.policy import demand_milli
from libs.core.placement.decider import PlacementDecider
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario
from tests.unit.builders import EventFeed, job, of, pipeline, queue

A100_40, A100_80, H100_80, H200_141 = 40_960, 81_920, 81_559, 143_771


def spec(**fields: object) -> JobSpec:
    return JobSpec(team="ml", queue="ml-train", **fields)  # type: ignore[arg-type]


def gpu_node(name: str, model: str = "A100", memory_mib: int = A100_80, mig: bool = True, gpus: int = 1) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=64_000, memory_mib=512_000,
                    gpus=tuple(GpuSpec(index=i, model=model, memory_mib=memory_mib, mig_enabled=mig)
                               for i in range(gpus)))


def instances(placer: Placer, profile: str, most: int = 20) -> int:
    """How many instances of `profile` fit, placed one by one."""
    count = 0
    for _ in range(most):
        if isinstance(placer.place_gang(spec(mig_profile=profile)), Shortfall):
            break
        count += 1
    return count


def placer_on(*nodes: NodeSpec) -> tuple[Cluster, Placer]:
    c = Cluster()
    for n in nodes:
        c.register(n)
    return c, Placer(c)


# --- the profile tables ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "memory", "profile", "expected"), [
    pytest.param("A100", A100_40, "1g.5gb", (1, 1), id="A100 40 GB: 1g.5gb"),
    pytest.param("A100", A100_40, "1g.10gb", (1, 2), id="A100 40 GB: 1g.10gb has 2 memory slices"),
    pytest.param("A100", A100_40, "3g.40gb", None, id="A100 40 GB has no 3g.40gb"),
    pytest.param("A100", A100_80, "1g.5gb", None, id="A100 80 GB has no 1g.5gb"),
    pytest.param("A100", A100_80, "4g.40gb", (4, 4), id="A100 80 GB: 4g.40gb"),
    pytest.param("H100", H100_80, "7g.80gb", (7, 8), id="H100 80 GB: 7g.80gb"),
    pytest.param("H100", 95_830, "3g.47gb", (3, 4), id="H100 94 GB: 3g.47gb"),
    pytest.param("H100", 97_871, "3g.48gb", (3, 4), id="H100 96 GB: 3g.48gb"),
    pytest.param("H200", H200_141, "1g.35gb", (1, 2), id="H200 141 GB: 1g.35gb"),
    pytest.param("H200", H200_141, "3g.71gb", (3, 4), id="H200 141 GB: 3g.71gb"),
    pytest.param("H200", H200_141, "3g.40gb", None, id="H200 has no 3g.40gb"),
    pytest.param("A30", 24_576, "2g.12gb", (2, 2), id="A30: 2 of its 4 slices"),
    pytest.param("A100", A100_80, "banana", None, id="not a profile"),
    pytest.param("A100", A100_80, "1g.999gb", None, id="no such memory part"),
    pytest.param("T4", 15_360, "1g.5gb", None, id="a GPU without MIG"),
    pytest.param("A100", 0, "1g.10gb", None, id="memory unknown: no table"),
])
def test_a_profile_is_valid_only_on_the_gpu_whose_table_has_it(model, memory, profile, expected) -> None:
    found = lookup(model, memory, profile)
    gpu = product(model, memory)
    assert (None if found is None or gpu is None else (found.slices, memory_slices(gpu, found))) == expected


def test_an_instances_share_is_its_compute_slices_over_the_gpus() -> None:
    assert [instance_milli(p) for p in ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")] == [
        142, 285, 428, 571, 1000]
    assert instance_milli("1g.6gb") == 250  # an A30 has 4 compute slices
    assert instance_milli("banana") == instance_milli("1g.999gb") == 0
    assert compute_slices("3g.40gb") == 3 and compute_slices("banana") == 0
    mig = spec(gpus=1, mig_profile="3g.40gb", replicas=2)
    assert demand_milli(mig) == 2 * instance_milli("3g.40gb") == 856
    assert requested_gpus(mig) == pytest.approx(0.856)


# --- placement by the tables -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("memory", "profile", "most"), [
    pytest.param(A100_40, "1g.5gb", 7, id="seven 1-slice instances"),
    pytest.param(A100_40, "1g.10gb", 4, id="1g.10gb: memory slices run out first"),
    pytest.param(A100_80, "1g.20gb", 4, id="1g.20gb on 80 GB: memory slices run out first"),
    pytest.param(A100_80, "2g.20gb", 3, id="three 2-slice instances"),
    pytest.param(A100_80, "3g.40gb", 2, id="two 3-slice instances"),
    pytest.param(A100_80, "7g.80gb", 1, id="the whole GPU"),
    pytest.param(A100_80, "banana", 0, id="an unknown profile: never"),
    pytest.param(A100_80, "1g.999gb", 0, id="a memory part no GPU has: never"),
    pytest.param(A100_80, "1g.5gb", 0, id="a profile of another GPU: never"),
])
def test_instances_fit_by_compute_and_memory_slices_of_valid_profiles_only(memory, profile, most) -> None:
    c, placer = placer_on(gpu_node("m", memory_mib=memory))
    assert instances(placer, profile) == most
    gpu = c.nodes["m"].gpus[0]
    assert gpu.free_slices >= 0 and gpu.free_memory_mib >= 0 and gpu.free_milli >= 0


@pytest.mark.parametrize(("model", "memory", "first", "second", "most"), [
    pytest.param("H100", H100_80, "3g.40gb", "3g.40gb", 1, id="H100 reporting 81559 MiB holds two 3g.40gb"),
    pytest.param("H200", H200_141, "3g.71gb", "4g.71gb", 1, id="H200: 3g.71gb beside 4g.71gb"),
    pytest.param("A30", 24_576, "2g.12gb", "1g.6gb", 2, id="A30: its 4 slices"),
    pytest.param("A100", A100_80, "1g.10gb+me", "1g.10gb+me", 0, id="one media-extension instance per GPU"),
])
def test_the_tables_slices_on_other_gpus(model, memory, first, second, most) -> None:
    _, placer = placer_on(gpu_node("m", model=model, memory_mib=memory))
    assert instances(placer, first, most=1) == 1
    assert instances(placer, second) == most


def test_slices_and_memory_left_by_one_profile_serve_another() -> None:
    c, placer = placer_on(gpu_node("m"))
    assert instances(placer, "4g.40gb") == 1
    assert instances(placer, "1g.20gb") == 2  # 3 compute slices left but 4 memory slices: two 2-slice memories
    assert instances(placer, "1g.10gb") == 0
    gpu = c.nodes["m"].gpus[0]
    assert (gpu.free_slices, gpu.free_memory_mib) == (1, A100_80 - 8 * (A100_80 // 8))


def test_an_invalid_profile_is_explained() -> None:
    _, placer = placer_on(gpu_node("m"))
    result = placer.place_gang(spec(mig_profile="banana"))
    assert isinstance(result, Shortfall) and "banana" in result.message


# --- MIG and shares exclusive on one GPU ---------------------------------------------------------------------

def test_a_gpu_holding_a_fraction_takes_no_mig_instance_when_mig_is_turned_on_until_the_fraction_ends() -> None:
    decider = PlacementDecider()
    feed = EventFeed(decider)
    feed.nodes(gpu_node("g", mig=False))
    assert len(of(feed.reserve("half", job().fraction(500)), JobPlaced)) == 1
    feed.nodes(gpu_node("g", mig=True))
    out = [d for i in range(7) for d in feed.reserve(f"mig-{i}", job(mig_profile="1g.10gb"))]
    assert of(out, JobPlaced) == []
    out = feed.send(JobFinished, job_id="half")
    assert sorted(p.job_id for p in of(out, JobPlaced)) == [f"mig-{i}" for i in range(7)]
    assert decider.cluster.nodes["g"].gpus[0].free_slices == 0


def test_a_gpu_holding_mig_instances_takes_no_share_when_mig_is_turned_off_until_they_end() -> None:
    decider = PlacementDecider()
    feed = EventFeed(decider)
    feed.nodes(gpu_node("g", mig=True))
    assert len(of(feed.reserve("mig", job(mig_profile="1g.10gb")), JobPlaced)) == 1
    feed.nodes(gpu_node("g", mig=False))
    assert of(feed.reserve("tenth", job().fraction(100)), JobPlaced) == []
    assert of(feed.reserve("whole", job().gpus(1)), JobPlaced) == []
    assert of(feed.reserve("mig-again", job(mig_profile="1g.10gb")), JobPlaced) == []  # MIG is off now
    out = feed.send(JobFinished, job_id="mig")
    assert [p.job_id for p in of(out, JobPlaced)] == ["tenth"]  # the whole GPU waits behind the fraction


# --- one share for quota, placement and accounting -----------------------------------------------------------

def test_quota_placement_and_accounting_charge_an_instance_the_same_share() -> None:
    feed = pipeline(ledger=True)
    feed.queues(queue(nominal_gpus=1))
    feed.nodes(gpu_node("g", memory_mib=A100_80))
    out = feed.submit("mig", job(mig_profile="3g.40gb"))
    (reserved,) = of(out, QuotaReserved)
    (placed,) = of(out, JobPlaced)
    assert reserved.gpu_milli == placed.placements[0].gpu_milli == instance_milli("3g.40gb") == 428
    assert placed.placements[0].gpu_memory_mib == 4 * (A100_80 // 8)
    # A 1-GPU quota holds two such instances (856 milli), not just one.
    out = feed.submit("mig-2", job(mig_profile="3g.40gb"))
    assert len(of(out, QuotaReserved)) == 1 and len(of(out, JobPlaced)) == 1
    assert feed.ledger is not None
    assert feed.ledger.queue_view("ml-train").reserved_gpus == pytest.approx(0.856)
    # A third does not fit the quota. None runs yet (no executor here): the demand counts each at its share.
    assert of(feed.submit("mig-3", job(mig_profile="3g.40gb")), QuotaReserved) == []
    assert feed.ledger.state.demand()["all"] == pytest.approx(3 * 0.428)


# --- the reason a job finds no GPU of its kind --------------------------------------------------------------

def test_a_healthy_gpu_in_mig_mode_is_not_called_unhealthy() -> None:
    c, placer = placer_on(gpu_node("m", mig=True, gpus=2))
    c.set_gpu_health("m", 1, False)
    for request, kind in ((spec(gpus=1), "whole GPUs"), (spec(gpus=1, gpu_milli=500), "a fraction")):
        result = placer.place_gang(request)
        assert isinstance(result, Shortfall) and result.code == "no_model_match"
        assert result.message == f"no GPU of any model takes {kind}: 1 unhealthy, 1 MIG-enabled (MIG profiles only)"


def test_a_gpu_still_held_by_mig_instances_is_named_so() -> None:
    c, placer = placer_on(gpu_node("g", mig=True))
    assert not isinstance(placer.place_gang(spec(mig_profile="1g.10gb")), Shortfall)
    c.register(gpu_node("g", mig=False))  # MIG turned off while its instance runs
    result = placer.place_gang(spec(gpus=1))
    assert isinstance(result, Shortfall) and result.code == "no_model_match"
    assert result.message == "no GPU of any model takes whole GPUs: 1 held by MIG instances"


def test_a_mig_request_says_no_gpu_has_mig_enabled() -> None:
    c, placer = placer_on(gpu_node("w", mig=False, gpus=2), gpu_node("m", mig=True))
    c.set_gpu_health("m", 0, False)
    result = placer.place_gang(spec(mig_profile="1g.10gb"))
    assert isinstance(result, Shortfall) and result.code == "no_model_match"
    assert result.message == "no GPU of any model offers MIG profile 1g.10gb: 1 unhealthy, 2 without MIG enabled"
    c.set_gpu_health("m", 0, True)
    result = placer.place_gang(spec(mig_profile="1g.5gb", gpu_models=("A100",)))  # not in an 80 GB A100's table
    assert isinstance(result, Shortfall)
    assert result.message == ("no GPU of A100 offers MIG profile 1g.5gb: 2 without MIG enabled, "
                              "1 MIG-enabled without 1g.5gb")


def test_no_gpu_of_the_models_in_service_is_said_as_such() -> None:
    c, placer = placer_on(gpu_node("m", mig=True))
    c.set_online("m", False)
    for request in (spec(gpus=1), spec(mig_profile="1g.10gb")):
        result = placer.place_gang(request)
        assert isinstance(result, Shortfall) and result.message == "no GPU of any model on a node in service"


def test_the_pipeline_tells_waiting_jobs_mig_mode_not_ill_health() -> None:
    scenarios = Path(__file__).resolve().parents[3] / "scenarios"
    run = run_scenario(load_scenario(scenarios / "no-gpu-reason-names-mig-mode.yaml"), scenarios)
    told = {e.job_id: e.message for _, e in run.log if isinstance(e, PlacementDeferred) and e.code == "no_model_match"}
    assert told == {"whole": "no GPU of any model takes whole GPUs: 1 MIG-enabled (MIG profiles only)",
                    "frac": "no GPU of any model takes a fraction: 1 MIG-enabled (MIG profiles only)",
                    "slice": "no GPU of any model offers MIG profile 1g.10gb: 1 without MIG enabled"}
    assert run.violations == [] and run.unmet == []
