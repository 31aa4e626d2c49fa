"""The Ascend backend: this machine's NPUs read through the `npu-smi` command, behind the same calls as NVML.

`npu-smi` is run for every inventory, sample and health poll (it answers in well under a second and keeps no
session): `run` is the function that runs it, `subprocess` by default, a simulated server in tests
(libs/nodes/ascend_sim.py). A chip is one device to schedule; its index is its place in `npu-smi info`'s list,
which is the logical device id jobs see (ASCEND_VISIBLE_DEVICES).

Health: npu-smi has no event stream, so each poll reads every chip's health word and reports a change to a
worse one as a `npu` observation whose code is the new level (1 warning, 2 alarm, 3 critical), with the fault
codes `npu-smi info -t health` lists; from level 2 on the chip is out of service, as an XID's GPU is.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from contracts import GpuSpec, NodeSpec
from libs.core.kernel.accelerators import HUAWEI, NPU
from libs.nodes.health import HealthObservation, is_fatal
from libs.nodes.npu_smi import (
    NpuChip,
    NpuSmiError,
    memory_of,
    parse_error_codes,
    parse_info,
    parse_topology,
    short_npu_model,
)
from libs.nodes.nvml import GpuReading, count_rdma_nics, host_memory_mib

log = logging.getLogger(__name__)

RunNpuSmi = Callable[[Sequence[str]], str]
NPU_SMI_TIMEOUT_S = 20


class AscendUnavailable(RuntimeError):
    pass


def run_npu_smi(args: Sequence[str]) -> str:
    """`npu-smi ARGS`'s output; AscendUnavailable when the command is missing or fails."""
    binary = shutil.which("npu-smi")
    if binary is None:
        raise AscendUnavailable("npu-smi is not installed (no Ascend driver?)")
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=NPU_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise AscendUnavailable(f"npu-smi {' '.join(args)} failed: {err}") from err
    if done.returncode != 0:
        raise AscendUnavailable(f"npu-smi {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


class AscendBackend:
    """This machine as one node of Ascend NPUs."""

    name = "ascend"

    def __init__(self, node_name: str | None = None, *, labels: dict[str, str] | None = None,
                 run: RunNpuSmi = run_npu_smi) -> None:
        self.node_name = node_name or socket.gethostname()
        self.labels = dict(labels or {})
        self._run = run
        self._lock = threading.Lock()
        self._levels: dict[int, int] = {}  # chip index -> health level at the last poll
        self._failed: dict[int, str] = {}  # chips a fatal observation took out of service, with why

    def _chips(self) -> list[NpuChip]:
        try:
            return parse_info(self._run(["info"]))
        except NpuSmiError as err:
            raise AscendUnavailable(str(err)) from err

    def discover(self) -> list[NodeSpec]:
        chips = self._chips()
        groups = self._groups()
        with self._lock:
            failed = dict(self._failed)
        devices = []
        for index, chip in enumerate(chips):
            model = short_npu_model(chip.name)
            devices.append(GpuSpec(index=index, model=model, memory_mib=memory_of(model, chip.hbm_total_mib),
                                   uuid=f"{self.node_name}-npu{chip.npu_id}-chip{chip.chip_id}",
                                   healthy=chip.healthy and index not in failed, kind=NPU, vendor=HUAWEI,
                                   hccs_group=groups.get(index, -1)))
        cpus = os.cpu_count() or 1
        return [NodeSpec(name=self.node_name, gpus=tuple(devices), cpu_milli=cpus * 1000,
                         memory_mib=host_memory_mib(), labels=dict(self.labels), rdma_nics=count_rdma_nics())]

    def _groups(self) -> dict[int, int]:
        """HCCS groups by chip index; {} when the driver cannot print the matrix (no group is then assumed)."""
        try:
            return parse_topology(self._run(["info", "-t", "topo"]))
        except AscendUnavailable as err:
            log.warning("npu-smi topology unknown: %s", err)
            return {}

    def sample(self) -> list[GpuReading]:
        """AI core use and HBM in use of every chip, as shares."""
        return [GpuReading(self.node_name, index, short_npu_model(chip.name), chip.ai_core_percent / 100.0,
                           chip.hbm_used_mib / chip.hbm_total_mib if chip.hbm_total_mib else 0.0)
                for index, chip in enumerate(self._chips())]

    def poll_health(self, timeout_ms: int = 1000) -> list[HealthObservation]:
        """Chips whose health got worse since the last poll (the first poll reports every chip not OK). Sleeps
        timeout_ms first: npu-smi cannot wait for a fault, so this keeps the caller's polling pace."""
        time.sleep(max(timeout_ms, 0) / 1000)
        out = []
        for index, chip in enumerate(self._chips()):
            with self._lock:
                before = self._levels.get(index, 0)
                self._levels[index] = chip.level
            if chip.level > before:
                codes = self._error_codes(chip)
                detail = f"NPU {chip.npu_id} chip {chip.chip_id} health {chip.health}" + (
                    f", fault codes {' '.join(codes)}" if codes else "")
                out.append(HealthObservation(self.node_name, index, "npu", chip.level, detail))
        with self._lock:
            for obs in out:
                if is_fatal(obs):
                    self._failed.setdefault(obs.index, obs.detail)
        return out

    def _error_codes(self, chip: NpuChip) -> tuple[str, ...]:
        try:
            return parse_error_codes(self._run(["info", "-t", "health", "-i", str(chip.npu_id),
                                                "-c", str(chip.chip_id)]))
        except AscendUnavailable:
            return ()

    def close(self) -> None:
        """npu-smi keeps no session: nothing to free."""
