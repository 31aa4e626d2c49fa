"""The Ascend backend reads NPUs from npu-smi's text: a real server's output parses to its inventory, the
simulated servers answer as real ones do, and a worse health takes an NPU out of service as an XID does."""

from __future__ import annotations

import pytest

from contracts import GpuFault
from libs.core.node_health.gpu_faults import fault_reason
from libs.nodes.ascend import AscendBackend, AscendUnavailable
from libs.nodes.ascend_sim import SERVERS, SimulatedNpuSmi
from libs.nodes.health import HealthObservation, is_fatal
from libs.nodes.npu_smi import NpuSmiError, parse_error_codes, parse_info, parse_topology, short_npu_model
from libs.nodes.sim import SimNodeBackend, parse_cluster_csv

# As an Atlas 800T A2 prints it (two of its eight NPUs), with the process table after the devices.
REAL_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0.3                 Version: 24.1.0.3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 91.4        49                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3387 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Alarm         | 91.3        50                0    / 0             |
| 0                         | 0000:01:00.0  | 37          0    / 0          40000 / 65536        |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 1       0                 | 4101          | python                   | 36000                   |
+===========================+===============+====================================================+
"""

# An Ascend 910 server of the older generation: memory and HBM both listed, HBM last.
REAL_910A = """\
+----------------------+---------------+----------------------------------------------------+
| NPU   Name           | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                 | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+======================+===============+====================================================+
| 0     910A           | OK            | 0.0         40                0    / 0             |
| 0                    | 0000:C1:00.0  | 0           882  / 15169      0    / 32768         |
+======================+===============+====================================================+
"""


def test_a_real_910b_listing_parses_chip_by_chip() -> None:
    chips = parse_info(REAL_910B)
    assert [(c.npu_id, c.chip_id, c.name, c.health, c.bus_id) for c in chips] == [
        (0, 0, "910B3", "OK", "0000:C1:00.0"), (1, 0, "910B3", "Alarm", "0000:01:00.0")]
    assert (chips[1].ai_core_percent, chips[1].hbm_used_mib, chips[1].hbm_total_mib) == (37.0, 40000, 65536)
    assert [c.healthy for c in chips] == [True, False]


def test_the_older_910_listing_takes_hbm_not_memory() -> None:
    (chip,) = parse_info(REAL_910A)
    assert (chip.hbm_used_mib, chip.hbm_total_mib) == (0, 32768)


def test_a_listing_of_no_npu_is_an_error_not_an_empty_node() -> None:
    with pytest.raises(NpuSmiError):
        parse_info("+---+\n| npu-smi 24.1.rc2  Version: 24.1.rc2 |\n+---+\n")


@pytest.mark.parametrize(("name", "model"), [
    ("910A", "Ascend910"), ("910ProB", "Ascend910"), ("910B", "Ascend910B"), ("910B3", "Ascend910B"),
    ("910B4", "Ascend910B"), ("910_9391", "Ascend910C"), ("Ascend910_9382", "Ascend910C"), ("310P3", "Ascend310P"),
])
def test_npu_names_shorten_to_the_model_quotas_use(name: str, model: str) -> None:
    assert short_npu_model(name) == model


def test_the_910_matrix_gives_two_rings_of_four() -> None:
    groups = parse_topology(SimulatedNpuSmi(SERVERS["atlas800-910"]).topology())
    assert groups == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_fault_codes_are_read_and_na_is_none() -> None:
    listed = "  Health Status : Critical\n  Error Code : 80E18005 80C98008\n"
    assert parse_error_codes(listed) == ("80E18005", "80C98008")
    assert parse_error_codes("  Health Status : OK\n  Error Code : NA\n") == ()


@pytest.mark.parametrize(("layout", "model", "count", "groups"), [
    ("atlas800-910", "Ascend910", 8, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("atlas800t-a2", "Ascend910B", 8, [0] * 8),
    ("atlas900-a3", "Ascend910C", 16, [0] * 16),
])
def test_a_simulated_server_registers_as_its_npus(layout: str, model: str, count: int, groups: list[int]) -> None:
    (node,) = AscendBackend("npu-1", run=SimulatedNpuSmi(SERVERS[layout])).discover()
    assert [(g.model, g.kind, g.vendor) for g in node.gpus] == [(model, "npu", "huawei")] * count
    assert [g.hccs_group for g in node.gpus] == groups
    assert [g.index for g in node.gpus] == list(range(count))
    assert all(g.healthy and g.memory_mib >= 32768 for g in node.gpus)


def test_load_is_read_as_shares() -> None:
    smi = SimulatedNpuSmi(SERVERS["atlas800t-a2"])
    smi.set_load(3, 80.0, 32768)
    reading = AscendBackend("npu-1", run=smi).sample()[3]
    assert (reading.model, reading.utilization, reading.memory_used) == ("Ascend910B", 0.8, 0.5)


def test_a_worse_health_is_reported_once_and_takes_the_npu_out_from_an_alarm_on() -> None:
    smi = SimulatedNpuSmi(SERVERS["atlas800-910"])
    backend = AscendBackend("npu-1", run=smi)
    assert backend.poll_health(0) == []
    smi.set_health(2, 1)
    (warning,) = backend.poll_health(0)
    assert (warning.index, warning.kind, warning.code, is_fatal(warning)) == (2, "npu", 1, False)
    smi.set_health(5, 3, ["80E18005"])
    (critical,) = backend.poll_health(0)
    assert (critical.index, critical.code, is_fatal(critical)) == (5, 3, True)
    assert "80E18005" in critical.detail
    assert backend.poll_health(0) == []  # news once, as ECC counts are
    smi.set_health(5, 0)  # the driver says OK again, but only a reset GPU or NPU comes back (a new backend)
    (node,) = backend.discover()
    assert [g.index for g in node.gpus if not g.healthy] == [5]


def test_the_core_quarantines_an_npu_from_an_alarm_on() -> None:
    def fault(code: int) -> GpuFault:
        return GpuFault(id="f", ts=0.0, source="agent", node="n", index=0, kind="npu", code=code)
    assert [fault_reason(fault(level)) for level in (1, 2, 3)] == [None, "npu_alarm", "npu_critical"]


def test_without_npu_smi_the_backend_says_so() -> None:
    def missing(args: object) -> str:
        raise AscendUnavailable("npu-smi is not installed (no Ascend driver?)")
    with pytest.raises(AscendUnavailable, match="npu-smi"):
        AscendBackend("n", run=missing).discover()


def test_a_cluster_csv_mixes_gpu_nodes_and_ascend_servers() -> None:
    nodes = parse_cluster_csv("sn,cpu_milli,memory_mib,gpu,model\n"
                              "g1,64000,262144,8,A100\nn1,192000,786432,8,Ascend910\n")
    gpu_node, npu_node = nodes
    assert {(g.kind, g.vendor, g.hccs_group) for g in gpu_node.gpus} == {("gpu", "nvidia", -1)}
    assert [g.hccs_group for g in npu_node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {(g.kind, g.vendor, g.memory_mib) for g in npu_node.gpus} == {("npu", "huawei", 32768)}


def test_the_simulated_agent_backend_injects_npu_faults(tmp_path: object) -> None:
    backend = SimNodeBackend(gpus=8, model="Ascend910", node_name="npu-1")
    backend.inject_npu_health(6, 3)
    (obs,) = backend.poll_health(0)
    assert obs == HealthObservation("npu-1", 6, "npu", 3, "NPU health level 3 (injected)")
    (node,) = backend.discover()
    assert [g.index for g in node.gpus if not g.healthy] == [6]


def test_the_probe_prints_a_simulated_servers_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import runpy
    from pathlib import Path

    probe = runpy.run_path(str(Path(__file__).resolve().parents[3] / "scripts" / "npu_probe.py"))
    assert probe["main"](["--node", "npu-1", "--simulate", "atlas800-910"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["hccs_group"] for g in report["nodes"][0]["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "HCCS" in report["npu_smi"]["topo"]


def test_the_probe_says_why_without_npu_smi(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import runpy
    from pathlib import Path

    monkeypatch.setenv("PATH", "/nonexistent")
    probe = runpy.run_path(str(Path(__file__).resolve().parents[3] / "scripts" / "npu_probe.py"))
    assert probe["main"](["--node", "npu-1"]) == 2
    assert "npu-smi is not installed" in capsys.readouterr().err
