"""The real backend: this machine's GPUs read through NVML (`nvidia-ml-py`, imported as pynvml).

NVML is initialised on first use and kept until `close()`: the XID event set only lives inside one NVML
session, and a node agent reads the driver every few seconds. Every query a driver, a GPU or an older
pynvml may not support degrades to "unknown" (a default value, named in `details()`) instead of failing.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts import GpuSpec, NodeSpec
from libs.nodes.health import HealthObservation, is_fatal

log = logging.getLogger(__name__)

INFINIBAND_PATH = Path("/sys/class/infiniband")
UNKNOWN_MODEL = "unknown"

# Values of the NVML C API, stable across drivers: a pynvml that lacks one of the names still works.
FEATURE_ENABLED = 1
MIG_ENABLE = 1
ERROR_TIMEOUT = 10
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
EVENT_XID_CRITICAL = 0x8
P2P_CAPS_NVLINK = 2
P2P_STATUS_OK = 0
NVLINK_MAX_LINKS = 18
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event not tied to a MIG instance
# Clock event ("throttle") reasons that mean the GPU is held back by heat or by its power budget.
THERMAL_REASONS = {0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown"}
POWER_REASONS = {0x04: "sw_power_cap", 0x80: "hw_power_brake_slowdown"}
PCIE_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
# A GPU storm must not keep one poll draining events for ever; the rest wait for the next poll.
MAX_EVENTS_PER_POLL = 256

PciKey = tuple[int, int, int, int]


class NvmlUnavailable(RuntimeError):
    pass


_VENDOR_WORDS = frozenset({"NVIDIA", "Tesla", "GeForce"})
_TWO_WORD_FAMILIES = frozenset({"RTX", "Quadro", "TITAN", "GTX"})


def short_model(name: str) -> str:
    """The model name jobs and quotas use, from the driver's: "NVIDIA A100-SXM4-80GB" -> "A100",
    "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA GeForce RTX 4090" -> "RTX4090"; the form factor and memory
    size stay out (the GPU's memory is in its spec)."""
    words = [w for w in name.split() if w not in _VENDOR_WORDS]
    if not words:
        return name.strip() or UNKNOWN_MODEL
    first = words[0].split("-")[0]
    if first in _TWO_WORD_FAMILIES and len(words) > 1:
        return first + words[1].split("-")[0]
    return first


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's load at one moment: telemetry for Prometheus, not an event of the log."""

    node: str
    index: int
    model: str
    utilization: float
    memory_used: float


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance of a MIG-enabled GPU. GpuSpec carries only `mig_enabled`; this is the rest."""

    slot: int
    uuid: str = ""
    # "1g.10gb", "3g.40gb", "1c.3g.40gb" (a compute instance inside a larger GPU instance); "" when unknown.
    profile: str = ""
    memory_mib: int = 0
    gpu_instance_id: int = -1
    compute_instance_id: int = -1


@dataclass(frozen=True, slots=True)
class GpuDetail:
    """What discovery learnt about one GPU beyond its GpuSpec (for the probe and for debugging)."""

    index: int
    pci_bus_id: str = ""
    # Other GPUs of the same NVLink domain, directly or through NVSwitches.
    nvlink_peers: tuple[int, ...] = ()
    # Other GPU -> their closest common PCIe ancestor ("single" switch, "hostbridge", "system", ...).
    pcie: dict[int, str] = field(default_factory=dict)
    mig_devices: tuple[MigDevice, ...] = ()
    # Why the GPU is reported unhealthy; "" when it is not.
    problem: str = ""
    # NVML queries this GPU's driver did not answer: their values are unknown.
    unknown: tuple[str, ...] = ()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def mig_profile(device_name: str) -> str:
    """The profile in a MIG device's name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb"."""
    found = re.search(r"(?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)?", device_name, re.IGNORECASE)
    return found.group(0) if found else ""


def pci_key(pci: Any) -> PciKey | None:
    """(domain, bus, device, function) of an NVML PCI record, None when it names nothing.

    Parsed from the bus id text, whose domain is written with 4 or 8 digits depending on the field."""
    if pci is None:
        return None
    for attr in ("busId", "busIdLegacy"):
        raw = getattr(pci, attr, b"")
        found = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-7])", _text(raw).strip().lower())
        if found:
            domain, bus, device, function = (int(part, 16) for part in found.groups())
            return domain, bus, device, function
    return None


