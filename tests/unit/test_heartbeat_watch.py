"""Node-telemetry's watch over agents: silence past the limit loses the node and evicts its jobs under the
agent's own report ids; a lost node heard again is registered again, once."""

from __future__ import annotations

from contracts import JobEvicted, JobFinished, JobPlaced, NodeLost, NodeRegistered, ReplicaPlacement
from libs.nodes.reports import report_id
from services.node_telemetry.heartbeats import HeartbeatWatch
from tests.unit.builders import node


def registered(name: str, source: str = "agent/x") -> NodeRegistered:
    return NodeRegistered(id=f"reg-{name}", ts=0.0, source=source, node=node(name, 2))


def placed(job: str, *nodes: str) -> JobPlaced:
    return JobPlaced(id=f"run-{job}", ts=0.0, source="placement", job_id=job, placements=tuple(
        ReplicaPlacement(replica=i, node=n, gpu_indices=(0,), gpu_milli=1000) for i, n in enumerate(nodes)))


def test_a_silent_agent_loses_its_node_and_its_jobs_once() -> None:
    watch = HeartbeatWatch(lost_after_s=10.0)
    for e in (registered("a"), registered("b"), registered("sim", source="node-telemetry"),
              placed("j1", "a"), placed("j2", "a", "b"), placed("j3", "b"), placed("done", "a"),
              JobFinished(id="f", ts=0.0, source="agent/a", job_id="done")):
        watch.fold(e)
    watch.start_clock(100.0)
    watch.heard("b", 109.0)
    assert watch.due(105.0) == ([], [])
    lost, back = watch.due(111.0)
    assert back == []
    assert [(type(e).__name__, getattr(e, "node", ""), getattr(e, "job_id", "")) for e in lost] == [
        ("NodeLost", "a", ""), ("JobEvicted", "", "j1"), ("JobEvicted", "", "j2")]
    assert [e.id for e in lost if isinstance(e, JobEvicted)] == [report_id("run-j1", "evicted"),
                                                                 report_id("run-j2", "evicted")]
    assert lost[0].reason.startswith("heartbeat_timeout")  # type: ignore[attr-defined]
    assert watch.due(112.0) == ([], [])  # reported once
    watch.fold(lost[0])
    assert isinstance(lost[0], NodeLost)

    watch.heard("a", 120.0)
    watch.heard("b", 120.0)
    lost, back = watch.due(120.5)
    assert lost == [] and [(type(e).__name__, e.node.name) for e in back] == [("NodeRegistered", "a")]
    assert watch.due(121.0) == ([], [])  # until the log echoes the registration
    watch.fold(back[0])
    assert watch.online["a"] and "sim" not in watch.specs  # nodes of the simulated cluster are not watched
