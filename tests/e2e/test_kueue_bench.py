"""`gpusched bench kueue-baseline` end to end on a small scenario: its own NATS and Redis, the six services,
submissions on schedule; every job completes and the log shows no quota violation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.cli.main import main

pytestmark = pytest.mark.e2e

# 2 cohorts x 2 queues of 8 GPUs (32 GPUs, 4 nodes), borrowing allowed; the large class is a 2 x 6 gang.
GENERATOR = """
cohorts:
  - className: cohort
    count: 2
    queuesSets:
    - className: cq
      count: 2
      nominalQuota: 8
      borrowingLimit: 8
      workloadsSets:
      - count: 20
        creationIntervalMs: 50
        workloads: [{className: small, runtimeMs: 200, priority: 50, request: 1}]
      - count: 6
        creationIntervalMs: 200
        workloads: [{className: medium, runtimeMs: 500, priority: 100, request: 5}]
      - count: 3
        creationIntervalMs: 500
        workloads: [{className: large, runtimeMs: 800, priority: 200, request: 12}]
"""


def test_the_bench_completes_every_job_without_a_quota_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "generator.yaml").write_text(GENERATOR)
    # A platform named in the environment must not be used: the bench needs an empty log of its own.
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    main(["bench", "kueue-baseline", "--generator", str(tmp_path / "generator.yaml"), "--data",
          str(tmp_path / "data"), "--timeout", "60", "--json"])
    result = json.loads(capsys.readouterr().out)
    expected = 4 * (20 + 6 + 3)
    assert not result["timed_out"], result
    assert (result["jobs_submitted"], result["jobs_completed"], result["jobs_rejected"]) == (expected, expected, 0)
    assert result["quota_violations"] == 0
    assert set(result["time_to_admission_s"]) == {"small", "medium", "large"}
    assert 0 < result["min_queue_usage_pct"] <= result["mean_queue_usage_pct"]
    assert result["wall_time_s"] > 1.0 and result["submit_lag_max_s"] < 5.0
    assert result["kueue"] == {}  # no README with published figures next to this generator
    # The cost of one decision through the services: the four deciders' process CPU over their logged decisions.
    assert result["decisions"] > expected and result["us_per_decision"] > 0
    assert set(result["decider_s"]) == {"admission", "quota", "placement", "preemption"}
    assert (tmp_path / "data" / "logs" / "quota.log").exists()
