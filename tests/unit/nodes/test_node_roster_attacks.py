"""Attacks on the "nodes nobody serves" change: event sequences around node removal (RemoveNode,
NodeLost(removed=True), the roster's reconciliation) that break a guarantee of ../shared/DESIGN.md.

Each test is a finding: it fails on the current code because the behaviour is wrong."""

from __future__ import annotations

from contracts import (
    CordonNode,
    JobPlaced,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    RemoveNode,
    UncordonNode,
)
from libs.core.accounting.ledger import Ledger
from libs.core.admission.decider import AdmissionDecider
from libs.core.node_health.decider import NodeDecider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, job, node, queue


def platform() -> EventFeed:
    """Node decisions, admission, quota, placement and preemption, with the ledger (the views)."""
    return EventFeed(NodeDecider(), AdmissionDecider(), QuotaDecider(), PlacementDecider(), PreemptionDecider(),
                     ledger=Ledger())


def placed_on(events: list, job_id: str) -> list[str]:
    return [p.node for e in events if isinstance(e, JobPlaced) and e.job_id == job_id for p in e.placements]


def test_a_drained_node_removed_and_registered_again_never_takes_a_job_and_cannot_be_uncordoned() -> None:
    """Guarantee: a node that registers again after removal is usable (and the views agree with the deciders).

    An operator drains node `a` (replacing a PSU), then removes it (`gpusched node remove a`). The removal
    forgets the cordon in the node decider and in the ledger (the view shows `a` online, not cordoned, once it
    registers again), but placement's Cluster (`_cordoned`) and quota's Fleet (`cordoned`) keep it: they fold
    NodeLost only as "offline", and a registration deliberately does not lift a cordon. So the node comes back
    cordoned for ever in placement: no job is ever placed there, and `gpusched node uncordon a` is refused by
    the node decider (not cordoned as far as it knows), so nothing can lift it."""
    f = platform()
    f.queues(queue("ml-train", "ml"))
    f.nodes(node("a", 2))
    f.send(CordonNode, node="a", drain=True, reason="PSU", operator="ops")
    removed = f.send(RemoveNode, node="a", reason="decommissioned", operator="ops")
    assert [e.removed for e in removed if isinstance(e, NodeLost)] == [True]
    f.send(NodeRegistered, node=node("a", 2))  # back, repaired: "a node that registers again is back"
    assert f.ledger is not None
    view = f.ledger.node_view("a")
    assert view.online and view.cordon == ""  # what every view says: online, not cordoned

    out = f.submit("j", job().gpus(2))
    uncordoned = f.send(UncordonNode, node="a", operator="ops")  # the operator tries to help
    out += uncordoned
    assert placed_on(out, "j") == ["a"], (
        f"the re-registered node never takes the job (uncordon decided: "
        f"{[type(e).__name__ for e in uncordoned if isinstance(e, NodeUncordoned)]})")


def test_the_simulated_cluster_comes_back_empty_after_a_turn_with_node_agents() -> None:
    """Guarantee: a node that registers again after removal is usable (no job waits on a node nobody serves:
    here, on no node at all).

    The newcomer's path in one folder: the demo (simulated cluster), then `up --agents 2` (node-telemetry's
    reconciliation removes the simulated nodes: NodeLost(removed)), then the demo again. At that start
    node-telemetry does what app.announce_inventory does: reconcile (nothing: the simulated nodes are no longer
    in the roster), then announce the inventory changes of the cluster file. But the simulated executor's
    InventoryBook folds only NodeRegistered: it still holds sim-1 and sim-2 as last registered, finds them
    unchanged and announces nothing. The simulated cluster's nodes never register again; the platform runs the
    simulated backend with no node at all (every job waits for ever)."""
    from libs.core.node_health.announcements import registration_id
    from libs.sim.live_executor import SimExecutor
    from services.node_telemetry.handler import NodeTelemetry
    from services.node_telemetry.heartbeats import HeartbeatWatch

    cluster_file = [node("sim-1", 2), node("sim-2", 2)]
    log: list = []
    # 1. The demo: node-telemetry announces the simulated cluster.
    log += [NodeRegistered(id=registration_id(n, 1), ts=1.0, source="node-telemetry", correlation_id=n.name, node=n)
            for n in cluster_file]
    # 2. `up --agents 2` in the same folder: the simulated nodes are nobody's now, and leave.
    agents = NodeTelemetry(watch=HeartbeatWatch())
    for seq, e in enumerate(log, start=1):
        agents.replay(seq, e)
    log += agents.watch.roster.reconcile("agents", None, now=10.0)
    assert [e.node for e in log if isinstance(e, NodeLost) and e.removed] == ["sim-1", "sim-2"]
    # 3. The demo again: what node-telemetry's start (app.announce_inventory) publishes.
    demo = NodeTelemetry(executor=SimExecutor(bus=None), watch=HeartbeatWatch())
    for seq, e in enumerate(log, start=1):
        demo.replay(seq, e)
    assert demo.executor is not None
    announced = [*demo.watch.roster.reconcile("sim", {n.name for n in cluster_file}, now=20.0),
                 *demo.executor.inventory.changes(cluster_file, now=20.0)]
    assert sorted(e.node.name for e in announced if isinstance(e, NodeRegistered)) == ["sim-1", "sim-2"], (
        f"the simulated cluster's nodes are never announced again: {announced}")


