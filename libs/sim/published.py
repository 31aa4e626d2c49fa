"""The FGD paper's published results (../shared/data/fgd-results), read in place."""

from __future__ import annotations

import csv
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fgd-results"
POLICY_NAMES = {"05-BestFit": "best-fit", "06-FGD": "fgd", "04-GpuPacking": "gpu-packing",
                "03-GpuClustering": "gpu-clustering", "02-DotProd": "dot-product", "01-Random": "random"}


def published_unallocated(workload: str, arrived: int = 100) -> dict[str, float]:
    """Mean unallocated GPU % at `arrived` per published policy for one pod list (empty if unknown)."""
    path = RESULTS / "SUMMARY_alloc_ratio_mean_std.csv"
    if not path.exists():
        return {}
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] == workload and int(row["arrived_pct"]) == arrived:
                out[POLICY_NAMES.get(row["sc_policy"], row["sc_policy"])] = round(100 - float(row["mean"]), 2)
    return out


def published_curve(policy: str, workload: str = "openb_pod_list_default") -> dict[int, float]:
    """Mean allocation % per arrived % (0..130) for one published policy, averaged over its seeds."""
    path = RESULTS / "analysis_allo_discrete.csv"
    name = next((k for k, v in POLICY_NAMES.items() if v == policy), policy)
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] != workload or row["sc_policy"] != name:
                continue
            for k in range(131):
                value = row.get(str(k))
                if value:
                    sums[k] = sums.get(k, 0.0) + float(value)
                    counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sorted(sums)}
