"""Reading Ascend NPUs from the `npu-smi` command's text: the device table of `npu-smi info`, the interconnect
matrix of `npu-smi info -t topo` and the fault codes of `npu-smi info -t health`.

`npu-smi info` prints two table lines per chip, between `+===` rules:

    | 0     910B3               | OK            | 91.4        49                0    / 0             |
    | 0                         | 0000:C1:00.0  | 0           0    / 0          3387 / 65536         |

the first with the NPU id, its name, health, power and temperature, the second with the chip id, PCIe bus id,
AI core use (%), memory use and HBM use ("used / total" MB). A second table of processes follows; it is not
read. A card of two chips (Atlas A3) prints one pair of lines per chip; every chip is one device to schedule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.core.kernel.accelerators import MODELS
from libs.core.node_health.gpu_faults import NPU_UNHEALTHY_LEVEL

# npu-smi's health words, by DCMI's level: 0 normal, 1 minor alarm, 2 major alarm, 3 critical alarm.
HEALTH_LEVELS = {"OK": 0, "WARNING": 1, "ALARM": 2, "CRITICAL": 3}
UNKNOWN_LEVEL = 3  # a word npu-smi did not print before: trust the device no more than a critical one

_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")
_FIRST = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\S+)\s*\|")
_SECOND = re.compile(r"^\|\s*(\d+)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*\|(.*)\|\s*$")


class NpuSmiError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class NpuChip:
    """One chip as `npu-smi info` lists it: the device a job is given."""

    npu_id: int
    chip_id: int
    name: str  # as npu-smi prints it: "910B3", "910ProB", "Ascend910_9391"
    health: str
    bus_id: str
    ai_core_percent: float
    hbm_used_mib: int
    hbm_total_mib: int

    @property
    def level(self) -> int:
        return HEALTH_LEVELS.get(self.health.upper(), UNKNOWN_LEVEL)

    @property
    def healthy(self) -> bool:
        return self.level < NPU_UNHEALTHY_LEVEL


def short_npu_model(name: str) -> str:
    """The model jobs and quotas use, from npu-smi's chip name: "910A" and "910ProB" -> "Ascend910", "910B3"
    -> "Ascend910B", "Ascend910_9391" -> "Ascend910C" (the A3 generation), "310P3" -> "Ascend310P"."""
    bare = name.strip().removeprefix("Ascend")
    if re.fullmatch(r"910(A|Pro[AB]?)?", bare):
        return "Ascend910"
    if re.fullmatch(r"910B\d?", bare):
        return "Ascend910B"
    if re.fullmatch(r"910(C|_93\d*)", bare):
        return "Ascend910C"
    family = re.match(r"\d+[A-Z]?", bare)
    return "Ascend" + (family.group(0) if family else bare or "unknown")


def parse_info(text: str) -> list[NpuChip]:
    """Every chip of `npu-smi info`'s device table, in the order printed (which is the devices' order)."""
    chips: list[NpuChip] = []
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if "Process id" in line:  # the process table: nothing more about devices
            break
        first = _FIRST.match(line.strip())
        if first is None or n + 1 >= len(lines):
            continue
        second = _SECOND.match(lines[n + 1].strip())
        if second is None:
            continue
        usage = second.group(3)
        pairs = _USAGE.findall(usage)
        if not pairs:
            raise NpuSmiError(f"npu-smi info: no HBM usage in {lines[n + 1].strip()!r}")
        hbm_used, hbm_total = (int(v) for v in pairs[-1])  # HBM is the last "used / total" of the line
        ai_core = usage.split()[0] if usage.split() else "0"
        chips.append(NpuChip(npu_id=int(first.group(1)), chip_id=int(second.group(1)), name=first.group(2),
                             health=first.group(3), bus_id=second.group(2),
                             ai_core_percent=_number(ai_core), hbm_used_mib=hbm_used, hbm_total_mib=hbm_total))
    if not chips and "npu-smi" in text.lower():
        raise NpuSmiError("npu-smi info lists no NPU")
    return chips


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_topology(text: str) -> dict[int, int]:
    """HCCS group of every NPU in `npu-smi info -t topo`'s matrix, numbered 0, 1, ... by lowest NPU: NPUs
    whose cell says HCCS share a group (directly or through others). An NPU with no HCCS peer is left out."""
    header: list[int] = []
    links: dict[int, set[int]] = {}
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if not header and all(re.fullmatch(r"NPU\d+", c) for c in cells[:2]) and len(cells) >= 2:
            header = [int(c[3:]) for c in cells if re.fullmatch(r"NPU\d+", c)]
            continue
        row = re.fullmatch(r"NPU(\d+)", cells[0])
        if header and row:
            me = int(row.group(1))
            for peer, cell in zip(header, cells[1:], strict=False):
                if cell.upper().startswith("HCCS") and peer != me:
                    links.setdefault(me, set()).add(peer)
                    links.setdefault(peer, set()).add(me)
    groups: dict[int, int] = {}
    for start in sorted(links):
        if start in groups:
            continue
        group, todo = len(set(groups.values())), [start]
        while todo:
            npu = todo.pop()
            if npu not in groups:
                groups[npu] = group
                todo += sorted(links[npu] - groups.keys())
    return groups


def parse_error_codes(text: str) -> tuple[str, ...]:
    """The fault codes `npu-smi info -t health -i ID` lists ("Error Code : 80E18005 80C98008"), as printed."""
    found = re.search(r"Error Code\s*:\s*(.*)", text)
    if found is None:
        return ()
    return tuple(code for code in re.split(r"[\s,]+", found.group(1).strip()) if re.fullmatch(r"[0-9A-Fa-f]+", code))


def memory_of(model: str, reported_mib: int) -> int:
    """A chip's memory: what npu-smi reported, else the model table's figure."""
    if reported_mib > 0:
        return reported_mib
    known = MODELS.get(model)
    return known.memory_mib if known is not None else 0
