"""Inference services in the decision core: replica jobs, HPA-style autoscaling on load reports, scale-down
order, replacement, deletion, validation, spreading across failure domains, and a whole day in virtual time."""

from __future__ import annotations

import msgspec
import pytest

from contracts import (
    Autoscaling,
    DeleteService,
    DeployService,
    EventBase,
    JobCancelled,
    JobFailed,
    JobPlaced,
    JobReady,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PreemptionDecided,
    QueueSpec,
    ReportServiceLoad,
    ServiceDeleted,
    ServiceDeployed,
    ServiceRejected,
    ServiceScaled,
    ServiceSpec,
)
from libs.core.admission.inference_services import ServiceState, recommend, service_problem
from tests.unit.builders import EventFeed, job, node, of, pipeline

SCALING = Autoscaling(metric="requests_per_s", target_per_replica=100.0, scale_down_window_s=60.0)


def replica(**fields: object) -> JobSpec:
    base: dict[str, object] = {"team": "web", "queue": "serving", "priority": "production-inference"}
    return JobSpec(**{**base, **fields})  # type: ignore[arg-type]


def service(name: str = "chat", lo: int = 1, hi: int = 8, scaling: Autoscaling | None = SCALING,
            **fields: object) -> ServiceSpec:
    return ServiceSpec(name=name, replica=replica(**fields), min_replicas=lo, max_replicas=hi, autoscaling=scaling)


def world(nodes: int = 4, racks: int = 2) -> EventFeed:
    feed = pipeline()
    feed.nodes(*(msgspec.structs.replace(node(f"n{i}", gpus=4), labels={"rack": f"r{i % racks}"})
                 for i in range(nodes)))
    feed.queues(QueueSpec(name="pool", team="pool"),
                QueueSpec(name="serving", team="web", parent="pool", nominal_gpus=8),
                QueueSpec(name="training", team="ml", parent="pool", nominal_gpus=8))
    return feed


def live_replicas(feed: EventFeed, name: str = "chat") -> int:
    admission = feed.deciders[0]
    return len(admission.state.services.services[name].replicas)  # type: ignore[attr-defined]


def load(feed: EventFeed, value: float, name: str = "chat") -> list[EventBase]:
    return feed.send(ReportServiceLoad, service=name, metric="requests_per_s", value=value)


# --- the HPA rules, pure ----------------------------------------------------------------------------


def test_recommendation_is_load_over_target_rounded_up_with_a_tolerance() -> None:
    assert recommend(SCALING, current=2, ready=2, value=450) == 5
    assert recommend(SCALING, current=4, ready=4, value=430) == 4  # 7.5 % off target: within tolerance
    assert recommend(SCALING, current=4, ready=4, value=0) == 0
    assert recommend(SCALING, current=0, ready=0, value=1) == 1  # from zero on the first request
    util = Autoscaling(metric="gpu_utilization", target_per_replica=60.0)
    assert recommend(util, current=4, ready=4, value=90) == 6  # mean over ready replicas
    assert recommend(util, current=4, ready=0, value=90) == 4  # nothing ready: nothing to judge


def test_scale_down_waits_for_its_window_and_up_is_at_once() -> None:
    state = ServiceState(service(lo=1, hi=10), epoch="e")
    state.desired = 5
    assert state.next_desired(0.0, 800) == 8  # up at once
    state.desired = 8
    assert state.next_desired(10.0, 200) == 8  # a dip inside the 60 s window
    assert state.next_desired(50.0, 200) == 8
    assert state.next_desired(71.0, 200) == 2  # the window's highest recommendation has aged out


def test_cooldowns_space_scale_ups_and_delay_scale_downs() -> None:
    scaling = msgspec.structs.replace(SCALING, scale_down_window_s=0.0, scale_up_cooldown_s=30.0,
                                      scale_down_cooldown_s=20.0)
    state = ServiceState(service(scaling=scaling), epoch="e")
    state.desired, state.last_scale_up, state.last_scale = 2, 0.0, 0.0
    assert state.next_desired(10.0, 500) == 2  # within the scale-up cooldown
    assert state.next_desired(31.0, 500) == 5
    state.desired, state.last_scale = 5, 31.0
    assert state.next_desired(40.0, 100) == 5  # within the scale-down cooldown
    assert state.next_desired(52.0, 100) == 1


