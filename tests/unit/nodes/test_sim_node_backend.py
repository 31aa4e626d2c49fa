"""SimNodeBackend: one node (or all) of a cluster CSV, or a synthesised node, with load and fault injection."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from libs.nodes.backend import AgentBackend, make_agent_backend, make_backend
from libs.nodes.health import HealthObservation, is_fatal
from libs.nodes.sim import ClusterCsvError, CsvClusterBackend, SimNodeBackend, load_cluster_csv

CSV = """sn,cpu_milli,memory_mib,gpu,model,nvlink,mig,rdma,rack
node-a,64000,262144,4,A100,4,,2,r1
node-b,32000,131072,2,T4,,1,,r2
cpu-only,16000,65536,0,,,,,r2
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    return path


@pytest.fixture
def node_a(cluster: Path) -> SimNodeBackend:
    return SimNodeBackend(cluster, "node-a")


def test_one_node_of_the_csv(cluster: Path, node_a: SimNodeBackend) -> None:
    [node] = node_a.discover()
    assert node == next(n for n in load_cluster_csv(cluster) if n.name == "node-a")
    assert [g.nvlink_group for g in node.gpus] == [0, 0, 0, 0]
    assert (node.rdma_nics, node.labels) == (2, {"rack": "r1"})
    assert SimNodeBackend(cluster, "cpu-only").discover()[0].gpus == ()  # asked by name: even without GPUs


def test_every_gpu_node_of_the_csv(cluster: Path) -> None:
    backend = SimNodeBackend(cluster)
    assert [n.name for n in backend.discover()] == ["node-a", "node-b"]
    assert backend.discover() == CsvClusterBackend(cluster).discover()
    with pytest.raises(ValueError, match="name the node"):
        backend.inject_xid(0, 79)
    backend.inject_xid(1, 79, node="node-b")
    assert backend.poll_health(0) == [HealthObservation("node-b", 1, "xid", 79, "XID 79 (injected)")]
    assert [g.healthy for n in backend.discover() for g in n.gpus] == [True] * 5 + [False]


def test_synthesised_node_for_the_benchmark(cluster: Path) -> None:
    [node] = SimNodeBackend(gpus=64).discover()
    assert (node.name, len(node.gpus)) == ("sim-node", 64)
    assert {g.model for g in node.gpus} == {"A100"} and node.gpus[0].memory_mib == 81920
    assert len({g.uuid for g in node.gpus}) == 64
    assert [g.nvlink_group for g in node.gpus[6:10]] == [0, 0, 1, 1]
    assert node.cpu_milli > 0 and node.memory_mib > 0
    # with gpus the CSV is not read; the model picks the memory
    [h200] = SimNodeBackend(cluster, "agent-7", gpus=2, model="H200", nvlink=0).discover()
    assert (h200.name, h200.gpus[0].model, h200.gpus[0].memory_mib, h200.gpus[0].nvlink_group) == (
        "agent-7", "H200", 143360, -1)


def test_bad_arguments(cluster: Path) -> None:
    with pytest.raises(ValueError, match="CSV or a GPU count"):
        SimNodeBackend()
    with pytest.raises(ClusterCsvError, match="no node named"):
        SimNodeBackend(cluster, "node-z")
    with pytest.raises(ValueError):
        SimNodeBackend(gpus=-1)


def test_samples_are_zero_until_set(node_a: SimNodeBackend) -> None:
    assert [(r.node, r.index, r.model, r.utilization, r.memory_used) for r in node_a.sample()] == [
        ("node-a", i, "A100", 0.0, 0.0) for i in range(4)]
    node_a.set_load(2, 0.9, 0.5)
    assert (node_a.sample()[2].utilization, node_a.sample()[2].memory_used) == (0.9, 0.5)


def test_injected_xid_is_reported_once_and_fatal_ones_mark_the_gpu(node_a: SimNodeBackend) -> None:
    node_a.inject_xid(1, 13)
    node_a.inject_xid(2, 79)
    observations = node_a.poll_health(0)
    assert [(o.index, o.kind, o.code, is_fatal(o)) for o in observations] == [(1, "xid", 13, False),
                                                                              (2, "xid", 79, True)]
    assert node_a.poll_health(0) == []
    assert [g.healthy for g in node_a.discover()[0].gpus] == [True, True, False, True]


def test_injected_ecc_reports_the_new_total(node_a: SimNodeBackend) -> None:
    node_a.inject_ecc(0, 2)
    node_a.inject_ecc(0)
    observations = node_a.poll_health(0)
    assert [(o.kind, o.code) for o in observations] == [("ecc", 2), ("ecc", 3)]
    assert all(is_fatal(o) for o in observations)
    assert not node_a.discover()[0].gpus[0].healthy
    with pytest.raises(ValueError):
        node_a.inject_ecc(0, 0)


def test_throttling_is_reported_while_it_lasts(node_a: SimNodeBackend) -> None:
    node_a.set_throttle(3, "thermal")
    node_a.set_throttle(3, "power")
    for _ in range(2):
        assert [(o.index, o.kind, o.code) for o in node_a.poll_health(0)] == [(3, "thermal", 1), (3, "power", 1)]
    node_a.set_throttle(3, "thermal", active=False)
    assert [o.kind for o in node_a.poll_health(0)] == ["power"]
    node_a.set_throttle(3, "power", active=False)
    assert node_a.poll_health(0) == []
    assert node_a.discover()[0].gpus[3].healthy  # throttling is not a failure
    with pytest.raises(ValueError):
        node_a.set_throttle(3, "fire")


def test_repair_brings_a_gpu_back(node_a: SimNodeBackend) -> None:
    node_a.inject_ecc(1, 1)
    node_a.set_throttle(1, "power")
    node_a.poll_health(0)
    node_a.repair(1)
    assert node_a.discover()[0].gpus[1].healthy
    assert node_a.poll_health(0) == []
    node_a.inject_ecc(1, 1)
    assert node_a.poll_health(0)[0].code == 1  # the volatile count restarted


def test_unknown_gpu_is_refused(node_a: SimNodeBackend) -> None:
    with pytest.raises(KeyError):
        node_a.inject_xid(9, 79)
    with pytest.raises(KeyError):
        node_a.set_load(0, 0.1, 0.1, node="node-b")


def test_poll_waits_for_the_timeout_and_wakes_on_a_fault(node_a: SimNodeBackend) -> None:
    started = time.monotonic()
    assert node_a.poll_health(50) == []
    assert time.monotonic() - started >= 0.04

    timer = threading.Timer(0.05, node_a.inject_xid, args=(0, 48))
    timer.start()
    started = time.monotonic()
    observations = node_a.poll_health(10_000)
    timer.join()
    assert [o.code for o in observations] == [48]
    assert time.monotonic() - started < 5


def test_factories(cluster: Path) -> None:
    backend: AgentBackend = make_agent_backend("sim", cluster, "node-b")
    assert [n.name for n in backend.discover()] == ["node-b"]
    backend.close()
    assert [n.name for n in make_agent_backend("sim", str(cluster)).discover()] == ["node-a", "node-b"]
    assert isinstance(make_backend("sim", str(cluster)), CsvClusterBackend)
