"""The GPU-time ledger and `gpusched report usage`: per-team totals equal GPUs x time summed over the log,
fractions count as fractions, windows clip runs, costs follow the per-model rates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts import JobEvicted, JobFailed, JobFinished, JobStarted
from contracts.codec import encode
from libs.cli.main import main
from libs.core.kernel.gpu_time import GpuRun
from libs.reports.rates import Rates, RatesError, load_rates
from libs.reports.usage import ReportError, UsageHistory, parse_by, usage_rows
from tests.unit.builders import EventFeed, job, node, pipeline, queue
from tests.usage_oracle import gpu_seconds_by_team

RATES = Rates(per_gpu_hour={"A100": 3.6, "T4": 0.36}, default=1.0)


def history_feed() -> EventFeed:
    """Two teams on an A100 node and a T4 node: whole GPUs, a gang, a fraction, an eviction, a retry."""
    feed = pipeline(ledger=True)
    feed.at(900.0).queues(queue("ml-train", "ml"), queue("cv-train", "cv"))
    feed.nodes(node("a", 8), node("t", 4, model="T4"))
    feed.at(1000.0).submit("big", job().gpus(4).having(project="llm", user="ann"))
    feed.submit("gang", job("cv", "cv-train").gpus(1).replicas(2).having(user="bob"))
    feed.submit("frac", job("cv", "cv-train").fraction(250).models("T4").having(priority="batch"))
    for j in ("big", "gang", "frac"):
        feed.send(JobStarted, job_id=j)
    feed.at(1100.0).send(JobFinished, job_id="gang")  # 2 GPUs x 100 s
    feed.at(1200.0).send(JobEvicted, job_id="big", reason="preempted")  # 4 x 200 s, then runs again
    feed.at(1300.0).send(JobStarted, job_id="big")
    feed.at(1400.0).send(JobFailed, job_id="frac", exit_code=137, reason="oom")  # 0.25 x 400 s
    feed.at(1500.0).send(JobFinished, job_id="big")  # 4 x 200 s
    return feed


def test_the_ledger_history_equals_gpus_times_time_summed_over_the_log() -> None:
    feed = history_feed()
    history = UsageHistory.fold(feed.log)
    rows = usage_rows(history, ("team",), RATES)
    oracle = gpu_seconds_by_team(feed.log)
    assert {r["team"]: r["gpu_seconds"] for r in rows} == pytest.approx(oracle)
    assert oracle == pytest.approx({"ml": 1600.0, "cv": 200.0 + 100.0})
    # The accounting service's live figures come from the same fold.
    assert feed.ledger is not None
    assert {t: u.gpu_seconds for t, u in feed.ledger.state.teams.items()} == pytest.approx(oracle)


def test_rows_group_by_any_keys_with_cost_from_the_model_rates() -> None:
    history = UsageHistory.fold(history_feed().log)
    rows = usage_rows(history, ("team", "model", "project"), RATES)
    assert rows == [
        {"team": "cv", "model": "A100", "project": "", "gpu_seconds": 200.0, "gpu_hours": pytest.approx(0.055556),
         "cost": 0.2},
        {"team": "cv", "model": "T4", "project": "", "gpu_seconds": 100.0, "gpu_hours": pytest.approx(0.027778),
         "cost": 0.01},
        {"team": "ml", "model": "A100", "project": "llm", "gpu_seconds": 1600.0,
         "gpu_hours": pytest.approx(0.444444), "cost": 1.6},
    ]
    by_priority = usage_rows(history, ("priority",), RATES)
    assert [(r["priority"], r["gpu_seconds"]) for r in by_priority] == [("batch", 100.0), ("training", 1800.0)]
    by_user = usage_rows(history, ("user",), RATES)
    assert [(r["user"], r["gpu_seconds"]) for r in by_user] == [("", 100.0), ("ann", 1600.0), ("bob", 200.0)]


def test_a_window_clips_runs_and_counts_a_running_job_up_to_its_end() -> None:
    feed = history_feed()
    feed.at(1600.0).submit("late", job().gpus(2))
    feed.send(JobStarted, job_id="late")
    feed.at(1700.0).send(JobFinished, job_id="other-unknown-job", exit_code=0)
    history = UsageHistory.fold(feed.log)
    window = usage_rows(history, ("team",), RATES, since=1150.0, until=1650.0)
    # ml: big 4 x (1200-1150) + 4 x (1500-1300) + late 2 x (1650-1600); cv: frac 0.25 x (1400-1150)
    assert {r["team"]: r["gpu_seconds"] for r in window} == {"ml": 200.0 + 800.0 + 100.0, "cv": 62.5}
    # With no end, the running job counts up to the log's last event (ts 1700).
    whole = usage_rows(history, ("team",), RATES)
    assert {r["team"]: r["gpu_seconds"] for r in whole} == pytest.approx(gpu_seconds_by_team(feed.log))


def test_an_unfinished_run_is_not_charged_without_an_end() -> None:
    run = GpuRun(job="j", team="t", queue="q", project="", user="", priority="p", model="A100", gpus=2.0, start=10.0)
    assert run.gpu_seconds() == 0.0 and run.gpu_seconds(until=15.0) == 10.0 and run.gpu_seconds(5.0, 8.0) == 0.0


@pytest.mark.parametrize("text", ["", "team,teams", "team,team", ",", "cost"])
def test_a_bad_grouping_is_refused_with_the_allowed_keys(text: str) -> None:
    with pytest.raises(ReportError, match="team"):
        parse_by(text)


def test_rates_files_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "rates.toml"
    good.write_text('currency = "EUR"\ndefault = 0.5\n[per_gpu_hour]\nA100 = 2.0\n')
    rates = load_rates(good)
    assert (rates.currency, rates.per_hour("A100"), rates.per_hour("T4")) == ("EUR", 2.0, 0.5)
    for text, problem in (("default = -1\n", "negative"), ("price = 1\n", "unknown field"),
                          ("default = [\n", "bad.toml")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(RatesError, match=problem):
            load_rates(bad)
    with pytest.raises(RatesError, match="not found"):
        load_rates(tmp_path / "missing.toml")


def test_the_cli_prints_json_csv_and_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(b'{"seq":%d,"event":%s}\n' % (i, encode(e)) for i, e in
                             enumerate(history_feed().log, start=1)))
    rates = tmp_path / "rates.toml"
    rates.write_text('[per_gpu_hour]\nA100 = 3.6\nT4 = 0.36\n')
    main(["report", "usage", "--log", str(log), "--by", "team,model", "--rates", str(rates), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["team"], r["model"], r["gpu_seconds"], r["cost"]) for r in rows] == [
        ("cv", "A100", 200.0, 0.2), ("cv", "T4", 100.0, 0.01), ("ml", "A100", 1600.0, 1.6)]
    main(["report", "usage", "--log", str(log), "--by", "team", "--rates", str(rates), "--format", "csv",
          "--from", "1150", "--to", "1970-01-01T00:27:30+00:00"])
    assert capsys.readouterr().out.splitlines() == [
        "team,gpu_seconds,gpu_hours,cost", "cv,62.5,0.017361,0.0063", "ml,1000.0,0.277778,1.0"]
    main(["report", "usage", "--log", str(log), "--by", "queue", "--rates", str(rates)])
    out = capsys.readouterr().out
    assert "ml-train" in out and "total" in out
    with pytest.raises(SystemExit):
        main(["report", "usage", "--log", str(log), "--from", "yesterday"])
    assert "ISO time" in capsys.readouterr().err


def test_npu_time_is_accounted_like_gpu_time_and_reported_by_vendor_and_kind() -> None:
    feed = pipeline(ledger=True)
    feed.at(900.0).queues(queue("ml-train", "ml"))
    feed.nodes(node("a", 8), node("npu", 8, model="Ascend910"))
    feed.at(1000.0).submit("gpu-job", job().gpus(2))
    feed.submit("npu-job", job().gpus(4).models("Ascend910"))
    for j in ("gpu-job", "npu-job"):
        feed.send(JobStarted, job_id=j)
    feed.at(1100.0).send(JobFinished, job_id="gpu-job")  # 2 GPUs x 100 s
    feed.at(1200.0).send(JobFinished, job_id="npu-job")  # 4 NPUs x 200 s
    rows = usage_rows(UsageHistory.fold(feed.log), ("vendor", "kind", "model"), RATES)
    assert [(r["vendor"], r["kind"], r["model"], r["gpu_seconds"]) for r in rows] == [
        ("huawei", "npu", "Ascend910", 800.0), ("nvidia", "gpu", "A100", 200.0)]
    assert rows[0]["cost"] == round(800.0 / 3600, 4)  # the default rate for a model the rates do not name
