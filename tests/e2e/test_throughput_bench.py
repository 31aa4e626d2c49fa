"""`gpusched bench throughput` at a small size: 100 jobs a second for 3 s on a 30-node cluster, a tenth through
the HTTP API, then a short search. Every job is placed, and the figures the command promises are there; no
timing is asserted (this machine's speed is not the subject)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.cli.main import main
from libs.runtime.settings import SERVICES

pytestmark = pytest.mark.e2e

MODELS = ("A100", "V100M16", "T4")


def test_a_small_run_places_every_job_and_reports_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [f"tp-{i:02d},64000,262144,8,{MODELS[i % len(MODELS)]}" for i in range(30)]
    (tmp_path / "cluster.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(rows) + "\n")
    # A platform named in the environment must not be used: the bench needs an empty log of its own.
    monkeypatch.setenv("NATS_URL", "nats://127.0.0.1:1")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.delenv("GPUSCHED_OFF_PATH_NICE", raising=False)
    main(["bench", "throughput", "--cluster", str(tmp_path / "cluster.csv"), "--rate", "100", "--duration", "3",
          "--http-share", "0.1", "--search", "--step-duration", "1", "--search-max", "150", "--data",
          str(tmp_path / "data"), "--json"])
    result = json.loads(capsys.readouterr().out)

    assert (result["nodes"], result["gpus"]) == (30, 240)
    assert (result["jobs"], result["submitted"], result["placed"], result["rejected"]) == (300, 300, 300, 0)
    assert result["drained"] and result["service_restarts"] == []
    assert result["off_path_nice"] == 10  # the platform's own default
    for key in ("p50_ms", "p99_ms", "max_ms", "placed_per_s", "submitted_per_s"):
        assert result[key] > 0, key
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert set(result["stages_ms"]) == {"admission", "quota", "placement"}
    # Submitted, submitted and admitted, reserved, placed, started, finished, released (+ a few ticks).
    assert 8.0 <= result["events_per_job"] < 8.5
    assert result["events_per_job_by_type"]["JobPlaced"] == 1.0
    assert set(result["cpu_ms_per_job"]) >= {*SERVICES, "nats-server", "redis-server", "bench"}
    assert set(result["deliveries_per_job"]) == set(SERVICES)
    assert result["deliveries_per_job"]["placement"] >= 1
    # The search starts from the main step and stops at --search-max or between a rate that held and one
    # that did not.
    search = result["search"]
    assert search[0]["rate"] == 100.0 and len(search) >= 2
    assert all(s["rate"] <= 150 for s in search)
    held = [s["rate"] for s in search if s["sustained"]]
    assert result["max_sustained_jobs_per_s"] == (max(held) if held else None)
    assert (tmp_path / "data" / "logs" / "placement.log").exists()
