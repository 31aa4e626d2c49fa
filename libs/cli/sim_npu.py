"""`gpusched sim npu-rings`: a mixed cluster of GPUs and Ascend NPUs in virtual time, NPUs placed three ways
(libs/bench/npu_rings.py): what keeping HCCS rings whole is worth, in one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from libs.bench.npu_rings import (
    HOLD_AFTER_S,
    MIXED_SIZES,
    SERVER_NPUS,
    SimJob,
    npu_servers,
    openb_gpu_jobs,
    philly_npu_jobs,
    run_policy,
    scale_arrivals,
    shuffle_ties,
)
from libs.cli.output import add_json_flag
from libs.core.cluster.device_groups import GROUP_POLICIES
from libs.nodes.sim import load_cluster_csv

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def _together(npu_jobs: list[SimJob], gpu_jobs: list[SimJob]) -> list[SimJob]:
    """The GPU pods' times (submissions and runtimes) squeezed into the NPU jobs' span, so both run at once."""
    if not gpu_jobs or not npu_jobs:
        return npu_jobs + gpu_jobs
    npu_span = max(j.submit_s for j in npu_jobs) or 1.0
    gpu_span = max(j.submit_s for j in gpu_jobs) or 1.0
    factor = npu_span / gpu_span
    squeezed = [SimJob(j.job_id, j.submit_s * factor, max(1.0, j.runtime_s * factor), j.spec) for j in gpu_jobs]
    return npu_jobs + squeezed


def cmd_npu_rings(args: argparse.Namespace) -> None:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in GROUP_POLICIES]
    if unknown:
        sys.exit(f"unknown NPU placement {', '.join(unknown)} (one of {', '.join(GROUP_POLICIES)})")
    for path in (args.trace, args.gpu_nodes, args.gpu_pods):
        if not Path(path).exists():
            sys.exit(f"{path} not found")
    npu_nodes = npu_servers(args.npu_servers)
    sizes = MIXED_SIZES if args.sizes == "mixed" else None
    npus = args.npu_servers * SERVER_NPUS
    drawn = philly_npu_jobs(args.trace, args.npu_jobs, sizes, args.seed)
    # A job of more than half the NPUs would hold the whole pool for itself, whatever the rings: left out, counted.
    kept = [j for j in drawn if j.spec.gpus * j.spec.replicas * 2 <= npus]
    npu_jobs = scale_arrivals(kept, npus, args.load)
    gpu_nodes = [n for n in load_cluster_csv(args.gpu_nodes) if n.gpus]
    jobs = shuffle_ties(_together(npu_jobs, openb_gpu_jobs(args.gpu_pods, args.gpu_jobs)), args.seed)
    console = Console(stderr=True, quiet=args.quiet)
    console.print(f"{len(gpu_nodes)} GPU nodes and {args.npu_servers} Ascend 910 servers; {len(jobs):,} jobs "
                  f"({len(npu_jobs):,} NPU, offering {args.load:.0%} of the NPUs)")
    rows = []
    for policy in policies:
        figures = run_policy(policy, [*gpu_nodes, *npu_nodes], jobs, progress=console.print,
                             hold_after_s=args.hold_after_s)
        rows.append(figures.row(args.npu_servers * SERVER_NPUS))
    result: dict[str, Any] = {"gpu_nodes": len(gpu_nodes), "npu_servers": args.npu_servers, "sizes": args.sizes,
                              "npu_jobs": len(npu_jobs), "npu_jobs_left_out_over_half_the_npus": len(drawn) - len(kept),
                              "gpu_jobs": len(jobs) - len(npu_jobs), "load": args.load,
                              "policies": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title="NPU placement on a mixed cluster (virtual time)")
    for column in rows[0]:
        table.add_column(column.replace("_", " "), justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))
    Console().print(table)


def add_parser(ssub: argparse._SubParsersAction) -> None:
    p = ssub.add_parser("npu-rings", help="a mixed cluster of openb GPU nodes and Ascend 910 servers: NPUs placed "
                                          "keeping HCCS rings whole, by Volcano's order, or ignoring rings")
    p.add_argument("--trace", default=str(SHARED / "philly" / "philly_pollux_jobs.csv"),
                   help="NPU jobs: a Philly trace (its GPU counts as NPU counts)")
    p.add_argument("--gpu-nodes", default=str(SHARED / "openb" / "openb_node_list_gpu_node.csv"))
    p.add_argument("--gpu-pods", default=str(SHARED / "openb" / "openb_pod_list_cpu050.csv"))
    p.add_argument("--npu-servers", type=int, default=16, help="Ascend 910 servers (8 NPUs each)")
    p.add_argument("--npu-jobs", type=int, default=2000, help="the trace's first N jobs")
    p.add_argument("--gpu-jobs", type=int, default=500, help="the pod list's first N GPU pods")
    p.add_argument("--load", type=float, default=0.85, help="share of the NPUs the NPU jobs offer to use")
    p.add_argument("--sizes", choices=("philly", "mixed"), default="philly",
                   help="NPUs per job: the trace's GPU counts, or drawn 45/30/15/10 %% from 1/2/4/8")
    p.add_argument("--policies", default=",".join(GROUP_POLICIES))
    p.add_argument("--seed", type=int, default=1, help="order of jobs submitted at the same second")
    p.add_argument("--hold-after-s", type=float, default=HOLD_AFTER_S,
                   help="once the oldest waiting job of a kind has waited this long, no later one passes it")
    p.add_argument("--quiet", action="store_true", help="no progress")
    add_json_flag(p)
    p.set_defaults(func=cmd_npu_rings)
