"""`gpusched bench executor` at a small size: every job of the array runs as a process and finishes, and
the figures come from the log."""

from __future__ import annotations

import pytest

from libs.bench.executor_run import ExecutorBenchOptions, run_executor_bench

pytestmark = pytest.mark.e2e


def test_a_small_job_array_runs_through_one_agent() -> None:
    result = run_executor_bench(ExecutorBenchOptions(jobs=60, gpus=8, duration_s=0.2, timeout_s=120))
    assert (result["finished"], result["failed"], result["unfinished"]) == (60, 0, 0)
    assert result["ideal_s"] == 1.5
    assert result["makespan_s"] >= 1.5 and result["jobs_per_s"] == pytest.approx(60 / result["makespan_s"], rel=0.01)
    assert set(result["cpu_s"]) >= {"agent", "placement", "quota", "nats-server"}