def test_an_agent_node_heard_again_while_its_removal_is_in_flight_becomes_nobodys_and_keeps_its_jobs() -> None:
    """Guarantee: a job never stays placed on a node nobody serves.

    Agent node `x` goes silent and is lost (heartbeat timeout). The operator removes it (`gpusched node remove
    x`): the node decider's NodeLost(removed) is published. Before node-telemetry's roster folds it back, the
    partition heals: the watch (a background task, every 0.5 s) hears `x` and publishes the comeback
    registration, so the log reads NodeLost(removed) then NodeRegistered(x, source node-telemetry). Folding
    them, the removal deletes `x`'s owner, and the comeback's source ("node-telemetry") then makes `x` a node of
    the simulated cluster. From then on `x` is registered and online, but no longer among the agents' nodes the
    watch looks after: when its agent dies for good, `x` is never lost again, and a job placed there stays
    placed (on the agents backend nothing else serves it) until some later restart's reconciliation."""
    from contracts import ReplicaPlacement
    from services.node_telemetry.heartbeats import HeartbeatWatch

    watch = HeartbeatWatch(lost_after_s=10.0)
    watch.fold(NodeRegistered(id="reg-x", ts=0.0, source="agent/x", node=node("x", 2)))
    watch.start_clock(100.0)
    lost, _ = watch.due(111.0)
    assert [e.node for e in lost if isinstance(e, NodeLost)] == ["x"]
    for e in lost:
        watch.fold(e)
    removal = NodeLost(id="removed-x", ts=115.0, source="node-health", node="x", removed=True,
                       reason="removed_by_operator: ops")  # decided, published, not folded back yet
    watch.heard("x", 115.2)
    _, back = watch.due(115.5)
    assert [e.node.name for e in back if isinstance(e, NodeRegistered)] == ["x"]
    for e in (removal, *back):  # the log's order
        watch.fold(e)
    assert watch.roster.online.get("x")  # x is registered and online again: placement may use it
    watch.fold(JobPlaced(id="run-j", ts=116.0, source="placement", job_id="j", placements=(
        ReplicaPlacement(replica=0, node="x", gpu_indices=(0,), gpu_milli=1000),)))

    # The agent on x dies for good: nothing is heard from x any more.
    events: list = []
    for now in (130.0, 200.0, 300.0):
        lost, _ = watch.due(now)
        for e in lost:
            watch.fold(e)
        events += lost + watch.orphans(now)
    assert [(type(e).__name__, getattr(e, "node", "") or getattr(e, "job_id", "")) for e in events] == [
        ("NodeLost", "x"), ("JobEvicted", "j")], (
        f"x, silent for 185 s, is never lost and job j stays placed on it: x's owner is now "
        f"{watch.roster.owners.get('x')!r}, not the agents'")


def test_a_restarted_node_telemetry_registers_a_dead_agents_lost_node_again_without_hearing_it() -> None:
    """Guarantee: a job never stays placed on a node nobody serves (here: a node comes back with no one there).

    Agent node `x` was lost (heartbeat timeout) and its agent is gone for good. Node-telemetry restarts (an
    upgrade, a crash, `up` again): the roster is rebuilt from the log (x registered, then lost), and
    `start_clock` gives every agent node, x included, a last heartbeat of "now" so it has a whole
    `lost_after_s` to be heard from. But `due` reads that made-up heartbeat as x being heard again: x is lost,
    "silent" for 0.5 s, so it publishes the comeback NodeRegistered(x) without any heartbeat. Placement puts
    jobs on x, which nobody runs, until x times out again (lost_after_s + the roster's grace), and the same
    happens after every restart. (The start clock predates this change, but the change makes every
    backend's node-telemetry watch the agents' nodes.)"""
    from services.node_telemetry.heartbeats import HeartbeatWatch

    log: list = [NodeRegistered(id="reg-x", ts=0.0, source="agent/x", node=node("x", 2))]
    before = HeartbeatWatch(lost_after_s=10.0)
    before.fold(log[0])
    before.start_clock(100.0)
    lost, _ = before.due(111.0)
    log += lost
    assert [e.node for e in lost if isinstance(e, NodeLost)] == ["x"]

    restarted = HeartbeatWatch(lost_after_s=10.0)  # the agent on x never heartbeats again
    for e in log:
        restarted.fold(e)
    restarted.start_clock(500.0)
    _, back = restarted.due(500.5)
    assert back == [], f"x registered again though nothing was heard from it: {back}"
