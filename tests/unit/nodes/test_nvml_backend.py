"""NvmlBackend against a fake pynvml: inventory, topology, MIG, graceful degradation and health polling."""

from __future__ import annotations

import json
import math
import runpy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from libs.nodes.backend import make_agent_backend
from libs.nodes.health import FATAL_XIDS, HealthObservation, is_fatal
from libs.nodes.nvml import NvmlBackend, NvmlUnavailable, mig_profile, pci_key, short_model
from libs.nodes.sim import SimNodeBackend

MIB = 1 << 20
XID = 0x8
ROOT = Path(__file__).resolve().parents[3]

# --- a fake pynvml --------------------------------------------------------------------------------------


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return type(self).__name__


# The error classes carry pynvml's names, so that messages read the same.
class NVMLError_InvalidArgument(NVMLError):
    value = 2


class NVMLError_NotSupported(NVMLError):
    value = 3


class NVMLError_NotFound(NVMLError):
    value = 6


class NVMLError_Timeout(NVMLError):
    value = 10


class NVMLError_FunctionNotFound(NVMLError):
    value = 13


class NVMLError_GpuIsLost(NVMLError):
    value = 15


@dataclass
class FakeMig:
    name: str
    uuid: str
    total: int
    gi: int
    ci: int


@dataclass
class FakeGpu:
    """One GPU as the fake driver knows it; a field set to None makes its query raise NotSupported."""

    index: int
    bus: str
    name: str | None = "NVIDIA A100-SXM4-80GB"
    uuid: str | None = "auto"  # GPU-<index>
    total: int | None = 81920 * MIB
    used: int = 0
    util: int | None = 0
    mig: bool | None = False
    migs: dict[int, FakeMig] = field(default_factory=dict)
    mig_slots: int = 7
    # link -> remote bus id (active links); None: no NVLink at all
    nvlinks: dict[int, str] | None = None
    link_count: int = 12
    remote_known: bool = True
    p2p_nvlink: set[int] = field(default_factory=set)
    ecc: int | None = 0
    remap_failed: bool | None = False
    reasons: int = 0
    xid_supported: bool = True
    lost: bool = False


def _need(value: Any) -> Any:
    if value is None:
        raise NVMLError_NotSupported()
    return value


