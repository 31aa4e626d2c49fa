"""A node registered again (a lost node coming back, an agent restarting, an inventory change): every path of
placement, preemption and accounting reads the node as it is now, keeps the use of the GPUs it still has, and
a registration that drops a GPU in use neither raises nor loses the use: the executor ends the runs there
(`gpu_removed`, an infrastructure stop), and every fold then releases what exists."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import (
    EventBase,
    GpuSpec,
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    NodeSpec,
    PlacementDeferred,
    QueuePolicyChanged,
    ReplicaPlacement,
    SubmitJob,
)
from libs.audit.invariants import overallocations
from libs.core.accounting.ledger import Ledger
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.shapes import typical_shapes
from libs.core.cluster.shortfall import Shortfall
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.sim.executor import ExecutorBook
from libs.sim.pipeline import run_virtual
from tests.unit.builders import EventFeed, job, node, of, queue

A100_80 = 81_920


def mig_node(name: str, gpus: int = 1, mig: bool = True, cpu_milli: int = 64_000) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu_milli, memory_mib=512_000,
                    gpus=tuple(GpuSpec(index=i, model="A100", memory_mib=A100_80, mig_enabled=mig)
                               for i in range(gpus)))


def without_gpu(spec: NodeSpec, index: int) -> NodeSpec:
    return msgspec.structs.replace(spec, gpus=tuple(g for g in spec.gpus if g.index != index))


def placed(decisions: list) -> list[JobPlaced]:
    return of(decisions, JobPlaced)


def free_view(c: Cluster) -> dict[str, list[tuple[int, int, int]]]:
    return {n.name: [(g.index, g.free_milli, g.free_memory_mib) for g in n.gpus] for n in c.sorted_nodes()}


# --- every path reads the node as registered last --------------------------------------------------------------

def test_mig_instances_after_a_reregistration_never_exceed_the_gpus_slices() -> None:
    decider = PlacementDecider()
    feed = EventFeed(decider)
    feed.nodes(node("plain", gpus=1), mig_node("m"))
    assert len(placed(feed.reserve("whole", job().gpus(1)))) == 1  # the placer has looked at the nodes once
    feed.nodes(mig_node("m", cpu_milli=96_000))  # the same node again, with more CPU
    out = [d for i in range(10) for d in feed.reserve(f"mig-{i}", job(mig_profile="3g.40gb"))]
    # 7 compute slices and 8 memory slices hold two 3g.40gb instances (3 + 3 slices, 4 + 4 memory slices).
    assert [(p.job_id, p.placements[0].node, p.placements[0].mig_slices) for p in placed(out)] == [
        ("mig-0", "m", 3), ("mig-1", "m", 3)]
    gpu = decider.cluster.nodes["m"].gpus[0]
    assert gpu.free_slices == 1 and gpu.free_memory_mib == 0


def test_a_mig_instance_is_placed_by_a_decider_that_has_seen_only_registrations() -> None:
    feed = EventFeed(PlacementDecider())
    feed.nodes(mig_node("m"))
    out = feed.reserve("mig", job(mig_profile="1g.10gb"))
    assert [(p.placements[0].node, p.placements[0].gpu_indices) for p in placed(out)] == [("m", (0,))]


def test_whole_gpus_and_fractions_after_a_reregistration_count_the_use_the_node_already_has() -> None:
    decider = PlacementDecider()
    feed = EventFeed(decider)
    feed.nodes(node("n", gpus=2))
    assert len(placed(feed.reserve("whole", job().gpus(1)))) == 1
    assert len(placed(feed.reserve("half", job().fraction(500)))) == 1
    feed.nodes(node("n", gpus=2, cpu_milli=32_000))  # registered again with less CPU
    assert placed(feed.reserve("another-whole", job().gpus(1))) == []
    assert len(placed(feed.reserve("other-half", job().fraction(500)))) == 1
    assert placed(feed.reserve("third-half", job().fraction(500))) == []
    assert [g.free_milli for g in decider.cluster.nodes["n"].gpus] == [0, 0]


# --- a registration that drops a GPU in use ------------------------------------------------------------------

def two_jobs_on_two_gpus() -> tuple[EventFeed, PlacementDecider, PreemptionDecider, Ledger, dict[int, str]]:
    placement, preemption, ledger = PlacementDecider(), PreemptionDecider(), Ledger()
    feed = EventFeed(placement, preemption, ledger=ledger)
    feed.nodes(node("n", gpus=2))
    on_gpu: dict[int, str] = {}
    for job_id in ("a", "b"):
        (p,) = placed(feed.reserve(job_id, job().gpus(1)))
        on_gpu[p.placements[0].gpu_indices[0]] = job_id
    assert sorted(on_gpu) == [0, 1]
    return feed, placement, preemption, ledger, on_gpu


def test_a_registration_dropping_a_gpu_in_use_is_folded_and_the_runs_end_releases_what_exists() -> None:
    feed, placement, preemption, ledger, on_gpu = two_jobs_on_two_gpus()
    feed.nodes(without_gpu(node("n", gpus=2), 1))
    for c in (placement.cluster, preemption.cluster, ledger.state.cluster):
        assert free_view(c) == {"n": [(0, 0, A100_80)]}
    feed.send(JobEvicted, job_id=on_gpu[1], reason="gpu_removed")  # the executor's stop of the run there
    feed.send(JobFinished, job_id=on_gpu[0])
    for c in (placement.cluster, preemption.cluster, ledger.state.cluster):
        assert free_view(c) == {"n": [(0, 1000, A100_80)]}
        assert c.free_total == 1000 and c.nodes["n"].free_cpu_milli == c.nodes["n"].cpu_milli
    # The evicted job waits for quota again; a new one takes the one GPU left.
    assert [p.placements[0].gpu_indices for p in placed(feed.reserve("c", job().gpus(1)))] == [(0,)]


def test_a_gpu_back_before_its_runs_end_is_still_held_by_them() -> None:
    feed, placement, _, _, on_gpu = two_jobs_on_two_gpus()
    feed.nodes(without_gpu(node("n", gpus=2), 1))
    feed.nodes(node("n", gpus=2))  # back before the executor's report
    assert [type(d) for d in feed.reserve("c", job().gpus(1))] == [PlacementDeferred]
    assert [g.free_milli for g in placement.cluster.nodes["n"].gpus] == [0, 0]
    out = feed.send(JobEvicted, job_id=on_gpu[1], reason="gpu_removed")
    assert [(p.job_id, p.placements[0].gpu_indices) for p in placed(out)] == [("c", (1,))]


def test_a_simulation_giving_back_and_taking_again_a_retired_gpus_use_keeps_it() -> None:
    c = Cluster()
    c.register(node("n", gpus=2))
    on_gpu_1 = (ReplicaPlacement(replica=0, node="n", gpu_indices=(1,), gpu_milli=600, gpu_memory_mib=1_000),)
    c.allocate(on_gpu_1)
    c.register(without_gpu(node("n", gpus=2), 1))
    c.release(on_gpu_1)  # preemption's simulation: the victim gone...
    c.allocate(on_gpu_1)  # ...and back
    c.register(node("n", gpus=2))
    assert [(g.free_milli, g.free_memory_mib) for g in c.nodes["n"].gpus] == [(1000, A100_80), (400, A100_80 - 1_000)]
    assert c.free_total == 1400
    c.release(on_gpu_1)
    assert c.free_total == 2000 and c.nodes["n"].gpus[1].free_milli == 1000


def test_the_executor_stops_the_runs_on_a_gpu_a_registration_no_longer_has() -> None:
    book = ExecutorBook()
    spec = job().gpus(1).spec
    for job_id in ("a", "b"):
        book.react(JobSubmitted(id=f"s-{job_id}", ts=0.0, source="t", job_id=job_id, spec=spec), 0.0)
    for job_id, index in (("a", 0), ("b", 1)):
        one_gpu = ReplicaPlacement(replica=0, node="n", gpu_indices=(index,), gpu_milli=1000)
        book.react(JobPlaced(id=f"p-{job_id}", ts=1.0, source="t", job_id=job_id, placements=(one_gpu,)), 1.0)
    out = book.react(NodeRegistered(id="r2", ts=5.0, source="t", node=without_gpu(node("n", gpus=2), 1)), 5.0)
    assert [(type(e).__name__, e.job_id, e.reason) for e in out if isinstance(e, JobEvicted)] == [
        ("JobEvicted", "b", "gpu_removed")]
    assert sorted(book.runs) == ["a"]
    # The same inventory again stops nothing.
    assert book.react(NodeRegistered(id="r3", ts=6.0, source="t", node=without_gpu(node("n", gpus=2), 1)),
                      6.0) == []



# --- over random histories: the cluster after re-registrations is the cluster registered once ---------------

gpu_st = st.builds(lambda model, mig, healthy: (model, mig, healthy), st.sampled_from(["A100", "H100", "T4"]),
                   st.booleans(), st.booleans())
spec_st = st.builds(
    lambda name, gpus, cpu: NodeSpec(name=name, cpu_milli=cpu, memory_mib=256_000, gpus=tuple(
        GpuSpec(index=i, model=m, memory_mib=A100_80 if m != "T4" else 15_360, mig_enabled=mig, healthy=ok)
        for i, (m, mig, ok) in enumerate(gpus))),
    st.sampled_from(["n0", "n1", "n2"]), st.lists(gpu_st, max_size=4), st.sampled_from([8_000, 32_000]))
step_st = st.one_of(
    st.tuples(st.just("register"), spec_st),
    st.tuples(st.just("place"), st.sampled_from([
        {"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 300}, {"gpus": 1, "gpu_milli": 700},
        {"gpus": 0, "mig_profile": "1g.10gb"}, {"gpus": 0, "mig_profile": "3g.40gb"},
        {"gpus": 0, "mig_profile": "7g.80gb"}])),
    st.tuples(st.just("release"), st.integers(0, 5)))


def state(c: Cluster) -> list[tuple[object, ...]]:
    return [(n.name, n.free_cpu_milli, n.online, [(g.index, g.free_milli, g.free_memory_mib, g.free_slices,
                                                   g.mig_held, g.mig_instances, g.takes_mig, g.takes_shares)
                                                  for g in n.gpus]) for n in c.sorted_nodes()]


def rebuilt(specs: dict[str, NodeSpec], live: list[tuple[ReplicaPlacement, ...]]) -> Cluster:
    """The nodes registered once each, as last registered, holding what `live` holds on the GPUs they list."""
    fresh = Cluster()
    for name in sorted(specs):
        fresh.register(specs[name])
    for placements in live:
        fresh.allocate(placements)
    return fresh


@settings(max_examples=120, deadline=None)
@given(st.lists(step_st, max_size=25))
def test_after_any_registrations_placement_sees_the_cluster_a_single_registration_would_give(steps) -> None:
    c = Cluster()
    typical = typical_shapes([JobSpec(team="t", queue="q", gpus=1, gpu_milli=300),
                              JobSpec(team="t", queue="q", gpus=2)])
    placer = Placer(c, typical)
    specs: dict[str, NodeSpec] = {}
    live: list[tuple[ReplicaPlacement, ...]] = []
    for kind, arg in steps:
        if kind == "register":
            c.register(arg)
            specs[arg.name] = arg
        elif kind == "place":
            request = JobSpec(team="t", queue="q", cpu_milli=1_000, **arg)
            # A placer that saw the whole history decides as one made now for the same cluster would (while its
            # models depend on the cluster alone: see Placer.consistent).
            same = placer.consistent()
            twin = Placer(rebuilt(specs, live), typical) if same else None
            result = placer.place_gang(request)
            if twin is not None:
                expected = twin.place_gang(request)
                assert (result.code if isinstance(result, Shortfall) else result) == (
                    expected.code if isinstance(expected, Shortfall) else expected)
            if not isinstance(result, Shortfall):
                live.append(result)
                for p in result:  # what it took was free when it took it
                    n = c.nodes[p.node]
                    assert n.free_cpu_milli >= 0 and n.online
                    for g in (n.gpu(i) for i in p.gpu_indices):
                        assert g.free_milli >= 0 and g.free_memory_mib >= 0 and g.free_slices >= 0 and g.healthy
                        assert (g.takes_mig or (g.free_slices == 0 and g.mig_enabled)) if arg.get("mig_profile") \
                            else not g.mig_enabled
        elif live:
            c.release(live.pop(arg % len(live)))
        # The same nodes registered once, holding what the live jobs hold on the GPUs they still list.
        assert state(c) == state(rebuilt(specs, live))
        for n in c.sorted_nodes():
            for g in n.gpus:  # a GPU serves MIG instances or shares, never both
                assert g.mig_instances == 0 or g.free_milli + g.mig_milli == 1000
    for placements in live:
        c.release(placements)
    assert all(g.free_milli == 1000 and g.mig_instances == 0 for n in c.sorted_nodes() for g in n.gpus)
    assert all(not n.retired or all(not g.in_use() for g in n.retired.values()) for n in c.sorted_nodes())


def test_end_to_end_a_run_on_a_gpu_its_node_drops_is_stopped_requeued_and_finishes_on_the_gpus_left() -> None:
    t0 = 1_000_000.0
    inputs: list[EventBase] = [
        NodeRegistered(id="n1", ts=t0 - 2, source="node-telemetry", node=node("a", gpus=2)),
        QueuePolicyChanged(id="q", ts=t0 - 1, source="operator", queue=queue("ml-train", "ml", None), version=1),
        SubmitJob(id="s1", ts=t0, source="test", job_id="first", spec=job().gpus(1).having(duration_s=100.0).spec),
        SubmitJob(id="s2", ts=t0, source="test", job_id="second", spec=job().gpus(1).having(duration_s=100.0).spec),
    ]
    first_run = run_virtual(inputs, tick_s=1.0).log
    on_gpu_1 = next(e.job_id for _, e in first_run if isinstance(e, JobPlaced) and e.placements[0].gpu_indices == (1,))
    inputs.append(NodeRegistered(id="n2", ts=t0 + 30, source="node-telemetry",
                                 node=without_gpu(node("a", gpus=2), 1)))
    log = [e for _, e in run_virtual(inputs, tick_s=1.0).log]
    [evicted] = [e for e in log if isinstance(e, JobEvicted)]
    assert (evicted.job_id, evicted.reason, evicted.ts - t0) == (on_gpu_1, "gpu_removed", 30.0)
    placed = [(e.job_id, e.placements[0].gpu_indices, e.ts - t0) for e in log if isinstance(e, JobPlaced)]
    assert placed[-1][:2] == (on_gpu_1, (0,))  # again, once the other job has left the one GPU there is
    assert sorted(e.job_id for e in log if isinstance(e, JobFinished)) == ["first", "second"]
    assert overallocations(enumerate(log, 1)) == []
