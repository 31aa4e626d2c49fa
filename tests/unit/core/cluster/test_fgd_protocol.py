"""The FGD protocol harness: inflation, the discretised curve, pod parsing, and a small run end to end
through the same Placer the service uses."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from contracts import JobSpec
from libs.sim.fgd import Pod, PodCsvError, discretise, fraction_floor, inflate, load_pods, simulate


def pod(name: str, num: int, milli: int) -> Pod:
    spec = JobSpec(team="t", queue="q", gpus=num if milli >= 1000 or num != 1 else 1,
                   gpu_milli=milli if num == 1 and milli < 1000 else 0)
    return Pod(name, spec, num * milli, milli)


def test_inflation_keeps_every_original_and_stops_by_the_per_gpu_share_quirk() -> None:
    pods = [pod("a", 1, 500), pod("b", 2, 1000), pod("c", 0, 0)]
    offered = inflate(pods, capacity_milli=10_000, tune=1.3, rng=random.Random(42))
    assert {p.name for p in offered[:3]} == {"a", "b", "c"}  # the originals first, shuffled
    total = sum(p.request_milli for p in offered)
    # The loop stops before the per-GPU share of a draw would pass 13,000: a 2-GPU draw may overshoot by 1000.
    assert 13_000 - 1000 < total <= 13_000 + 1000
    assert offered == inflate(pods, 10_000, 1.3, random.Random(42))  # seeded: the same every time


def test_a_workload_above_the_target_is_thinned_instead() -> None:
    pods = [pod(f"p{i}", 1, 1000) for i in range(20)]
    offered = inflate(pods, capacity_milli=10_000, tune=1.0, rng=random.Random(1))
    assert sum(p.request_milli for p in offered) <= 10_000 and len(offered) == 10


def test_the_curve_averages_the_pods_whose_rounded_arrived_share_matches() -> None:
    # In milli, of 100 GPUs: 0 %, 99.5 %, 100 %, 100.4 %, 130 % arrived.
    arrived = np.array([0, 995, 1000, 1004, 1300]) * 100
    used = np.array([0, 990, 990, 996, 1000]) * 100
    curve = discretise(arrived, used, total_gpus=100)
    assert curve[100] == pytest.approx((99.0 + 99.0 + 99.6) / 3, abs=0.01)  # 99.5 rounds half to even: 100
    assert curve[130] == 100.0 and curve[0] == 0.0
    assert 50 not in curve  # no pod near 50 %: no point


def test_a_bad_pod_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nok,1000,1024,1,500\nbad,x,1024,1,500\n")
    with pytest.raises(PodCsvError, match=r"pods\.csv:3"):
        load_pods(path)


def test_a_small_run_end_to_end_fills_the_cluster_and_fragmentation_awareness_helps(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{i},64000,262144,{(8, 4, 2)[i % 3]},{('A', 'B')[i % 2]}\n" for i in range(30)))
    rng = random.Random(3)
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    for i in range(400):
        kind = rng.random()
        num, milli = (1, rng.choice([250, 470, 810])) if kind < 0.5 else (rng.choice([1, 2, 4]), 1000)
        rows.append(f"p{i:03d},{rng.choice([2000, 4000, 8000])},8192,{num},{milli},{'A' if kind > 0.9 else ''}")
    pods = tmp_path / "pods.csv"
    pods.write_text("\n".join(rows) + "\n")
    policies = ("packing", "fgd", "best-fit")
    results = {policy: simulate(pods, nodes, policy, [42, 43], 1.3).as_json() for policy in policies}
    for result in results.values():
        assert 85 < result["alloc_pct"]["100"] <= 100 and result["alloc_pct"]["130"] >= result["alloc_pct"]["100"]
        # No packing of the fractional pods it placed leaves less idle than the relaxation's floor.
        floor = result["fraction_floor_pct_at_100"]
        assert 0 < floor["placed"] <= result["unallocated_pct_at_100"] + 0.01
    assert results["fgd"]["alloc_pct"]["130"] >= results["best-fit"]["alloc_pct"]["130"] - 1.0


def test_the_fraction_floor_is_what_sharing_gpus_must_leave_idle() -> None:
    assert fraction_floor({810: 10}, total_gpus=100) == pytest.approx(1.9)  # ten GPUs, 190 idle on each
    assert fraction_floor({500: 4, 250: 4}, total_gpus=100) == pytest.approx(0.0)  # pairs and quads fill GPUs
    assert fraction_floor({470: 3}, total_gpus=100) == pytest.approx(0.09, abs=1e-4)  # 1.5 GPUs for 1.41
    assert fraction_floor({}, total_gpus=100) == 0.0
