"""Placement keeps the placement guarantees the checker (libs/audit/guarantees) holds every log to:

  - gang_all_or_nothing: a gang goes whole onto ONE GPU model: the model of the flavor quota reserved it on,
    else (no model named, or several) the allowed model that fits it best (the least free capacity that still
    holds it, then the model's name), or it waits, nothing placed;
  - gpu_capacity (memory): a GPU fraction that declares no GPU memory is charged its share of the GPU's
    memory (500 milli of an 80 GiB GPU: 40 GiB), in the fit and in the cluster's free figures, on every path
    of the fit (the row-by-row one of small clusters, the vectorised one, the score cache), and given back
    exactly when it ends, also across a registration that changes the GPU's memory.

Each case runs the real placement decider through `EventFeed` and asserts both the decision and that
`check_safety` finds nothing in the log it made.
"""

from __future__ import annotations

import pytest

from contracts import (
    EventBase,
    GpuSpec,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    NodeSpec,
    PlacementDeferred,
    QuotaReserved,
    ReplicaPlacement,
)
from libs.audit.guarantees import check_safety
from libs.core.cluster.arrays import FEW_NODES
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.shapes import typical_shapes
from libs.core.cluster.shortfall import GANG, Shortfall
from libs.core.kernel.policy import demand_milli
from libs.core.placement.decider import PlacementDecider
from tests.unit.builders import EventFeed, Job, job, node, of

GIB = 1024
A100_80 = 80 * GIB
T4_16 = 16 * GIB
V100_32 = 32 * GIB


def feed_of(*nodes: NodeSpec) -> tuple[EventFeed, PlacementDecider]:
    decider = PlacementDecider()
    feed = EventFeed(decider)
    feed.nodes(*nodes)
    return feed, decider


def reserve(feed: EventFeed, job_id: str, j: Job, flavor: str = "") -> list[EventBase]:
    """Admission's JobSubmitted, then quota's reservation (on `flavor`: "" is the "*" flavor, any model)."""
    return feed.send(JobSubmitted, job_id=job_id, spec=j.spec) + feed.send(
        QuotaReserved, job_id=job_id, queue=j.spec.queue, gpu_milli=demand_milli(j.spec), flavor=flavor)


def safety(feed: EventFeed) -> list[tuple[str, str]]:
    return [(v.guarantee, v.detail) for v in check_safety(list(enumerate(feed.log, start=1)))]


def models_of(placed: JobPlaced) -> list[str]:
    return [p.model for p in placed.placements]


def the_placement(decisions: list[EventBase]) -> JobPlaced:
    (placed,) = of(decisions, JobPlaced)
    return placed


# --- a gang on one GPU model ---------------------------------------------------------------------------------

def t4_and_v100() -> tuple[NodeSpec, NodeSpec]:
    """The recorded demo's case: a node of 2 T4s and a node of 4 V100s with two of them free."""
    return (node("t4", gpus=2, model="T4", gpu_memory_mib=T4_16),
            node("v100", gpus=4, model="V100M32", gpu_memory_mib=V100_32))


def test_a_gang_naming_no_model_is_not_split_across_two_models() -> None:
    feed, decider = feed_of(*t4_and_v100())
    assert len(of(reserve(feed, "busy", job().gpus(2).models("V100M32")), JobPlaced)) == 1  # half the V100s
    out = reserve(feed, "gang", job().gpus(2).replicas(2))
    # 2 T4s and 2 V100s are free: the 2 x 2-GPU gang would fit only across the two models; it waits.
    assert of(out, JobPlaced) == []
    assert [d.code for d in of(out, PlacementDeferred)] == [GANG]
    assert [g.free_milli for n in decider.cluster.sorted_nodes() for g in n.gpus] == [
        1000, 1000, 0, 0, 1000, 1000]  # nothing of the gang left behind
    assert safety(feed) == []


def test_a_gang_naming_no_model_goes_whole_onto_the_one_model_that_holds_it() -> None:
    feed, _ = feed_of(*t4_and_v100(), node("v100-b", gpus=4, model="V100M32", gpu_memory_mib=V100_32))
    placed = the_placement(reserve(feed, "gang", job().gpus(2).replicas(2)))
    assert models_of(placed) == ["V100M32", "V100M32"]
    assert sorted(p.replica for p in placed.placements) == [0, 1]
    assert all(len(p.gpu_indices) == 2 and p.gpu_milli == 1000 for p in placed.placements)
    assert safety(feed) == []


