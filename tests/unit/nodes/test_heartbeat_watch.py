"""Node-telemetry's roster and its watch over agents: silence past the limit loses the node; a lost node
heard again is registered again, once; the runs of a node lost for the grace are reported evicted under the
executor's own report ids; nodes of another cluster source than the platform's leave at start."""

from __future__ import annotations

from contracts import JobCheckpointed, JobEvicted, JobFinished, JobPlaced, NodeLost, NodeRegistered, ReplicaPlacement
from libs.nodes.reports import RunReports
from services.node_telemetry.heartbeats import HeartbeatWatch
from services.node_telemetry.roster import NodeRoster
from tests.unit.builders import node


def registered(name: str, source: str = "agent/x") -> NodeRegistered:
    return NodeRegistered(id=f"reg-{name}", ts=0.0, source=source, node=node(name, 2))


def placed(job: str, *nodes: str) -> JobPlaced:
    return JobPlaced(id=f"run-{job}", ts=0.0, source="placement", job_id=job, placements=tuple(
        ReplicaPlacement(replica=i, node=n, gpu_indices=(0,), gpu_milli=1000) for i, n in enumerate(nodes)))


def brief(events: list) -> list[tuple[str, str, str]]:  # type: ignore[type-arg]
    return [(type(e).__name__, getattr(e, "node", ""), getattr(e, "job_id", "")) for e in events]


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
    assert back == [] and brief(lost) == [("NodeLost", "a", "")]
    assert lost[0].reason.startswith("heartbeat_timeout")  # type: ignore[attr-defined]
    assert watch.due(112.0) == ([], [])  # reported once
    watch.fold(lost[0])
    # The jobs of the lost node, once the executor had its grace to say so itself, under its report ids.
    assert watch.orphans(lost[0].ts + 1.0) == []
    evicted = watch.orphans(lost[0].ts + 2.0)
    assert brief(evicted) == [("JobEvicted", "", "j1"), ("JobEvicted", "", "j2")]
    assert [e.id for e in evicted] == [RunReports(job, f"run-{job}", "").report_id("evicted") for job in ("j1", "j2")]
    assert watch.orphans(lost[0].ts + 3.0) == []  # once

    watch.heard("a", 120.0)
    watch.heard("b", 120.0)
    lost, back = watch.due(120.5)
    assert lost == [] and [(type(e).__name__, e.node.name) for e in back] == [("NodeRegistered", "a")]
    assert watch.due(121.0) == ([], [])  # until the log echoes the registration
    watch.fold(back[0])
    assert watch.roster.online["a"] and watch.roster.owners["a"] == "agents"  # still the agent's node
    assert "sim" not in watch.roster.nodes_of("agents")  # nodes of the simulated cluster are not watched


def test_an_agent_registered_after_the_start_that_never_heartbeats_is_lost() -> None:
    watch = HeartbeatWatch(lost_after_s=10.0)
    watch.start_clock(100.0)
    watch.fold(registered("late"))
    assert watch.due(101.0) == ([], [])
    lost, _ = watch.due(112.0)
    assert brief(lost) == [("NodeLost", "late", "")]


def test_nodes_of_another_cluster_source_leave_with_their_jobs() -> None:
    roster = NodeRoster()
    for e in (registered("sim-1", source="node-telemetry"), registered("sim-2", source="node-telemetry"),
              registered("agent-0", source="agent/agent-0"), registered("gpu-node", source="kube-bridge"),
              placed("on-sim", "sim-1"), placed("on-agent", "agent-0")):
        roster.fold(e)
    # The platform now runs node agents: the simulated nodes and the Kubernetes one are nobody's.
    removals = roster.reconcile("agents", None, now=50.0)
    assert brief(removals) == [("NodeLost", "gpu-node", ""), ("NodeLost", "sim-1", ""), ("NodeLost", "sim-2", "")]
    assert all(isinstance(e, NodeLost) and e.removed and e.reason.startswith("absent_from_source") for e in removals)
    for e in removals:
        roster.fold(e)
    assert sorted(roster.specs) == ["agent-0"] and roster.reconcile("agents", None, now=52.0) == []
    assert brief(roster.orphans(52.0, set())) == [("JobEvicted", "", "on-sim")]
    # Back to the simulated cluster with a file that lists only sim-2: the agent's node and sim-1 leave.
    roster = NodeRoster()
    for e in (registered("sim-1", source="node-telemetry"), registered("sim-2", source="node-telemetry"),
              registered("agent-0", source="agent/agent-0")):
        roster.fold(e)
    assert brief(roster.reconcile("sim", {"sim-2"}, now=60.0)) == [("NodeLost", "agent-0", ""),
                                                                   ("NodeLost", "sim-1", "")]


def test_a_removal_is_the_same_message_however_often_it_is_decided() -> None:
    roster = NodeRoster()
    roster.fold(registered("old", source="node-telemetry"))
    first, again = roster.reconcile("agents", None, 1.0), roster.reconcile("agents", None, 2.0)
    assert [e.id for e in first] == [e.id for e in again]


def test_an_eviction_already_reported_by_the_executor_ends_the_run_for_the_roster() -> None:
    roster = NodeRoster()
    for e in (registered("a"), placed("j", "a"), NodeLost(id="l", ts=10.0, source="kube-bridge", node="a", reason="x"),
              JobEvicted(id=RunReports("j", "run-j", "").report_id("evicted"), ts=10.0, source="kube-bridge",
                         job_id="j", run="run-j", reason="node_lost")):
        roster.fold(e)
    assert roster.orphans(100.0, set()) == []


def test_an_eviction_on_the_executors_behalf_keeps_the_runs_last_checkpoint() -> None:
    roster = NodeRoster()
    for e in (registered("a"), placed("j", "a"),
              JobCheckpointed(id="c", ts=5.0, source="agent/a", job_id="j", run="run-j", checkpoint="s3://j/7",
                              progress_s=7.0),
              NodeLost(id="l", ts=10.0, source="node-telemetry", node="a", reason="heartbeat_timeout")):
        roster.fold(e)
    [evicted] = roster.orphans(12.0, set())
    assert isinstance(evicted, JobEvicted) and (evicted.checkpoint, evicted.progress_s) == ("s3://j/7", 7.0)


def test_runs_the_simulated_executor_of_this_process_stops_itself_are_not_reported_twice() -> None:
    roster = NodeRoster(served_here="node-telemetry")
    for e in (registered("sim", source="node-telemetry"), registered("a"), placed("on-sim", "sim"),
              placed("on-agent", "a"),
              NodeLost(id="l1", ts=0.0, source="node-telemetry", node="sim", reason="x", removed=True),
              NodeLost(id="l2", ts=0.0, source="node-telemetry", node="a", reason="x", removed=True)):
        roster.fold(e)
    assert brief(roster.orphans(10.0, set())) == [("JobEvicted", "", "on-agent")]