@pytest.mark.parametrize(("spec", "code"), [
    (service(name="Chat_1"), "invalid_service_name"),
    (service(lo=3, hi=2), "invalid_replica_bounds"),
    (service(lo=0, scaling=None), "invalid_replica_bounds"),
    (service(scaling=Autoscaling(metric="rps", target_per_replica=1)), "unknown_metric"),
    (service(scaling=Autoscaling(target_per_replica=0)), "invalid_target"),
    (service(replicas=2), "invalid_replicas"),
])
def test_bad_services_are_refused_with_their_own_code(spec: ServiceSpec, code: str) -> None:
    problem = service_problem(spec)
    assert problem is not None and problem[0] == code


# --- the admission core with quota, placement and preemption ------------------------------------------------


def test_deploy_runs_min_replicas_and_load_scales_them() -> None:
    feed = world()
    out = feed.send(DeployService, service=service(lo=2))
    assert [type(d) for d in out[:2]] == [ServiceDeployed, ServiceScaled]
    assert len(of(out, JobSubmitted)) == 2 and len(of(out, JobPlaced)) == 2
    assert {s.spec.service for s in of(out, JobSubmitted)} == {"chat"}
    out = load(feed, 520)
    scaled = of(out, ServiceScaled)
    assert [(s.from_replicas, s.to_replicas) for s in scaled] == [(2, 6)]
    assert "520" in scaled[0].reason
    assert len(of(out, JobPlaced)) == 4 and live_replicas(feed) == 6
    feed.at(1_010.0)
    assert len(of(load(feed, 5000), JobSubmitted)) == 2  # capped at max_replicas
    assert live_replicas(feed) == 8


def test_scale_down_stops_replicas_not_yet_running_first_then_the_newest() -> None:
    feed = world(nodes=2)  # 8 GPUs, 4 of them held by a job no one preempts: of 6 replicas, 2 wait
    feed.submit("held", job(queue="training", priority="production-inference").gpus(4))
    first = of(feed.send(DeployService, service=service(
        lo=1, scaling=msgspec.structs.replace(SCALING, scale_down_window_s=0))), JobPlaced)[0].job_id
    feed.send(JobReady, job_id=first)
    out = load(feed, 600)
    submitted = [s.job_id for s in of(out, JobSubmitted)]
    placed = {p.job_id for p in of(out, JobPlaced)}
    waiting = [j for j in submitted if j not in placed]
    assert len(waiting) == 2
    for p in placed:
        feed.send(JobReady, job_id=p)
    feed.at(1_010.0)
    out = load(feed, 300)
    cancelled = [c.job_id for c in of(out, JobCancelled)]
    assert len(cancelled) == 3
    assert set(waiting) <= set(cancelled)  # the waiting ones go first
    running_cancelled = [c for c in cancelled if c not in waiting]
    assert running_cancelled == [submitted[len(submitted) - 3]]  # then the newest running one
    assert all(c.reason == "scaled_down" for c in of(out, JobCancelled))


def test_a_replica_that_fails_for_good_is_replaced() -> None:
    feed = world()
    out = feed.send(DeployService, service=service(lo=2, scaling=None))
    first = of(out, JobSubmitted)[0].job_id
    feed.send(JobReady, job_id=first)
    out = feed.send(JobFailed, job_id=first, exit_code=1, reason="error")
    replacement = of(out, JobSubmitted)
    assert len(replacement) == 1 and replacement[0].job_id != first
    assert live_replicas(feed) == 2


def test_delete_stops_every_replica_and_a_later_deploy_uses_new_ids() -> None:
    feed = world()
    before = {s.job_id for s in of(feed.send(DeployService, service=service(lo=3)), JobSubmitted)}
    out = feed.send(DeleteService, name="chat", team="web")
    assert {c.job_id for c in of(out, JobCancelled)} == before
    assert of(out, ServiceDeleted)
    after = {s.job_id for s in of(feed.send(DeployService, service=service(lo=3)), JobSubmitted)}
    assert len(after) == 3 and not after & before


