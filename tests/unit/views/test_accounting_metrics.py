"""What the accounting service exports after a batch: efficiency, nodes, cost, demand and inference replicas,
read back from the Prometheus registry."""

from __future__ import annotations

from prometheus_client import REGISTRY

from contracts import (
    DeleteService,
    DeployService,
    GpuHealthChanged,
    JobEvicted,
    JobFinished,
    JobReady,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    ReportServiceLoad,
    ServiceSpec,
)
from libs.reports.rates import Rates
from libs.views.projector import Projector
from libs.views.store import ViewStore
from tests.unit.builders import EventFeed, job, node, of, pipeline, queue


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def project(feed: EventFeed, projector: Projector, start: int) -> int:
    """Fold the feed's new events into the projector, then flush one batch's metrics."""
    for seq, event in enumerate(feed.log[start:], start=start + 1):
        projector.on_event(seq, event)
    projector.ops()
    return len(feed.log)


def test_a_batch_exports_capacity_cost_demand_and_replicas() -> None:
    projector = Projector(ViewStore.from_url("redis://127.0.0.1:1/0", prefix="metrics-test"),
                          Rates(per_gpu_hour={"M1": 3.6}))
    feed = pipeline()
    feed.at(10.0).queues(queue("mq", "mteam", 8))
    feed.nodes(node("m-a", 4, model="M1"), node("m-b", 4, model="M1"))
    feed.at(20.0).submit("train", job("mteam", "mq").gpus(2).models("M1"))
    feed.submit("part", job("mteam", "mq").fraction(500))
    serve = [s.job_id for s in of(feed.send(DeployService, service=ServiceSpec(
        name="chat", replica=JobSpec(team="mteam", queue="mq", gpus=1), min_replicas=2, max_replicas=2)),
        JobSubmitted)]
    for j in ("train", "part", *serve):
        feed.send(JobStarted, job_id=j)
    for j in serve:
        feed.send(JobReady, job_id=j)
    feed.send(ReportServiceLoad, service="chat", metric="requests_per_s", value=50.0)
    feed.at(25.0).submit("waits", job("mteam", "mq").gpus(4).models("M1"))
    seen = project(feed, projector, 0)

    assert value("gpusched_model_gpus", vendor="nvidia", kind="gpu", model="M1", state="allocated") == 4.5
    assert value("gpusched_gpu_idle_ratio") == 3 / 8
    assert value("gpusched_gpu_fragmentation_ratio") == 0.5 / 3.5
    assert value("gpusched_gpu_demand_gpus", model="M1") == 4.5 + 4  # held, plus waiting and pinned to M1
    assert value("gpusched_allocated_gpus", team="mteam", model="M1") == 4.5
    assert value("gpusched_inference_replicas", queue="mq", service="chat", state="desired") == 2
    assert value("gpusched_inference_replicas", queue="mq", service="chat", state="ready") == 2
    assert value("gpusched_inference_load_per_replica", service="chat", metric="requests_per_s") == 25.0
    assert value("gpusched_inference_scale_up_seconds_count", service="chat") == 1  # deployed: 0 -> 2, ready
    assert value("gpusched_queue_oldest_pending_seconds", queue="mq") == 0.0
    assert value("gpusched_nodes", state="online") == 2

    feed.at(60.0).send(JobFinished, job_id="train")
    feed.send(DeleteService, name="chat")
    for j in serve:
        feed.send(JobEvicted, job_id=j, reason="cancelled")
    feed.send(GpuHealthChanged, node="m-a", index=3, healthy=False, reason="xid", xid=79)
    feed.send(NodeLost, node="m-b", reason="heartbeat")
    project(feed, projector, seen)
    assert value("gpusched_gpu_seconds_total", team="mteam", queue="mq", model="M1", priority="training") == 80 + 80
    assert value("gpusched_cost_total", team="mteam", model="M1") == 0.16
    assert value("gpusched_inference_replicas", queue="mq", service="chat", state="desired") is None
    assert value("gpusched_nodes", state="lost") == 1
    assert value("gpusched_node_online", node="m-b") == 0
    assert value("gpusched_node_unhealthy_gpus", node="m-a") == 1
    assert value("gpusched_queue_oldest_pending_seconds", queue="mq") == 35.0