def count_rdma_nics(path: Path = INFINIBAND_PATH) -> int:
    """RDMA devices the kernel exposes (InfiniBand HCAs and RoCE NICs alike)."""
    try:
        return sum(1 for _ in path.iterdir())
    except OSError:
        return 0


def host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


class _Joined:
    """Union-find over PCI addresses: which GPUs (and NVSwitches) NVLinks tie together."""

    def __init__(self) -> None:
        self.parent: dict[PciKey, PciKey] = {}

    def find(self, key: PciKey) -> PciKey:
        root = self.parent.setdefault(key, key)
        while root != self.parent[root]:
            root = self.parent[root]
        self.parent[key] = root
        return root

    def join(self, a: PciKey, b: PciKey) -> None:
        self.parent[self.find(a)] = self.find(b)


class NvmlBackend:
    """This machine as one node. `nvml` is the pynvml module or a stand-in (tests); default: import pynvml."""

    name = "nvml"

    def __init__(self, node_name: str | None = None, *, labels: dict[str, str] | None = None,
                 infiniband_path: str | Path = INFINIBAND_PATH, nvml: Any = None) -> None:
        self.node_name = node_name or socket.gethostname()
        self.labels = dict(labels or {})
        self.infiniband_path = Path(infiniband_path)
        self._module = nvml
        self._nvml: Any = None  # the module once nvmlInit succeeded
        self._lock = threading.RLock()
        self._events: Any = None
        self._events_tried = False
        self._ecc_seen: dict[int, int] = {}
        self._failed: dict[int, str] = {}  # GPUs a fatal observation took out of service, with why
        self._unknown: dict[int, set[str]] = {}
        self._details: dict[int, GpuDetail] = {}

    # --- NVML session -----------------------------------------------------------------------------------

    def _session(self) -> Any:
        with self._lock:
            if self._nvml is None:
                nvml = self._module if self._module is not None else _import_pynvml()
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as err:
                    raise NvmlUnavailable(f"NVML could not start (no NVIDIA driver?): {err}") from err
                self._nvml = nvml
            return self._nvml

    def close(self) -> None:
        """Free the XID event set and shut NVML down; a later call starts a new session. Call it once no
        thread is inside poll_health: the event set must not be freed under a waiting nvmlEventSetWait."""
        with self._lock:
            if self._nvml is None:
                return
            if self._events is not None:
                self._call("nvmlEventSetFree", self._events)
            self._events, self._events_tried = None, False
            self._call("nvmlShutdown")
            self._nvml = None

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: str, *args: Any, gpu: int = -1, quiet: bool = False) -> tuple[bool, Any]:
        """(True, fn(*args)), or (False, None) when this pynvml, the driver or the GPU cannot answer."""
        nvml = self._nvml
        call = getattr(nvml, fn, None)
        if call is None:
            self._note_unknown(gpu, fn, "not in this pynvml", quiet)
            return False, None
        try:
            return True, call(*args)
        except nvml.NVMLError as err:
            self._note_unknown(gpu, fn, err, quiet)
            return False, None

    def _try(self, fn: str, *args: Any, gpu: int = -1, quiet: bool = False) -> Any:
        """fn(*args), or None when unknown."""
        return self._call(fn, *args, gpu=gpu, quiet=quiet)[1]

    def _note_unknown(self, gpu: int, fn: str, why: object, quiet: bool) -> None:
        if quiet:
            return
        seen = self._unknown.setdefault(gpu, set())
        if fn not in seen:
            seen.add(fn)
            log.debug("NVML %s on GPU %d: %s (reported as unknown)", fn, gpu, why)

    def _handles(self) -> dict[int, Any]:
        """Every GPU index with its handle; None for a GPU the driver counts but cannot open (lost)."""
        nvml = self._session()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML cannot count this machine's GPUs: {err}") from err
        return {i: self._try("nvmlDeviceGetHandleByIndex", i, gpu=i) for i in range(count)}

    # --- inventory --------------------------------------------------------------------------------------

    def discover(self) -> list[NodeSpec]:
        handles = self._handles()
        self._ensure_events(handles)
        groups = self._nvlink_groups(handles)
        pcie = self._pcie_levels(handles)
        gpus, details = [], {}
        for i, handle in handles.items():
            spec, detail = self._gpu(i, handle, groups)
            gpus.append(spec)
            details[i] = detail
        self._details = {i: replace(d, pcie=dict(sorted(pcie.get(i, {}).items())),
                                    unknown=tuple(sorted(self._unknown.get(i, ()))))
                         for i, d in details.items()}
        cpus = os.cpu_count() or 1
        return [NodeSpec(name=self.node_name, gpus=tuple(gpus), cpu_milli=cpus * 1000, memory_mib=host_memory_mib(),
                         labels=dict(self.labels), rdma_nics=count_rdma_nics(self.infiniband_path))]

    def driver_version(self) -> str:
        """The NVIDIA driver's version, "" when unknown."""
        self._session()
        version = self._try("nvmlSystemGetDriverVersion")
        return _text(version) if version is not None else ""

    def details(self) -> dict[int, GpuDetail]:
        """Per GPU, what the last discover() learnt beyond the NodeSpec."""
        return dict(self._details)

    def _gpu(self, i: int, handle: Any, groups: dict[int, int]) -> tuple[GpuSpec, GpuDetail]:
        if handle is None:
            problem = "the driver cannot open it (fallen off the bus?)"
            return GpuSpec(index=i, model=UNKNOWN_MODEL, healthy=False), GpuDetail(index=i, problem=problem)
        name = self._try("nvmlDeviceGetName", handle, gpu=i)
        memory = self._try("nvmlDeviceGetMemoryInfo", handle, gpu=i)
        uuid = self._try("nvmlDeviceGetUUID", handle, gpu=i)
        pci = self._try("nvmlDeviceGetPciInfo", handle, gpu=i)
        mig = self._mig_enabled(i, handle)
        problem = self._problem(i, handle)
        spec = GpuSpec(index=i, model=short_model(_text(name)) if name is not None else UNKNOWN_MODEL,
                       memory_mib=int(memory.total) >> 20 if memory is not None else 0,
                       uuid=_text(uuid) if uuid is not None else "", healthy=not problem,
                       nvlink_group=groups.get(i, -1), mig_enabled=mig)
        peers = tuple(j for j, g in sorted(groups.items()) if g == spec.nvlink_group and j != i)
        detail = GpuDetail(index=i, pci_bus_id=_text(pci.busId) if pci is not None else "", nvlink_peers=peers,
                           mig_devices=self._mig_devices(i, handle) if mig else (), problem=problem)
        return spec, detail

    def _mig_enabled(self, i: int, handle: Any) -> bool:
        mode = self._try("nvmlDeviceGetMigMode", handle, gpu=i)  # [current, pending]
        return mode is not None and int(mode[0]) == MIG_ENABLE

    def _mig_devices(self, i: int, handle: Any) -> tuple[MigDevice, ...]:
        slots = self._try("nvmlDeviceGetMaxMigDeviceCount", handle, gpu=i) or 0
        out = []
        for slot in range(int(slots)):
            # NotFound is how NVML says "this slot holds no instance": not an unknown.
            mig = self._try("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, gpu=i, quiet=True)
            if mig is not None:
                out.append(self._mig_device(i, slot, mig))
        return tuple(out)

    def _mig_device(self, i: int, slot: int, mig: Any) -> MigDevice:
        name = self._try("nvmlDeviceGetName", mig, gpu=i)
        uuid = self._try("nvmlDeviceGetUUID", mig, gpu=i)
        memory = self._try("nvmlDeviceGetMemoryInfo", mig, gpu=i)
        gi = self._try("nvmlDeviceGetGpuInstanceId", mig, gpu=i)
        ci = self._try("nvmlDeviceGetComputeInstanceId", mig, gpu=i)
        return MigDevice(slot=slot, uuid=_text(uuid) if uuid is not None else "",
                         profile=mig_profile(_text(name)) if name is not None else "",
                         memory_mib=int(memory.total) >> 20 if memory is not None else 0,
                         gpu_instance_id=int(gi) if gi is not None else -1,
                         compute_instance_id=int(ci) if ci is not None else -1)

    def _problem(self, i: int, handle: Any) -> str:
        """Why the GPU must not take work; "". What the driver cannot tell counts as healthy, or a driver
        without ECC or row-remapping reports would take every GPU out of service."""
        if i in self._failed:
            return self._failed[i]
        ecc = self._uncorrectable_ecc(i, handle)
        if ecc:
            return f"{ecc} uncorrectable ECC error(s) since the driver loaded"
        remapped = self._try("nvmlDeviceGetRemappedRows", handle, gpu=i)  # (corr, unc, pending, failure)
        if remapped is not None and remapped[3]:
            return "row remapping failed"
        return ""

    def _uncorrectable_ecc(self, i: int, handle: Any) -> int | None:
        count = self._try("nvmlDeviceGetTotalEccErrors", handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC, gpu=i)
        return int(count) if count is not None else None

    # --- topology ---------------------------------------------------------------------------------------

    def _nvlink_groups(self, handles: dict[int, Any]) -> dict[int, int]:
        """NVLink group of every GPU with at least one NVLink peer (0, 1, ... by lowest GPU index).

        GPUs and NVSwitches are joined by the PCI addresses at both ends of each active link: on a switched
        system (HGX) every GPU links only to switches, yet all of them share one NVLink domain."""
        bus = {i: key for i, h in handles.items()
               if h is not None and (key := pci_key(self._try("nvmlDeviceGetPciInfo", h, gpu=i))) is not None}
        joined = _Joined()
        blind = []  # GPUs with active links whose far ends the driver does not name
        for i, key in bus.items():
            joined.find(key)
            remotes, unnamed = self._nvlink_remotes(i, handles[i])
            for remote in remotes:
                joined.join(key, remote)
            if unnamed:
                blind.append(i)
        for i in blind:  # fall back to asking, pair by pair, whether peer-to-peer traffic can use NVLink
            for j in bus:
                if j != i and self._try("nvmlDeviceGetP2PStatus", handles[i], handles[j], P2P_CAPS_NVLINK,
                                        gpu=i) == P2P_STATUS_OK:
                    joined.join(bus[i], bus[j])
        members: dict[PciKey, list[int]] = {}
        for i in sorted(bus):
            members.setdefault(joined.find(bus[i]), []).append(i)
        domains = sorted((m for m in members.values() if len(m) > 1), key=lambda m: m[0])
        return {i: group for group, ids in enumerate(domains) for i in ids}

    def _nvlink_remotes(self, i: int, handle: Any) -> tuple[list[PciKey], bool]:
        """PCI addresses at the far end of the GPU's active NVLinks, and whether some active link's was unknown."""
        links = int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))
        remotes: list[PciKey] = []
        unnamed = False
        for link in range(links):
            # Past the GPU's last link NVML answers InvalidArgument: only link 0 failing means "no NVLink".
            state = self._try("nvmlDeviceGetNvLinkState", handle, link, gpu=i, quiet=link > 0)
            if state is None and link == 0:
                break
            if state != FEATURE_ENABLED:
                continue
            remote = pci_key(self._try("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, gpu=i))
            if remote is None:
                unnamed = True
            else:
                remotes.append(remote)
        return remotes, unnamed

    def _pcie_levels(self, handles: dict[int, Any]) -> dict[int, dict[int, str]]:
        """Closest common PCIe ancestor of every pair of GPUs (known pairs only)."""
        out: dict[int, dict[int, str]] = {}
        ids = [i for i, h in handles.items() if h is not None]
        for n, i in enumerate(ids):
            for j in ids[n + 1:]:
                level = self._try("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j], gpu=i)
                if level is not None:
                    name = PCIE_LEVELS.get(int(level), str(level))
                    out.setdefault(i, {})[j] = name
                    out.setdefault(j, {})[i] = name
        return out

    # --- load -------------------------------------------------------------------------------------------

    def sample(self) -> list[GpuReading]:
        """Utilisation (busy share of the last sample period) and memory in use of every GPU, from the driver.
        NaN where the driver cannot say (utilisation of a MIG-enabled GPU, for one)."""
        out = []
        for i, handle in self._handles().items():
            if handle is None:
                continue
            name = self._try("nvmlDeviceGetName", handle, gpu=i)
            util = self._try("nvmlDeviceGetUtilizationRates", handle, gpu=i)
            memory = self._try("nvmlDeviceGetMemoryInfo", handle, gpu=i)
            used = math.nan
            if memory is not None:
                used = int(memory.used) / int(memory.total) if int(memory.total) else 0.0
            out.append(GpuReading(self.node_name, i, short_model(_text(name)) if name is not None else UNKNOWN_MODEL,
                                  util.gpu / 100.0 if util is not None else math.nan, used))
        return out

    # --- health -----------------------------------------------------------------------------------------

    def poll_health(self, timeout_ms: int = 1000) -> list[HealthObservation]:
        """Waits up to timeout_ms for XID events, then reads ECC counters and clock-event reasons.

        Blocking: an asyncio agent calls it through asyncio.to_thread. A GPU with a fatal observation stays
        unhealthy in later discover() results until the backend is made again (after a GPU reset)."""
        handles = self._handles()
        self._ensure_events(handles)
        out = self._xid_events(timeout_ms)
        for i, handle in handles.items():
            if handle is not None:
                out += self._ecc_increase(i, handle)
                out += self._throttling(i, handle)
        for obs in out:
            if is_fatal(obs) and obs.index >= 0:
                self._failed.setdefault(obs.index, obs.detail)
        return out

    def _ensure_events(self, handles: dict[int, Any]) -> None:
        """Create the XID event set once: events raised between two polls queue in it until the next wait."""
        with self._lock:
            if self._events_tried:
                return
            self._events_tried = True
            events = self._try("nvmlEventSetCreate")
            if events is None:
                return
            registered = [i for i, h in handles.items() if h is not None and self._register_xid(i, h, events)]
            if registered:
                self._events = events
            else:  # nothing to wait for: poll_health sleeps instead
                self._call("nvmlEventSetFree", events)

    def _register_xid(self, i: int, handle: Any, events: Any) -> bool:
        supported = self._try("nvmlDeviceGetSupportedEventTypes", handle, gpu=i)
        if supported is not None and not int(supported) & EVENT_XID_CRITICAL:
            return False
        ok, _ = self._call("nvmlDeviceRegisterEvents", handle, EVENT_XID_CRITICAL, events, gpu=i)
        return ok

    def _xid_events(self, timeout_ms: int) -> list[HealthObservation]:
        if self._events is None:
            time.sleep(max(timeout_ms, 0) / 1000)  # keep the caller's polling pace
            return []
        nvml = self._nvml
        wait_fn = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        out: list[HealthObservation] = []
        wait = max(timeout_ms, 0)
        started = time.monotonic()
        while len(out) < MAX_EVENTS_PER_POLL:
            try:
                data = wait_fn(self._events, wait)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) != ERROR_TIMEOUT:
                    log.warning("waiting for NVML events failed: %s", err)
                    if not out:  # a failing wait must not turn the caller's loop into a busy loop
                        time.sleep(max(0.0, wait / 1000 - (time.monotonic() - started)))
                break
            wait = 0  # drain what else is queued without waiting again
            if int(data.eventType) & EVENT_XID_CRITICAL:
                out.append(self._xid_observation(data))
        return out

    def _xid_observation(self, data: Any) -> HealthObservation:
        index = self._try("nvmlDeviceGetIndex", data.device)
        code = int(data.eventData)
        detail = f"XID {code}"
        gi, ci = int(getattr(data, "gpuInstanceId", NO_INSTANCE)), int(getattr(data, "computeInstanceId", NO_INSTANCE))
        if gi != NO_INSTANCE:
            detail += f" on MIG GPU instance {gi}" + (f" compute instance {ci}" if ci != NO_INSTANCE else "")
        return HealthObservation(self.node_name, int(index) if index is not None else -1, "xid", code, detail)

    def _ecc_increase(self, i: int, handle: Any) -> list[HealthObservation]:
        """Counted from 0: errors already there at the first poll are news to the caller too."""
        count = self._uncorrectable_ecc(i, handle)
        if count is None:
            return []
        last = self._ecc_seen.get(i, 0)
        self._ecc_seen[i] = count
        if count <= last:
            return []
        detail = f"uncorrectable volatile ECC errors {last} -> {count}"
        return [HealthObservation(self.node_name, i, "ecc", count, detail)]

    def _throttling(self, i: int, handle: Any) -> list[HealthObservation]:
        # The "event" name replaced "throttle" in newer drivers; an older driver knows only the old one.
        reasons = self._try("nvmlDeviceGetCurrentClocksEventReasons", handle, gpu=i)
        if reasons is None:
            reasons = self._try("nvmlDeviceGetCurrentClocksThrottleReasons", handle, gpu=i)
        if reasons is None:
            return []
        out = []
        for kind, bits in (("thermal", THERMAL_REASONS), ("power", POWER_REASONS)):
            active = [name for bit, name in bits.items() if int(reasons) & bit]
            if active:
                out.append(HealthObservation(self.node_name, i, kind, 1, ", ".join(active)))
        return out


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as err:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from err
    return pynvml