def test_among_models_that_each_hold_the_gang_the_best_fit_is_chosen() -> None:
    # T4: 4 GPUs free in all, V100: 8 free. Both hold the 2 x 2-GPU gang; best fit takes the one left fullest
    # (the fewest GPUs free), so the V100 pool stays whole for bigger work.
    feed, _ = feed_of(node("t4-a", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("t4-b", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("v100-a", gpus=4, model="V100M32", gpu_memory_mib=V100_32),
                      node("v100-b", gpus=4, model="V100M32", gpu_memory_mib=V100_32))
    placed = the_placement(reserve(feed, "gang", job().gpus(2).replicas(2)))
    assert models_of(placed) == ["T4", "T4"]
    assert sorted(p.node for p in placed.placements) == ["t4-a", "t4-b"]
    assert safety(feed) == []


def test_the_best_fit_model_is_skipped_when_the_gang_does_not_fit_there_in_one_piece() -> None:
    # The T4s have the least free (4 GPUs) but in pieces of 1 per node: a replica of 2 GPUs fits no T4 node.
    feed, _ = feed_of(*(node(f"t4-{i}", gpus=1, model="T4", gpu_memory_mib=T4_16) for i in range(4)),
                      node("v100-a", gpus=4, model="V100M32", gpu_memory_mib=V100_32),
                      node("v100-b", gpus=4, model="V100M32", gpu_memory_mib=V100_32))
    placed = the_placement(reserve(feed, "gang", job().gpus(2).replicas(2)))
    assert models_of(placed) == ["V100M32", "V100M32"]
    assert safety(feed) == []


def test_a_gang_naming_several_models_runs_on_one_of_them() -> None:
    feed, _ = feed_of(node("t4", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("v100", gpus=2, model="V100M32", gpu_memory_mib=V100_32),
                      node("a100", gpus=2, model="A100"))
    out = reserve(feed, "split", job().gpus(2).replicas(2).models("T4", "V100M32"))
    assert of(out, JobPlaced) == []  # one node of each allowed model: no single model holds it
    placed = the_placement(reserve(feed, "one", job().gpus(1).replicas(2).models("T4", "V100M32")))
    assert models_of(placed) == ["T4", "T4"]  # as free as the V100s: the name decides
    assert safety(feed) == []


def test_a_gang_runs_on_the_model_of_the_flavor_quota_reserved_it_on() -> None:
    # Best fit alone would take the T4s (the fewest free); quota reserved the V100 flavor.
    feed, _ = feed_of(node("t4-a", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("t4-b", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("v100-a", gpus=4, model="V100M32", gpu_memory_mib=V100_32),
                      node("v100-b", gpus=4, model="V100M32", gpu_memory_mib=V100_32))
    placed = the_placement(reserve(feed, "gang", job().gpus(2).replicas(2), flavor="V100M32"))
    assert models_of(placed) == ["V100M32", "V100M32"]
    assert safety(feed) == []


def test_a_gang_with_a_required_topology_still_takes_one_model_inside_its_domain() -> None:
    rack = {"rack": "r1"}
    t4 = node("t4", gpus=2, model="T4", gpu_memory_mib=T4_16)
    v100 = node("v100", gpus=2, model="V100M32", gpu_memory_mib=V100_32)
    other = node("v100-other-rack", gpus=2, model="V100M32", gpu_memory_mib=V100_32)
    feed, _ = feed_of(NodeSpec(name=t4.name, cpu_milli=t4.cpu_milli, memory_mib=t4.memory_mib, gpus=t4.gpus,
                               labels=rack),
                      NodeSpec(name=v100.name, cpu_milli=v100.cpu_milli, memory_mib=v100.memory_mib, gpus=v100.gpus,
                               labels=rack),
                      NodeSpec(name=other.name, cpu_milli=other.cpu_milli, memory_mib=other.memory_mib,
                               gpus=other.gpus, labels={"rack": "r2"}))
    out = reserve(feed, "gang", job().gpus(2).replicas(2).having(topology="rack", topology_required=True))
    # Rack r1 holds 2 T4s and 2 V100s (one model each too few), rack r2 only 2 V100s: no rack holds it.
    assert of(out, JobPlaced) == []
    placed = the_placement(reserve(feed, "small", job().gpus(1).replicas(2).having(topology="rack",
                                                                                   topology_required=True)))
    assert len(set(models_of(placed))) == 1
    assert safety(feed) == []


def test_a_mig_gang_is_not_split_across_two_models() -> None:
    def mig(name: str, model: str) -> NodeSpec:
        return NodeSpec(name=name, cpu_milli=64_000, memory_mib=512_000,
                        gpus=(GpuSpec(index=0, model=model, memory_mib=A100_80, mig_enabled=True),))

    feed, _ = feed_of(mig("a100", "A100"), mig("h100", "H100"))
    out = reserve(feed, "gang", job(mig_profile="7g.80gb").replicas(2))
    assert of(out, JobPlaced) == []  # one 7g.80gb per GPU: only across the A100 and the H100
    placed = the_placement(feed.nodes(mig("h100-b", "H100")))  # a second H100: the waiting gang goes there
    assert (placed.job_id, models_of(placed)) == ("gang", ["H100", "H100"])
    assert safety(feed) == []


def test_a_single_replica_may_still_go_to_any_model() -> None:
    feed, _ = feed_of(node("t4", gpus=2, model="T4", gpu_memory_mib=T4_16),
                      node("v100", gpus=2, model="V100M32", gpu_memory_mib=V100_32))
    first = the_placement(reserve(feed, "a", job().gpus(2)))
    second = the_placement(reserve(feed, "b", job().gpus(2)))
    assert sorted(models_of(first) + models_of(second)) == ["T4", "V100M32"]
    assert safety(feed) == []


# --- a fraction without declared memory is charged its share ------------------------------------------------

@pytest.mark.parametrize("first, second", [
    (job().fraction(500), job().fraction(500).having(gpu_memory_mib=60 * GIB)),
    (job().fraction(500).having(gpu_memory_mib=60 * GIB), job().fraction(500)),
], ids=["no memory first", "60 GiB first"])
def test_a_fraction_without_memory_and_one_asking_60_gib_do_not_share_an_80_gib_gpu(first: Job, second: Job) -> None:
    feed, decider = feed_of(node("n", gpus=1, gpu_memory_mib=A100_80))
    assert len(of(reserve(feed, "first", first), JobPlaced)) == 1
    out = reserve(feed, "second", second)
    assert of(out, JobPlaced) == []
    [deferred] = of(out, PlacementDeferred)
    assert deferred.code == "fragmentation" and "GPU memory free" in deferred.message
    gpu = decider.cluster.nodes["n"].gpus[0]
    assert (gpu.free_milli, gpu.free_memory_mib) == (500, A100_80 - (first.spec.gpu_memory_mib or 40 * GIB))
    assert safety(feed) == []


def test_on_two_gpus_the_fraction_asking_memory_goes_to_the_gpu_without_the_share_that_holds_40_gib() -> None:
    feed, _ = feed_of(node("n", gpus=2, gpu_memory_mib=A100_80))
    no_memory = the_placement(reserve(feed, "no-memory", job().fraction(500)))
    asking = the_placement(reserve(feed, "asking", job().fraction(500).having(gpu_memory_mib=60 * GIB)))
    assert no_memory.placements[0].gpu_indices != asking.placements[0].gpu_indices
    assert asking.placements[0].gpu_memory_mib == 60 * GIB
    assert no_memory.placements[0].gpu_memory_mib == 0  # the placement records what the job declared
    assert safety(feed) == []


def test_fractions_without_memory_still_fill_a_gpu_to_its_whole_share() -> None:
    feed, decider = feed_of(node("n", gpus=1, gpu_memory_mib=A100_80))
    for i, milli in enumerate((300, 300, 400)):
        assert len(of(reserve(feed, f"f{i}", job().fraction(milli)), JobPlaced)) == 1
    gpu = decider.cluster.nodes["n"].gpus[0]
    assert (gpu.free_milli, gpu.free_memory_mib) == (0, A100_80 - 2 * (A100_80 * 300 // 1000) - A100_80 * 400 // 1000)
    assert safety(feed) == []


def test_the_share_of_memory_comes_back_when_the_fraction_ends() -> None:
    feed, decider = feed_of(node("n", gpus=1, gpu_memory_mib=A100_80))
    reserve(feed, "half", job().fraction(500))
    assert decider.cluster.nodes["n"].gpus[0].free_memory_mib == 40 * GIB
    out = feed.send(JobFinished, job_id="half")
    assert out == []
    gpu = decider.cluster.nodes["n"].gpus[0]
    assert (gpu.free_milli, gpu.free_memory_mib, gpu.in_use()) == (1000, A100_80, False)
    asking = the_placement(reserve(feed, "asking", job().fraction(500).having(gpu_memory_mib=60 * GIB)))
    assert asking.placements[0].node == "n"
    assert safety(feed) == []


def test_a_fraction_asking_memory_waits_for_the_share_of_memory_to_come_back() -> None:
    feed, _ = feed_of(node("n", gpus=1, gpu_memory_mib=A100_80))
    reserve(feed, "half", job().fraction(500))
    assert of(reserve(feed, "asking", job().fraction(500).having(gpu_memory_mib=60 * GIB)), JobPlaced) == []
    placed = the_placement(feed.send(JobFinished, job_id="half"))
    assert placed.job_id == "asking"
    assert safety(feed) == []


def many_nodes(count: int) -> list[NodeSpec]:
    return [node(f"n{i:03d}", gpus=1, gpu_memory_mib=A100_80) for i in range(count)]


@pytest.mark.parametrize("count", [4, FEW_NODES + 6], ids=["row by row", "vectorised"])
def test_every_fit_path_charges_the_share(count: int) -> None:
    """Every GPU holds 600 milli declaring no memory (48 GiB of 80); a 400-milli job asking 40 GiB fits none of
    them, one asking 32 GiB fits (the small-cluster path and the vectorised path of the fit agree)."""
    feed, _ = feed_of(*many_nodes(count))
    for i in range(count):
        assert len(of(reserve(feed, f"most-{i}", job().fraction(600)), JobPlaced)) == 1
    assert of(reserve(feed, "forty", job().fraction(400).having(gpu_memory_mib=40 * GIB)), JobPlaced) == []
    assert len(of(reserve(feed, "thirty-two", job().fraction(400).having(gpu_memory_mib=32 * GIB)), JobPlaced)) == 1
    assert safety(feed) == []


@pytest.mark.parametrize("policy", ["packing", "fgd", "best-fit", "spread"])
@pytest.mark.parametrize("count", [4, FEW_NODES + 6], ids=["few nodes", "many nodes"])
def test_under_every_policy_and_the_score_cache_no_gpu_holds_more_memory_than_it_has(policy: str,
                                                                                    count: int) -> None:
    cluster = Cluster()
    for spec in many_nodes(count):
        cluster.register(spec)
    shapes = [JobSpec(team="t", queue="q", gpus=1, gpu_milli=500),
              JobSpec(team="t", queue="q", gpus=1, gpu_milli=500, gpu_memory_mib=60 * GIB)]
    placer = Placer(cluster, typical_shapes(shapes * 3))  # the score cache keeps shapes asked again
    held: list[ReplicaPlacement] = []
    for i in range(3 * count):
        placed = placer.place_gang(shapes[i % 2], policy)
        if not isinstance(placed, Shortfall):
            held.extend(placed)
    for n in cluster.sorted_nodes():
        for g in n.gpus:
            mine = [p for p in held if p.node == n.name and g.index in p.gpu_indices]
            charged = sum(p.gpu_memory_mib or g.memory_mib * p.gpu_milli // 1000 for p in mine)
            assert charged <= g.memory_mib and sum(p.gpu_milli for p in mine) <= 1000
            assert g.free_memory_mib == g.memory_mib - charged
            # A GPU holds halves declaring no memory or one asking 60 GiB, never both.
            assert len({p.gpu_memory_mib for p in mine}) <= 1
    assert {p.gpu_memory_mib for p in held} == {0, 60 * GIB}


# --- the cluster's own books ---------------------------------------------------------------------------------

def test_allocate_and_release_charge_and_give_back_the_share_exactly() -> None:
    c = Cluster()
    c.register(node("n", gpus=1, gpu_memory_mib=A100_80))
    third = ReplicaPlacement(replica=0, node="n", gpu_indices=(0,), gpu_milli=333)
    c.allocate((third,))
    c.allocate((third,))
    gpu = c.nodes["n"].gpus[0]
    assert gpu.free_memory_mib == A100_80 - 2 * (A100_80 * 333 // 1000)
    c.release((third,))
    c.release((third,))
    assert (gpu.free_milli, gpu.free_memory_mib, gpu.in_use()) == (1000, A100_80, False)


def test_a_whole_gpu_declaring_no_memory_is_charged_none() -> None:
    c = Cluster()
    c.register(node("n", gpus=2, gpu_memory_mib=A100_80))
    c.allocate((ReplicaPlacement(replica=0, node="n", gpu_indices=(0,), gpu_milli=1000),))
    assert c.nodes["n"].gpus[0].free_memory_mib == A100_80  # a whole GPU shares with nobody


def test_a_registration_that_changes_the_gpus_memory_charges_the_share_of_the_new_memory() -> None:
    c = Cluster()
    c.register(node("n", gpus=1, gpu_memory_mib=A100_80))
    half = ReplicaPlacement(replica=0, node="n", gpu_indices=(0,), gpu_milli=500)
    asking = ReplicaPlacement(replica=0, node="n", gpu_indices=(0,), gpu_milli=200, gpu_memory_mib=4 * GIB)
    c.allocate((half, asking))
    c.register(node("n", gpus=1, gpu_memory_mib=40 * GIB))
    fresh = Cluster()
    fresh.register(node("n", gpus=1, gpu_memory_mib=40 * GIB))
    fresh.allocate((half, asking))
    assert c.nodes["n"].gpus[0].free_memory_mib == fresh.nodes["n"].gpus[0].free_memory_mib == 16 * GIB
    c.release((half, asking))
    gpu = c.nodes["n"].gpus[0]
    assert (gpu.free_milli, gpu.free_memory_mib, gpu.in_use()) == (1000, 40 * GIB, False)
