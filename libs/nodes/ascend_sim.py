"""Simulated Ascend servers that answer `npu-smi` as real ones do, so the Ascend backend (libs/nodes/ascend.py)
runs unchanged without NPUs: `SimulatedNpuSmi(SERVERS["atlas800-910"])` is the `run` of an AscendBackend.

The layouts are Huawei's training servers: the Atlas 800 (model 9000) with eight Ascend 910 in two HCCS rings
of four, the Atlas 800T A2 with eight 910B3 in one HCCS mesh, and an Atlas 900 A3 SuperPoD server with eight
cards of two 910C chips, all sixteen in one mesh. Health and load are set by hand (`set_health`, `set_load`),
from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from contracts import GpuSpec
from libs.core.kernel.accelerators import HUAWEI, NPU, accelerator
from libs.nodes.npu_smi import HEALTH_LEVELS

NPU_SMI_VERSION = "24.1.rc2"
_RULE = "+===========================+===============+====================================================+"
_LEVEL_WORDS = {level: word.capitalize() for word, level in HEALTH_LEVELS.items()}


@dataclass(frozen=True, slots=True)
class AscendServer:
    chip_name: str  # what npu-smi prints: "910A", "910B3", "910_9391"
    cards: int
    chips_per_card: int
    hbm_mib: int
    ring_size: int  # chips of one HCCS group

    @property
    def chips(self) -> int:
        return self.cards * self.chips_per_card


SERVERS = {
    "atlas800-910": AscendServer(chip_name="910A", cards=8, chips_per_card=1, hbm_mib=32768, ring_size=4),
    "atlas800t-a2": AscendServer(chip_name="910B3", cards=8, chips_per_card=1, hbm_mib=65536, ring_size=8),
    "atlas900-a3": AscendServer(chip_name="910_9391", cards=8, chips_per_card=2, hbm_mib=65536, ring_size=16),
}


def npu_specs(node: str, model: str, count: int, memory_mib: int = 0) -> tuple[GpuSpec, ...]:
    """`count` NPUs of `model` as a server of that model reports them: HCCS groups of the model's size."""
    entry = accelerator(model)
    size = entry.group_size or count or 1
    return tuple(GpuSpec(index=i, model=model, memory_mib=memory_mib or entry.memory_mib, uuid=f"SIM-{node}-npu{i}",
                         kind=NPU, vendor=HUAWEI, hccs_group=i // size) for i in range(count))


class SimulatedNpuSmi:
    """`npu-smi`'s answers for one simulated server; call it with npu-smi's arguments."""

    def __init__(self, server: AscendServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._health: dict[int, tuple[int, tuple[str, ...]]] = {}  # chip -> (level, fault codes)
        self._load: dict[int, tuple[float, int]] = {}  # chip -> (AI core %, HBM used MiB)

    def set_health(self, chip: int, level: int, codes: Sequence[str] = ()) -> None:
        """The chip's health from now on: 0 OK, 1 warning, 2 alarm, 3 critical, with the fault codes listed."""
        if level not in _LEVEL_WORDS:
            raise ValueError(f"health level must be one of {sorted(_LEVEL_WORDS)}, not {level}")
        with self._lock:
            self._health[self._chip(chip)] = (level, tuple(codes))

    def set_load(self, chip: int, ai_core_percent: float, hbm_used_mib: int) -> None:
        with self._lock:
            self._load[self._chip(chip)] = (ai_core_percent, hbm_used_mib)

    def _chip(self, chip: int) -> int:
        if not 0 <= chip < self.server.chips:
            raise KeyError(f"this server has no NPU chip {chip}")
        return chip

    def __call__(self, args: Sequence[str]) -> str:
        args = list(args)
        if args == ["info"]:
            return self.info()
        if args == ["info", "-t", "topo"]:
            return self.topology()
        if args[:3] == ["info", "-t", "health"] and "-i" in args:
            card = int(args[args.index("-i") + 1])
            chip = int(args[args.index("-c") + 1]) if "-c" in args else 0
            return self.health(card * self.server.chips_per_card + chip)
        raise ValueError(f"simulated npu-smi does not answer {' '.join(args)!r}")

    def info(self) -> str:
        lines = [
            "+" + "-" * 96 + "+",
            f"| npu-smi {NPU_SMI_VERSION:<24} Version: {NPU_SMI_VERSION:<53}|",
            "+---------------------------+---------------+----------------------------------------------------+",
            "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
            "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
            _RULE,
        ]
        with self._lock:
            for chip in range(self.server.chips):
                card, chip_id = divmod(chip, self.server.chips_per_card)
                level = self._health.get(chip, (0, ()))[0]
                ai_core, used = self._load.get(chip, (0.0, 0))
                bus = f"0000:{0xC1 + chip:02X}:00.0"
                lines.append(f"| {card:<5} {self.server.chip_name:<19} | {_LEVEL_WORDS[level]:<13} | "
                             f"{91.4:<11} {45:<17} {'0    / 0':<21}|")
                lines.append(f"| {chip_id:<25} | {bus:<13} | {ai_core:<11g} {'0    / 0':<17} "
                             f"{f'{used} / {self.server.hbm_mib}':<21}|")
                lines.append(_RULE)
        lines += ["+---------------------------+---------------+----------------------------------------------------+",
                  "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
                  _RULE,
                  "| No running processes found in NPU 0                                                            |"]
        return "\n".join(lines) + "\n"

    def topology(self) -> str:
        chips, ring = self.server.chips, self.server.ring_size
        head = " " * 11 + "".join(f"{f'NPU{j}':<11}" for j in range(chips)) + "CPU Affinity"
        rows = [head]
        for i in range(chips):
            cells = ["X" if i == j else "HCCS" if i // ring == j // ring else "SYS" for j in range(chips)]
            cpus = f"{(i // 4) * 24}-{(i // 4) * 24 + 23}"
            rows.append(f"{f'NPU{i}':<11}" + "".join(f"{c:<11}" for c in cells) + cpus)
        rows += ["", "Legend:", "  X    = Self", "  SYS  = Path traversing PCIe and NUMA nodes.",
                 "  HCCS = Connection traversing HCCS."]
        return "\n".join(rows) + "\n"

    def health(self, chip: int) -> str:
        with self._lock:
            level, codes = self._health.get(self._chip(chip), (0, ()))
        return (f"        Health Status                  : {_LEVEL_WORDS[level]}\n"
                f"        Error Code                     : {' '.join(codes) if codes else 'NA'}\n"
                f"        Error Information              : NA\n")
