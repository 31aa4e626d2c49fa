"""`gpusched bench queue-sweep --virtual`: one run per queue count, each with its wall time, CPU, decisions and
cost of one decision, and the ratio from the fewest to the most queues against the 2x target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.cli import bench_sweep
from libs.cli.main import main

GENERATOR = """
cohorts:
  - className: cohort
    count: {cohorts}
    queuesSets:
    - className: cq
      count: {queues}
      nominalQuota: 1
      borrowingLimit: 4
      workloadsSets:
      - count: 6
        creationIntervalMs: 100
        workloads: [{{className: small, runtimeMs: 300, priority: 50, request: 1}}]
"""


def test_the_sweep_reports_each_queue_count_and_the_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for n, (cohorts, queues) in {2: (1, 2), 8: (2, 4)}.items():
        (tmp_path / f"queues-{n}.yaml").write_text(GENERATOR.format(cohorts=cohorts, queues=queues))
    monkeypatch.setattr(bench_sweep, "GENERATORS", tmp_path)
    monkeypatch.setattr(bench_sweep, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(bench_sweep, "SWEEP", (2, 8))
    main(["bench", "queue-sweep", "--virtual", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "virtual" and [r["queues"] for r in out["runs"]] == [2, 8]
    for run, jobs in zip(out["runs"], (12, 48), strict=True):
        assert run["jobs_completed"] == jobs and run["quota_violations"] == run["guarantee_violations"] == 0
        assert run["decisions"] > jobs and run["us_per_decision"] > 0 and run["cpu_s"]["quota"] >= 0
    assert out["ratio"] == round(out["runs"][1]["us_per_decision"] / out["runs"][0]["us_per_decision"], 2)
    assert out["met"] == (out["ratio"] <= 2.0)
