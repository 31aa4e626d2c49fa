"""Node-telemetry's core: which GPU faults quarantine a GPU, and which cordons take effect."""

from __future__ import annotations

import pytest

from contracts import (
    CordonNode,
    GpuFault,
    GpuHealthChanged,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    RemoveNode,
    UncordonNode,
)
from libs.core.accounting.ledger import Ledger
from libs.core.node_health.decider import NodeDecider
from tests.unit.builders import EventFeed, kinds, node


def feed() -> EventFeed:
    f = EventFeed(NodeDecider(), ledger=Ledger())
    f.nodes(node("n1", 4))
    return f


@pytest.mark.parametrize(("kind", "code", "reason"), [
    ("xid", 79, "xid_79"), ("xid", 48, "xid_48"), ("xid", 94, "xid_94"), ("ecc", 2, "ecc_uncorrectable"),
    ("xid", 13, None), ("xid", 31, None), ("thermal", 1, None), ("power", 1, None),
])
def test_fatal_faults_quarantine_the_gpu_once(kind: str, code: int, reason: str | None) -> None:
    f = feed()
    out = f.send(GpuFault, node="n1", index=2, kind=kind, code=code)
    if reason is None:
        assert out == []
        return
    assert [(e.node, e.index, e.healthy, e.reason) for e in out if isinstance(e, GpuHealthChanged)] == [
        ("n1", 2, False, reason)]
    assert f.send(GpuFault, node="n1", index=2, kind=kind, code=code) == []  # already out of service
    assert f.send(GpuFault, node="ghost", index=0, kind="xid", code=79) == []  # an unknown node: nothing
    assert f.ledger is not None and f.ledger.node_view("n1").healthy_gpus == 3


def test_cordon_drain_and_uncordon_are_decided_and_shown() -> None:
    f = feed()
    assert kinds(f.send(CordonNode, node="n1", reason="PSU", operator="ops")) == ["NodeCordoned"]
    assert f.send(CordonNode, node="n1") == []  # already cordoned
    drained = f.send(CordonNode, node="n1", drain=True, reason="replace PSU")
    assert [(e.drain, e.reason) for e in drained if isinstance(e, NodeCordoned)] == [(True, "replace PSU")]
    assert f.send(CordonNode, node="n1", drain=False) == []  # a drain is not softened back to a cordon
    assert f.ledger is not None
    assert (f.ledger.node_view("n1").cordon, f.ledger.node_view("n1").cordon_reason) == ("draining", "replace PSU")
    assert kinds(f.send(UncordonNode, node="n1", operator="ops")) == ["NodeUncordoned"]
    assert f.send(UncordonNode, node="n1") == []  # not cordoned
    assert f.send(CordonNode, node="ghost") == []
    assert f.ledger.node_view("n1").cordon == ""
    assert any(isinstance(e, NodeUncordoned) for e in f.log)


def test_an_operator_removes_a_node_once_and_the_views_forget_it_until_it_registers_again() -> None:
    f = feed()
    f.send(CordonNode, node="n1", drain=True)
    removed = f.send(RemoveNode, node="n1", reason="decommissioned", operator="ops")
    assert [(e.node, e.removed, e.reason) for e in removed if isinstance(e, NodeLost)] == [
        ("n1", True, "removed_by_operator: ops: decommissioned")]
    assert f.send(RemoveNode, node="n1") == []  # gone: nothing more to remove
    assert f.send(CordonNode, node="n1") == []  # nor to cordon
    assert f.ledger is not None and "n1" in f.ledger.state.removed_nodes and "n1" not in f.ledger.state.cordons
    f.nodes(node("n1", 4))
    assert "n1" not in f.ledger.state.removed_nodes and f.ledger.node_view("n1").online


def test_node_decisions_form_a_verifiable_chain_of_their_own() -> None:
    from contracts.codec import encode
    from libs.audit.verify import verify

    f = feed()
    f.send(GpuFault, node="n1", index=1, kind="xid", code=79)
    f.send(CordonNode, node="n1", drain=True)
    log = [(seq, encode(e)) for seq, e in enumerate(f.log, start=1)]
    report = verify(log, None)
    assert report.ok and report.decisions == 2 and report.heads["node-health"] != "0" * 32
    tampered = [(seq, raw.replace(b'"drain":true', b'"drain":false')) for seq, raw in log]
    assert not verify(tampered, None).ok


def test_a_cordoned_node_takes_no_new_job_until_uncordoned() -> None:
    from contracts import JobPlaced
    from tests.unit.builders import job, pipeline, queue

    f = pipeline(ledger=True)
    f.queues(queue("ml-train", "ml"))
    f.nodes(node("a", 2), node("b", 2))
    f.send(NodeCordoned, node="a", reason="maintenance")
    first = f.submit("j1", job().gpus(2))
    assert [p.node for e in first if isinstance(e, JobPlaced) for p in e.placements] == ["b"]
    second = f.submit("j2", job().gpus(2))
    assert not [e for e in second if isinstance(e, JobPlaced)]  # only the cordoned node has room
    f.send(NodeRegistered, node=node("a", 2))  # an agent restarting does not lift the cordon
    assert not [e for e in f.log if isinstance(e, JobPlaced) and e.job_id == "j2"]
    back = f.send(NodeUncordoned, node="a")
    assert [(e.job_id, e.placements[0].node) for e in back if isinstance(e, JobPlaced)] == [("j2", "a")]


def test_replay_re_derives_the_node_decisions_and_catches_a_changed_one() -> None:
    import msgspec

    from contracts.codec import encode
    from libs.audit.replay import replay

    f = feed()
    f.send(GpuFault, node="n1", index=1, kind="xid", code=79)
    f.send(CordonNode, node="n1", reason="fan")
    log = [(seq, encode(e)) for seq, e in enumerate(f.log, start=1)]
    report = replay(log)
    assert report.mismatches == [] and report.decisions_checked == 2
    forged = [(seq, encode(msgspec.structs.replace(e, reason="other")) if isinstance(e, NodeCordoned) else raw)
              for (seq, raw), e in zip(log, f.log, strict=True)]
    assert [m.service for m in replay(forged).mismatches] == ["node-health"]
