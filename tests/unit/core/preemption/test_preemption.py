"""Preemption: whom to evict so that a higher-priority job of the same queue can have its quota and GPUs.

The scenarios run the whole pipeline (admission, quota, placement, preemption) so that every deferral and
every placement the preemption decider sees is one the real deciders made.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from contracts import (
    CancelJob,
    ClockTick,
    JobEvicted,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClass,
    PriorityClassesChanged,
    QueueSpec,
    QuotaDeferred,
    Victim,
)
from libs.core.cluster.model import Cluster
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES, PolicyBook
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import PreemptionState, Running
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario
from tests.unit.builders import EventFeed, brief, job, kinds, node, of, pipeline, queue

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def running(job_id: str, demand: int) -> Running:
    return Running(job_id=job_id, queue="q", priority=100, preemptible=True, demand=demand, started=0.0,
                   placements=())


@pytest.mark.parametrize(("demands", "need", "chosen"), [
    pytest.param({"a": 1, "b": 4}, 4, ["b"], id="a victim made unnecessary by a later one is dropped"),
    pytest.param({"a": 1, "b": 1, "c": 1}, 2, ["a", "b"], id="greedy stops as soon as it is enough"),
    pytest.param({"a": 2, "b": 1, "c": 2}, 3, ["a", "b"], id="every victim needed is kept"),
    pytest.param({"a": 1, "b": 2, "c": 2}, 4, ["b", "c"], id="minimisation tries the last added first"),
    pytest.param({"a": 1, "b": 1}, 3, [], id="not enough even with every candidate: none"),
    pytest.param({}, 1, [], id="no candidates: none"),
])
def test_choose_victims_is_greedy_in_candidate_order_then_minimal(demands, need, chosen) -> None:
    cands = [running(j, d) for j, d in demands.items()]
    with Simulation(PreemptionState(), PolicyBook(), Cluster(), job().spec, []) as sim:
        victims = sim.choose(cands, lambda: sum(v.demand for v in sim.applied) >= need)
    assert [v.job_id for v in victims] == chosen


def unlimited(*nodes) -> EventFeed:
    """Queues ml-train and cv-train without quota: only placement defers."""
    feed = pipeline()
    feed.queues(queue("ml-train", "ml"), queue("cv-train", "cv"))
    feed.nodes(*nodes)
    return feed


def full_queue(nominal_gpus: int | None = 8) -> EventFeed:
    """ml-train on node a (8 GPUs): v1, v2, v4 (batch) and v3 (experiment), 2 GPUs each, placed in order."""
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", nominal_gpus), queue("cv-train", "cv", None))
    feed.nodes(node("a", 8))
    for job_id, prio in (("v1", "batch"), ("v2", "batch"), ("v3", "experiment"), ("v4", "batch")):
        assert kinds(feed.submit(job_id, job().gpus(2).priority(prio)))[-1] == "JobPlaced"
    return feed


@pytest.mark.parametrize(("priority", "gpus", "victims"), [
    pytest.param("urgent", 2, ["v4"], id="one batch job: the most recently placed"),
    pytest.param("urgent", 4, ["v4", "v2"], id="two batch jobs, newest first"),
    pytest.param("urgent", 6, ["v4", "v2", "v1"], id="every batch job before the experiment"),
    pytest.param("urgent", 8, ["v4", "v2", "v1", "v3"], id="the experiment last, as it outranks batch"),
    pytest.param("experiment", 2, ["v4"], id="an experiment evicts batch"),
    pytest.param("experiment", 8, [], id="an experiment cannot evict another experiment"),
    pytest.param("batch", 2, [], id="equal priority evicts nothing"),
])
def test_a_higher_priority_job_deferred_by_quota_evicts_the_lowest_priority_most_recently_placed_jobs_it_needs(
        priority: str, gpus: int, victims: list[str]) -> None:
    feed = full_queue()
    out = feed.submit("p", job().gpus(gpus).priority(priority))
    assert kinds(out)[:3] == ["JobSubmitted", "JobAdmitted", "QuotaDeferred"]
    decided = of(out, PreemptionDecided)
    assert [[v.job_id for v in d.victims] for d in decided] == ([victims] if victims else [])


def test_a_preemption_decision_names_the_preemptor_and_each_victim() -> None:
    feed = full_queue()
    [decided] = of(feed.submit("p", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert (decided.preemptor_id, decided.code, decided.correlation_id) == ("p", "within_queue_priority", "p")
    # With the criteria that chose it: nothing run yet to lose (all placed at the same instant), started when.
    assert decided.victims == (Victim(job_id="v4", queue="ml-train", priority=100, gpu_milli=2000,
                                      reason="within_queue_priority", lost_gpu_seconds=0.0, started_at=1000.0),)


def test_once_its_victim_is_evicted_the_preemptor_gets_the_quota_and_gpus_and_the_victim_waits() -> None:
    feed = full_queue()
    feed.submit("p", job().gpus(2).priority("urgent"))
    out = feed.send(JobEvicted, job_id="v4", reason="preempted")
    assert brief(out) == [("QuotaReleased", "v4"), ("QuotaReserved", "p"), ("QuotaDeferred", "v4"), ("JobPlaced", "p")]
    assert [(p.node, p.gpu_indices) for p in out[-1].placements] == [("a", (6, 7))]
    assert b'"in_flight":{}' in feed.deciders[3].snapshot()


def test_a_higher_priority_job_deferred_by_placement_evicts_the_most_recently_placed_lower_priority_job() -> None:
    feed = unlimited(node("a", 4))
    feed.submit("v1", job().gpus(2).priority("batch"))
    feed.submit("v2", job().gpus(2).priority("batch"))
    out = feed.submit("p", job().gpus(2).priority("urgent"))
    assert kinds(out) == ["JobSubmitted", "JobAdmitted", "QuotaReserved", "PlacementDeferred", "PreemptionDecided"]
    assert [v.job_id for v in out[-1].victims] == ["v2"]
    # Placement reads the eviction before quota's re-reservation of the victim: the preemptor goes first.
    assert brief(feed.send(JobEvicted, job_id="v2", reason="preempted")) == [
        ("QuotaReleased", "v2"), ("QuotaReserved", "v2"), ("JobPlaced", "p"), ("PlacementDeferred", "v2")]


def test_one_big_victim_replaces_a_small_one_that_would_not_suffice() -> None:
    feed = unlimited(node("a", 5))
    feed.submit("big", job().gpus(4).priority("batch"))
    feed.submit("small", job().gpus(1).priority("batch"))
    [decided] = of(feed.submit("p", job().gpus(4).priority("urgent")), PreemptionDecided)
    assert [v.job_id for v in decided.victims] == ["big"]


def test_jobs_of_other_queues_are_never_victims() -> None:
    feed = unlimited(node("a", 4))
    feed.submit("cv", job("cv", "cv-train").gpus(4).priority("batch"))
    assert kinds(feed.submit("p", job().gpus(2).priority("urgent")))[-1] == "PlacementDeferred"


@pytest.mark.parametrize("running_priority", ["training", "urgent"], ids=["equal", "higher"])
def test_jobs_of_equal_or_higher_priority_are_never_victims(running_priority: str) -> None:
    feed = unlimited(node("a", 4))
    feed.submit("r", job().gpus(4).priority(running_priority))
    assert kinds(feed.submit("p", job().gpus(2).priority("training")))[-1] == "PlacementDeferred"


CLASSES = (PriorityClass(name="critical", value=2000), PriorityClass(name="production-inference", value=1000,
                                                                      preemptible=False),
           PriorityClass(name="serving", value=50, preemptible=False), PriorityClass(name="batch", value=100))


@pytest.mark.parametrize(("gpus", "victims"), [
    pytest.param(2, ["b"], id="the preemptible batch job, not the lower serving one"),
    pytest.param(4, None, id="no decision when only non-preemptible jobs would make room"),
])
def test_jobs_of_non_preemptible_classes_are_never_victims(gpus: int, victims: list[str] | None) -> None:
    feed = unlimited(node("a", 6))
    feed.send(PriorityClassesChanged, classes=CLASSES, version=1)
    feed.submit("b", job().gpus(2).priority("batch"))
    feed.submit("s", job().gpus(2).priority("serving"))
    feed.submit("inf", job().gpus(2).priority("production-inference"))
    decided = of(feed.submit("p", job().gpus(gpus).priority("critical")), PreemptionDecided)
    assert [[v.job_id for v in d.victims] for d in decided] == ([victims] if victims else [])


@pytest.mark.parametrize(("setup", "preemptor"), [
    pytest.param([("cv", 3), ("ml", 1)], job().gpus(2), id="the victims free too few GPUs"),
    pytest.param([("ml", 4)], job().gpus(2).models("H100"), id="the victims hold GPUs the preemptor cannot use"),
])
def test_no_decision_when_the_simulation_says_the_evictions_would_not_help(setup, preemptor) -> None:
    feed = unlimited(node("a", 4), node("h", 4, "H100"))
    feed.submit("fill-h", job("cv", "cv-train").gpus(4).models("H100"))
    for team, gpus in setup:
        feed.submit(f"{team}-{gpus}", job(team, f"{team}-train").gpus(gpus).priority("batch"))
    out = feed.submit("p", preemptor.priority("urgent"))
    assert kinds(out)[-1] == "PlacementDeferred" and not of(out, PreemptionDecided)


def test_no_second_decision_while_the_victims_are_in_flight_and_in_flight_victims_are_not_chosen_again() -> None:
    feed = full_queue()
    [first] = of(feed.submit("p", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert [v.job_id for v in first.victims] == ["v4"]
    assert feed.send(PlacementDeferred, job_id="p", code="insufficient_gpus", message="") == []
    assert feed.send(QuotaDeferred, job_id="p", queue="ml-train", code="queue_quota_exhausted", message="") == []
    [second] = of(feed.submit("p2", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert [v.job_id for v in second.victims] == ["v2"]


# --- a preemptor keeps what was freed for it ---------------------------------------------------------

@pytest.mark.parametrize("nominal_gpus", [8, None], ids=["quota-bound", "placement-bound"])
def test_a_preemptor_that_needs_two_victims_runs_once_both_are_evicted(nominal_gpus: int | None) -> None:
    feed = full_queue(nominal_gpus)
    [decided] = of(feed.submit("p", job().gpus(4).priority("urgent")), PreemptionDecided)
    assert [v.job_id for v in decided.victims] == ["v4", "v2"]
    out = feed.send(JobEvicted, job_id="v4", reason="preempted") + feed.send(JobEvicted, job_id="v2",
                                                                             reason="preempted")
    assert ("JobPlaced", "p") in brief(out)


def test_no_eviction_when_a_cancelled_job_already_on_its_way_out_frees_enough() -> None:
    feed = unlimited(node("a", 8))
    feed.submit("v", job().gpus(4).priority("batch"))
    feed.submit("c", job().gpus(4).priority("batch"))
    feed.send(CancelJob, job_id="c")
    out = feed.submit("p", job().gpus(4).priority("urgent"))
    assert "PlacementDeferred" in kinds(out)  # placement keeps c's GPUs until its eviction is reported
    assert of(out, PreemptionDecided) == []  # fails: v is evicted, though c's eviction alone makes room


def test_a_job_placed_after_its_cancellation_holds_its_gpus_and_is_never_chosen_as_a_victim() -> None:
    from contracts import JobCancelled, JobPlaced, JobSubmitted, ReplicaPlacement
    from libs.core.preemption.decider import PreemptionDecider
    from tests.unit.builders import spec_of

    feed = EventFeed(PreemptionDecider())
    feed.nodes(node("a", 8))
    feed.send(JobSubmitted, job_id="v", spec=spec_of(job().gpus(8).priority("batch")))
    feed.send(JobCancelled, job_id="v", reason="user_request")
    # Placement decided before it saw the cancellation: the placement still arrives afterwards.
    feed.send(JobPlaced, job_id="v", placements=(ReplicaPlacement(replica=0, node="a", gpu_indices=tuple(range(8)),
                                                                  gpu_milli=1000),))
    feed.send(JobSubmitted, job_id="p", spec=spec_of(job().gpus(8).priority("urgent")))
    out = feed.send(PlacementDeferred, job_id="p", code="insufficient_gpus", message="")
    assert of(out, PreemptionDecided) == []  # v is leaving anyway


def classes_with_min_runtime(feed: EventFeed, seconds: float) -> None:
    classes = tuple(c if c.name != "batch" else msgspec.structs.replace(c, min_runtime_s=seconds)
                    for c in DEFAULT_PRIORITY_CLASSES)
    feed.send(PriorityClassesChanged, classes=classes, version=2)


@pytest.mark.parametrize(("ran_s", "victims"), [
    pytest.param(30.0, [], id="a batch job inside its class's minimum runtime is not a victim"),
    pytest.param(90.0, ["v4"], id="once past it, it is"),
])
def test_a_job_is_not_evicted_before_its_classs_minimum_runtime(ran_s: float, victims: list[str]) -> None:
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    classes_with_min_runtime(feed, 60.0)
    feed.at(1000.0)
    for job_id in ("v1", "v2", "v3", "v4"):
        feed.submit(job_id, job().gpus(2).priority("batch"))
    decided = of(feed.at(1000.0 + ran_s).submit("p", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert [[v.job_id for v in d.victims] for d in decided] == ([victims] if victims else [])


@pytest.mark.parametrize(("duration_s", "victims"), [
    pytest.param(100.0, ["v4"], id="a victim with most of its run ahead is evicted"),
    pytest.param(25.0, [], id="one about to end anyway is spared: waiting costs less than redoing it"),
])
def test_jobs_about_to_end_are_not_evicted(duration_s: float, victims: list[str]) -> None:
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    feed.at(1000.0)
    for job_id in ("v1", "v2", "v3", "v4"):
        feed.submit(job_id, job().gpus(2).priority("batch").having(duration_s=duration_s))
    # 20 s later: 5 s left of a 25 s run (within the default 10 s), 80 s left of a 100 s run.
    decided = of(feed.at(1020.0).submit("p", job().gpus(2).priority("urgent")), PreemptionDecided)
    assert [[v.job_id for v in d.victims] for d in decided] == ([victims] if victims else [])


def test_a_decision_never_evicts_more_than_the_need_plus_the_slack() -> None:
    from contracts import SchedulingSettings, SchedulingSettingsChanged

    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 16))
    feed.nodes(node("a", 8), node("b", 8))
    feed.send(SchedulingSettingsChanged, version=1, settings=SchedulingSettings(preemption_slack_gpus=4))
    feed.submit("big", job().gpus(8).priority("batch"))   # one 8-GPU victim on a
    feed.submit("small", job().gpus(8).priority("batch"))  # another on b
    # A 2-GPU urgent job would need one 8-GPU victim: 8 > 2 + 4, so nobody is evicted; with slack 8 it goes.
    assert of(feed.submit("p", job().gpus(2).priority("urgent")), PreemptionDecided) == []
    feed.send(SchedulingSettingsChanged, version=2, settings=SchedulingSettings(preemption_slack_gpus=8))
    decided = of(feed.send(ClockTick), PreemptionDecided) + of(feed.send(ClockTick), PreemptionDecided)
    assert len(decided + of(feed.submit("p2", job().gpus(2).priority("urgent")), PreemptionDecided)) == 1


@pytest.mark.parametrize(("budget", "victims"), [
    pytest.param(None, ["v4", "v2"], id="without a budget both batch jobs go"),
    pytest.param(2, [], id="a 2-GPU budget cannot cover the 4 GPUs needed: nobody"),
    pytest.param(4, ["v4", "v2"], id="a 4-GPU budget covers exactly them"),
])
def test_a_queues_blast_radius_budget_caps_its_evictions_per_window(budget: int | None, victims: list[str]) -> None:
    feed = pipeline()
    feed.queues(QueueSpec(name="ml-train", team="ml", nominal_gpus=8, eviction_budget_gpus=budget),
                queue("cv-train", "cv", None))
    feed.nodes(node("a", 8))
    for job_id, prio in (("v1", "batch"), ("v2", "batch"), ("v3", "experiment"), ("v4", "batch")):
        feed.submit(job_id, job().gpus(2).priority(prio))
    decided = of(feed.submit("p", job().gpus(4).priority("urgent")), PreemptionDecided)
    assert [[v.job_id for v in d.victims] for d in decided] == ([victims] if victims else [])


def test_a_victim_never_preempts_its_preemptor_back() -> None:
    feed = pipeline()
    feed.queues(queue("ml-train", "ml", 4))
    feed.nodes(node("a", 4))
    feed.submit("v", job().gpus(4).priority("batch"))
    assert len(of(feed.submit("p", job().gpus(4).priority("urgent")), PreemptionDecided)) == 1
    feed.send(JobEvicted, job_id="v", reason="preempted")
    # The priority classes change so that v now outranks p: still, v may not take p's GPUs back.
    classes = tuple(msgspec.structs.replace(c, value=900) if c.name == "batch" else c for c in DEFAULT_PRIORITY_CLASSES)
    out = feed.send(PriorityClassesChanged, classes=classes, version=5)
    out += feed.send(ClockTick)
    assert of(out, PreemptionDecided) == []


def test_a_cancelled_preemptor_evicts_nothing_more_and_its_leaving_victim_frees_room_for_the_next() -> None:
    run = run_scenario(load_scenario(SCENARIOS / "cancelled-preemptor-evicts-nothing-more.yaml"), SCENARIOS)
    events = [e for _, e in run.log]
    decided = [(e.preemptor_id, [v.job_id for v in e.victims]) for e in events if isinstance(e, PreemptionDecided)]
    assert decided == [("p", ["v2", "v1"])]  # once, before the cancel; p2 waits for v2's room, evicting nobody
    # The stop of v2 left with the decision: it still comes, after the cancel, as the executor ordered it.
    evicted = [(e.job_id, e.ts - events[0].ts) for e in events if isinstance(e, JobEvicted) and e.job_id != "p"]
    assert evicted == [("v1", 100.0), ("v2", 120.0)]
    assert run.violations == [] and run.unmet == []