class FakeNvml:
    """The subset of pynvml NvmlBackend uses, over a list of FakeGpu."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus: list[FakeGpu], *, events: bool = True, event_reasons: bool = True) -> None:
        self.gpus = gpus
        self.inits = self.shutdowns = 0
        self.sets_created = self.sets_freed = 0
        self.registered: list[int] = []
        self.queued: list[SimpleNamespace | NVMLError] = []
        self.waits: list[int] = []
        self.events = events
        # An older pynvml knows only the "throttle" name of the clock reasons query.
        self.missing = set() if event_reasons else {"nvmlDeviceGetCurrentClocksEventReasons"}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # session
    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    # devices
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        if self.gpus[i].lost:
            raise NVMLError_GpuIsLost()
        return self.gpus[i]

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetName(self, h: FakeGpu | FakeMig) -> str:
        return _need(h.name)

    def nvmlDeviceGetUUID(self, h: FakeGpu | FakeMig) -> str:
        if isinstance(h, FakeGpu) and h.uuid == "auto":
            return f"GPU-{h.index:04d}"
        return _need(h.uuid)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu | FakeMig) -> SimpleNamespace:
        used = h.used if isinstance(h, FakeGpu) else 0
        return SimpleNamespace(total=_need(h.total), used=used, free=(h.total or 0) - used)

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=h.bus.encode(), busIdLegacy=h.bus[4:].encode())

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=_need(h.util), memory=0)

    # MIG
    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        return [int(_need(h.mig)), int(_need(h.mig))]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return h.mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, slot: int) -> FakeMig:
        if slot not in h.migs:
            raise NVMLError_NotFound()
        return h.migs[slot]

    def nvmlDeviceGetGpuInstanceId(self, m: FakeMig) -> int:
        return m.gi

    def nvmlDeviceGetComputeInstanceId(self, m: FakeMig) -> int:
        return m.ci

    # topology
    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        if h.nvlinks is None:
            raise NVMLError_NotSupported()
        if link >= h.link_count:
            raise NVMLError_InvalidArgument()
        return 1 if link in h.nvlinks else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGpu, link: int) -> SimpleNamespace:
        if not h.remote_known or h.nvlinks is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(busId=h.nvlinks[link].encode())

    def nvmlDeviceGetP2PStatus(self, a: FakeGpu, b: FakeGpu, caps: int) -> int:
        assert caps == 2
        return 0 if b.index in a.p2p_nvlink else 5

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGpu, b: FakeGpu) -> int:
        return 10 if a.bus[9] == b.bus[9] else 50  # same first hex digit of the bus: one PCIe switch

    # health
    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)  # uncorrected, volatile
        return _need(h.ecc)

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return (0, 0, 0, int(_need(h.remap_failed)))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return h.reasons

    # events
    def nvmlEventSetCreate(self) -> str:
        if not self.events:
            raise NVMLError_NotSupported()
        self.sets_created += 1
        return "event-set"

    def nvmlEventSetFree(self, events: str) -> None:
        self.sets_freed += 1

    def nvmlDeviceGetSupportedEventTypes(self, h: FakeGpu) -> int:
        return XID | 0x1 if h.xid_supported else 0x1

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, events: str) -> None:
        assert types == XID and events == "event-set"
        self.registered.append(h.index)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> SimpleNamespace:
        self.waits.append(timeout_ms)
        if not self.queued:
            raise NVMLError_Timeout()
        event = self.queued.pop(0)
        if isinstance(event, NVMLError):
            raise event
        return event

    def queue_xid(self, index: int, code: int, event_type: int = XID, gi: int = 0xFFFFFFFF) -> None:
        self.queued.append(SimpleNamespace(device=self.gpus[index], eventType=event_type, eventData=code,
                                           gpuInstanceId=gi, computeInstanceId=0xFFFFFFFF))


def standard_gpus() -> list[FakeGpu]:
    """GPUs 0 and 1 joined by two NVLinks; GPU 2 on PCIe only, MIG-enabled, without ECC or remap reports."""
    nv0 = {0: "00000000:0F:00.0", 1: "00000000:0F:00.0"}
    nv1 = {0: "00000000:07:00.0", 1: "00000000:07:00.0"}
    migs = {0: FakeMig("NVIDIA A100-PCIE-40GB MIG 1g.5gb", "MIG-a", 4864 * MIB, 7, 0),
            2: FakeMig("NVIDIA A100-PCIE-40GB MIG 3g.20gb", "MIG-b", 19968 * MIB, 2, 0)}
    return [
        FakeGpu(0, "00000000:07:00.0", nvlinks=nv0),
        FakeGpu(1, "00000000:0F:00.0", nvlinks=nv1),
        FakeGpu(2, "00000000:87:00.0", name="NVIDIA A100-PCIE-40GB", total=40960 * MIB, util=None,
                mig=True, migs=migs, ecc=None, remap_failed=None, xid_supported=False),
    ]


@pytest.fixture
def ib(tmp_path: Path) -> Path:
    path = tmp_path / "infiniband"
    for nic in ("mlx5_0", "mlx5_1"):
        (path / nic).mkdir(parents=True)
    return path


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(standard_gpus())


@pytest.fixture
def backend(nvml: FakeNvml, ib: Path) -> NvmlBackend:
    return NvmlBackend("gpu-node-1", labels={"rack": "r1"}, infiniband_path=ib, nvml=nvml)


# --- inventory ------------------------------------------------------------------------------------------


def test_discover_reports_gpus_topology_mig_and_host(backend: NvmlBackend) -> None:
    [node] = backend.discover()
    assert node.name == "gpu-node-1"
    assert node.labels == {"rack": "r1"}
    assert node.rdma_nics == 2
    assert node.cpu_milli > 0 and node.memory_mib > 0
    g0, _, g2 = node.gpus
    assert (g0.index, g0.model, g0.memory_mib, g0.uuid) == (0, "A100", 81920, "GPU-0000")
    assert (g2.model, g2.memory_mib) == ("A100", 40960)
    assert [g.nvlink_group for g in node.gpus] == [0, 0, -1]
    assert [g.mig_enabled for g in node.gpus] == [False, False, True]
    assert all(g.healthy for g in node.gpus)


def test_details_carry_mig_instances_peers_pcie_and_unknowns(backend: NvmlBackend) -> None:
    backend.discover()
    details = backend.details()
    assert details[0].nvlink_peers == (1,) and details[2].nvlink_peers == ()
    assert details[0].pci_bus_id == "00000000:07:00.0"
    assert details[0].pcie == {1: "single", 2: "system"}
    assert [(m.slot, m.profile, m.memory_mib, m.gpu_instance_id) for m in details[2].mig_devices] == [
        (0, "1g.5gb", 4864, 7), (2, "3g.20gb", 19968, 2)]
    # GPU 2's driver answers neither ECC nor row-remapping nor NVLink queries: unknown, not unhealthy
    assert {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetNvLinkState"} <= set(
        details[2].unknown)
    assert "nvmlDeviceGetMigDeviceHandleByIndex" not in details[2].unknown  # empty slots are not unknowns


def test_unsupported_identity_queries_degrade_to_unknown(ib: Path) -> None:
    gpu = FakeGpu(0, "00000000:07:00.0", name=None, uuid=None, total=None, mig=None)
    [node] = NvmlBackend("n", infiniband_path=ib, nvml=FakeNvml([gpu])).discover()
    assert node.gpus[0].model == "unknown"
    assert (node.gpus[0].memory_mib, node.gpus[0].uuid, node.gpus[0].mig_enabled) == (0, "", False)
    assert node.gpus[0].healthy


def test_a_gpu_the_driver_cannot_open_is_unhealthy(ib: Path) -> None:
    gpus = standard_gpus()
    gpus[1].lost = True
    backend = NvmlBackend("n", infiniband_path=ib, nvml=FakeNvml(gpus))
    [node] = backend.discover()
    assert [(g.index, g.healthy) for g in node.gpus] == [(0, True), (1, False), (2, True)]
    assert node.gpus[1].model == "unknown"
    assert "cannot open" in backend.details()[1].problem


def test_pending_uncorrectable_ecc_or_failed_remap_marks_unhealthy(ib: Path) -> None:
    gpus = standard_gpus()
    gpus[0].ecc = 3
    gpus[1].remap_failed = True
    [node] = NvmlBackend("n", infiniband_path=ib, nvml=FakeNvml(gpus)).discover()
    assert [g.healthy for g in node.gpus] == [False, False, True]


def test_nvswitch_joins_all_gpus_into_one_domain(ib: Path) -> None:
    switches = ["00000000:c1:00.0", "00000000:c2:00.0"]
    gpus = [FakeGpu(i, f"00000000:{0x10 * (i + 1):02x}:00.0",
                    nvlinks={link: switches[link % 2] for link in range(4)}) for i in range(4)]
    gpus.append(FakeGpu(4, "00000000:a0:00.0", nvlinks={}))  # NVLink-capable, no active link
    [node] = NvmlBackend("n", infiniband_path=ib, nvml=FakeNvml(gpus)).discover()
    assert [g.nvlink_group for g in node.gpus] == [0, 0, 0, 0, -1]


def test_p2p_status_when_link_far_ends_are_unknown(ib: Path) -> None:
    gpus = [FakeGpu(i, f"00000000:{0x10 * (i + 1):02x}:00.0", nvlinks={0: "?"}, remote_known=False)
            for i in range(4)]
    gpus[0].p2p_nvlink, gpus[1].p2p_nvlink = {1}, {0}
    gpus[2].p2p_nvlink, gpus[3].p2p_nvlink = {3}, {2}
    [node] = NvmlBackend("n", infiniband_path=ib, nvml=FakeNvml(gpus)).discover()
    assert [g.nvlink_group for g in node.gpus] == [0, 0, 1, 1]


def test_missing_infiniband_directory_means_no_rdma(nvml: FakeNvml, tmp_path: Path) -> None:
    [node] = NvmlBackend("n", infiniband_path=tmp_path / "absent", nvml=nvml).discover()
    assert node.rdma_nics == 0


# --- session --------------------------------------------------------------------------------------------


def test_nvml_stays_initialised_until_close(backend: NvmlBackend, nvml: FakeNvml) -> None:
    backend.discover()
    backend.sample()
    backend.poll_health(0)
    backend.poll_health(0)
    assert (nvml.inits, nvml.shutdowns, nvml.sets_created) == (1, 0, 1)
    backend.close()
    assert (nvml.shutdowns, nvml.sets_freed) == (1, 1)
    backend.close()  # idempotent
    assert nvml.shutdowns == 1
    backend.discover()  # a new session
    assert (nvml.inits, nvml.sets_created) == (2, 2)


def test_pynvml_is_imported_from_sys_modules(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml, ib: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    [node] = NvmlBackend("n", infiniband_path=ib).discover()
    assert len(node.gpus) == 3


def test_unavailable_nvml_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(NvmlUnavailable, match="not installed"):
        NvmlBackend("n").discover()

    def no_driver() -> None:
        raise NVMLError_NotFound()

    nvml.nvmlInit = no_driver  # type: ignore[method-assign]
    with pytest.raises(NvmlUnavailable, match="could not start"):
        NvmlBackend("n", nvml=nvml).poll_health(0)


def test_sample_reads_load_and_leaves_unknown_as_nan(backend: NvmlBackend, nvml: FakeNvml) -> None:
    nvml.gpus[0].util, nvml.gpus[0].used = 75, 20480 * MIB
    readings = backend.sample()
    assert (readings[0].node, readings[0].index, readings[0].model) == ("gpu-node-1", 0, "A100")
    assert (readings[0].utilization, readings[0].memory_used) == (0.75, 0.25)
    assert math.isnan(readings[2].utilization)  # MIG-enabled: no utilisation
    assert readings[2].memory_used == 0.0


# --- health ---------------------------------------------------------------------------------------------


def test_poll_reports_xid_ecc_and_throttling(backend: NvmlBackend, nvml: FakeNvml) -> None:
    backend.discover()
    assert nvml.registered == [0, 1]  # GPU 2 does not support XID events
    nvml.queue_xid(1, 79)
    nvml.queue_xid(0, 13)
    nvml.queue_xid(0, 0, event_type=0x1)  # not an XID: ignored
    nvml.gpus[1].reasons = 0x40 | 0x08  # hw thermal slowdown (+ the generic hw slowdown bit)
    nvml.gpus[0].reasons = 0x04  # power cap
    first = backend.poll_health(500)
    assert nvml.waits == [500, 0, 0, 0]  # waited once, then drained without waiting
    assert first == [
        HealthObservation("gpu-node-1", 1, "xid", 79, "XID 79"),
        HealthObservation("gpu-node-1", 0, "xid", 13, "XID 13"),
        HealthObservation("gpu-node-1", 0, "power", 1, "sw_power_cap"),
        HealthObservation("gpu-node-1", 1, "thermal", 1, "hw_thermal_slowdown"),
    ]
    assert [is_fatal(o) for o in first] == [True, False, False, False]

    nvml.gpus[0].ecc = 2
    nvml.gpus[0].reasons = nvml.gpus[1].reasons = 0
    second = backend.poll_health(0)
    assert second == [HealthObservation("gpu-node-1", 0, "ecc", 2, "uncorrectable volatile ECC errors 0 -> 2")]
    assert is_fatal(second[0])
    assert backend.poll_health(0) == []  # the same count again: nothing new

    [node] = backend.discover()
    assert [g.healthy for g in node.gpus] == [False, False, True]  # ECC on 0, XID 79 on 1
    assert backend.details()[1].problem == "XID 79"


def test_xid_of_a_mig_instance_names_it(backend: NvmlBackend, nvml: FakeNvml) -> None:
    backend.discover()
    nvml.queue_xid(0, 31, gi=3)
    [obs] = backend.poll_health(0)
    assert obs.detail == "XID 31 on MIG GPU instance 3"


def test_a_failing_wait_keeps_the_polling_pace(backend: NvmlBackend, nvml: FakeNvml) -> None:
    backend.discover()
    nvml.queued.append(NVMLError_GpuIsLost())
    nvml.gpus[0].reasons = 0x80
    started = time.monotonic()
    assert backend.poll_health(50) == [HealthObservation("gpu-node-1", 0, "power", 1, "hw_power_brake_slowdown")]
    assert time.monotonic() - started >= 0.04  # not a busy loop for an agent calling it again at once


def test_without_event_support_poll_still_reads_counters(ib: Path) -> None:
    nvml = FakeNvml(standard_gpus(), events=False, event_reasons=False)
    nvml.gpus[0].reasons = 0x20
    backend = NvmlBackend("n", infiniband_path=ib, nvml=nvml)
    assert backend.poll_health(5) == [HealthObservation("n", 0, "thermal", 1, "sw_thermal_slowdown")]
    assert nvml.waits == []
    backend.close()
    assert nvml.sets_freed == 0


def test_is_fatal() -> None:
    assert sorted(FATAL_XIDS) == [48, 63, 64, 74, 79, 94, 95]
    assert all(is_fatal(HealthObservation("n", 0, "xid", x)) for x in FATAL_XIDS)
    assert not is_fatal(HealthObservation("n", 0, "xid", 13))
    assert is_fatal(HealthObservation("n", 0, "ecc", 1))
    assert not is_fatal(HealthObservation("n", 0, "thermal", 1))
    assert not is_fatal(HealthObservation("n", 0, "power", 1))
    with pytest.raises(ValueError):
        HealthObservation("n", 0, "fire", 1)


# --- helpers, factory, probe ----------------------------------------------------------------------------


def test_mig_profile_and_pci_key_parsing() -> None:
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me") == "1g.10gb+me"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb") == "1c.3g.20gb"
    assert mig_profile("NVIDIA A100-SXM4-40GB") == ""
    assert pci_key(SimpleNamespace(busId=b"00000000:0F:00.0")) == pci_key(SimpleNamespace(busId="0000:0f:00.0"))
    assert pci_key(SimpleNamespace(busId=b"", busIdLegacy=b"0000:07:00.1")) == (0, 7, 0, 1)
    assert pci_key(SimpleNamespace(busId=b"")) is None


def test_make_agent_backend(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    real = make_agent_backend("nvml", None, "n1", labels={"pool": "a"})
    assert isinstance(real, NvmlBackend) and real.node_name == "n1" and real.labels == {"pool": "a"}
    sim = make_agent_backend("sim", None, "big", gpus=64)
    assert isinstance(sim, SimNodeBackend) and len(sim.discover()[0].gpus) == 64
    with pytest.raises(ValueError):
        make_agent_backend("magic")


def test_probe_script_prints_json(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    nvml.queue_xid(1, 79)
    probe = runpy.run_path(str(ROOT / "scripts" / "nvml_probe.py"))
    assert probe["main"](["--node", "probe-node", "--timeout-ms", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["driver_version"] == "550.54.15"
    assert [g["nvlink_group"] for g in report["nodes"][0]["gpus"]] == [0, 0, -1]
    assert report["details"]["2"]["mig_devices"][0]["profile"] == "1g.5gb"
    assert report["sample"][2]["utilization"] is None
    assert report["poll_health"]["observations"] == [
        {"node": "probe-node", "index": 1, "kind": "xid", "code": 79, "detail": "XID 79"}]
    assert nvml.shutdowns == 1


def test_probe_script_exits_clearly_without_nvml(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = runpy.run_path(str(ROOT / "scripts" / "nvml_probe.py"))
    assert probe["main"]([]) == 2
    assert "NVML unavailable" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "model"), [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
    ("Tesla V100-SXM2-32GB", "V100"), ("Tesla T4", "T4"), ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("NVIDIA L40S", "L40S"), ("", "unknown"),
])
def test_driver_names_become_the_model_names_jobs_ask_for(name: str, model: str) -> None:
    assert short_model(name) == model