def test_an_update_changes_bounds_but_not_the_replica_spec() -> None:
    feed = world()
    feed.send(DeployService, service=service(lo=1, hi=4))
    out = feed.send(DeployService, service=service(lo=3, hi=4))
    assert [(s.from_replicas, s.to_replicas, s.reason) for s in of(out, ServiceScaled)] == [
        (1, 3, "replica bounds changed")]
    out = feed.send(DeployService, service=service(lo=3, hi=4, gpus=2))
    assert [r.code for r in of(out, ServiceRejected)] == ["replica_spec_changed"]
    out = feed.send(DeployService, service=ServiceSpec(name="chat", replica=JobSpec(team="ml", queue="training")))
    assert [r.code for r in of(out, ServiceRejected)] == ["service_exists"]


def test_replicas_spread_over_racks_then_nodes() -> None:
    feed = world(nodes=4, racks=2)
    out = feed.send(DeployService, service=service(lo=4, scaling=None))
    nodes = [p.placements[0].node for p in of(out, JobPlaced)]
    assert len(set(nodes)) == 4  # one per node
    assert {int(n[1:]) % 2 for n in nodes[:2]} == {0, 1}  # the first two on different racks


def test_a_scale_up_reclaims_quota_lent_to_training() -> None:
    feed = world(nodes=4)  # 16 GPUs: 8 of serving's, which training borrows, and training's 8
    for i in range(16):
        feed.submit(f"train-{i}", job(queue="training", priority="training", duration_s=3600.0))
        feed.send(JobStarted, job_id=f"train-{i}")
    out = feed.send(DeployService, service=service(lo=2, scaling=None))
    victims = [v for p in of(out, PreemptionDecided) for v in p.victims]
    assert len(victims) == 2 and all(v.reason == "reclaim" for v in victims)


def test_a_bad_replica_spec_is_rejected_on_the_log_too() -> None:
    feed = world()
    out = feed.send(DeployService, service=service(name="x", queue="nope"))
    assert [r.code for r in of(out, ServiceRejected)] == ["unknown_queue"]


def test_a_day_of_diurnal_load_keeps_services_served_and_the_cluster_busy() -> None:
    from libs.bench.inference_virtual import run_day

    result = run_day(seed=1)
    assert result["scale_ups"] > 20
    assert result["below_desired_pct"] <= 1.0
    assert result["gpu_allocation_pct"] >= 90.0
    assert result["batch_gpu_hours"] > 500
    assert result["preempted_jobs"] > 0  # valleys lent to training were taken back
    # Deterministic: the same inputs give the same figures.
    assert run_day(seed=1) == result


def test_a_service_that_could_never_fit_at_its_maximum_is_refused() -> None:
    feed = world()  # 16 GPUs
    out = feed.send(DeployService, service=service(lo=1, hi=17))
    rejected = of(out, ServiceRejected)
    assert [r.code for r in rejected] == ["exceeds_cluster_capacity"] and "max_replicas 17" in rejected[0].message
    assert service_problem(service(hi=5000)) == ("too_many_replicas", "max_replicas is at most 1000, got 5000")


def test_a_load_that_is_not_a_number_changes_nothing() -> None:
    feed = world()
    feed.send(DeployService, service=service(lo=2))
    assert load(feed, float("nan")) == [] and load(feed, -5.0) == []


def test_a_service_allowed_to_scale_to_zero_does_and_comes_back_on_the_first_request() -> None:
    feed = world()
    feed.send(DeployService, service=service(lo=0, scaling=msgspec.structs.replace(SCALING, scale_down_window_s=0)))
    assert live_replicas(feed) == 0  # nothing asked yet
    feed.at(1_001.0)
    out = load(feed, 30)
    assert [(s.from_replicas, s.to_replicas) for s in of(out, ServiceScaled)] == [(0, 1)]
    assert len(of(out, JobPlaced)) == 1
    feed.at(1_002.0)
    out = load(feed, 0)
    assert [(s.from_replicas, s.to_replicas) for s in of(out, ServiceScaled)] == [(1, 0)]
    assert len(of(out, JobCancelled)) == 1 and live_replicas(feed) == 0


def test_a_huge_load_over_a_tiny_target_asks_for_the_most_replicas_without_overflowing() -> None:
    tiny = Autoscaling(target_per_replica=1e-300)
    assert recommend(tiny, current=1, ready=1, value=1e300) == 1000
