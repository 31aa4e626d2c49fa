"""`gpusched sim trace`: reading traces and teams, partitioned vs shared quota through the deciders on a tiny
trace, the figures' arithmetic, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts import JobStarted, PlacementDeferred, QueuePolicyChanged, QuotaDeferred, QuotaReserved, SubmitJob
from libs.cli.main import main
from libs.sim.declare import NOISY_F
from libs.sim.executor import SIM_RUNTIME_S
from libs.sim.trace_metrics import bounded_slowdown, busy_in_window, figures, team_delays, wait_by_reason
from libs.sim.trace_model import TraceError, parse_time, read_teams, read_trace
from libs.sim.trace_outcome import JobOutcome, TraceJob
from libs.sim.trace_run import (
    CHECKPOINT_INTERVAL_S,
    LAS_THRESHOLD_GPU_HOURS,
    Setup,
    job_spec,
    needs_baseline,
    parse_setups,
    run_platform,
    world_inputs,
)
from libs.sim.trace_waits import WaitReasons

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:10:00,600.0,1,600.0,aa
2017-10-01 00:00:00,100.0,2,200.0,bb
2017-09-30 23:59:59,50.0,1,50.0,aa
2017-10-01 00:20:00,0.0,16,0.0,zz
2017-10-02 00:00:00,30.0,1,30.0,aa
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_philly_trace_in_a_window_sorted_and_teams_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "philly.csv", PHILLY)
    start, end = parse_time("2017-10-01", "s"), parse_time("2017-10-02", "e")
    trace = read_trace(path, {"aa": 1, "bb": 1}, start, end)
    assert [(j.team, j.submit_s, j.runtime_s, j.gpus) for j in trace.jobs] == [("bb", 0.0, 100.0, 2),
                                                                             ("aa", 600.0, 600.0, 1)]
    assert trace.dropped_teams == {"zz": 1}
    assert trace.length_s == 86400.0
    assert trace.rows == 5
    # Without a window: from the first submission; a zero runtime is read as one second.
    every = read_trace(path)
    assert every.jobs[0].submit_s == 0.0 and len(every.jobs) == 5
    assert min(j.runtime_s for j in every.jobs) == 1.0
    assert [j.job_id for j in read_trace(path, limit=2).jobs] == ["j000000", "j000001"]


def test_generic_trace_and_teams(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "submit,runtime,gpus,team\n100,50,4,x\n10,20,1,y\n")
    trace = read_trace(path)
    assert [(j.team, j.submit_s, j.gpus) for j in trace.jobs] == [("y", 0.0, 1), ("x", 90.0, 4)]
    helios = write(tmp_path, "vc.csv", "vc,node num\naa,64\nbb,8\ncc,1\n")
    assert read_teams(helios) == {"aa": 64, "bb": 8, "cc": 1}
    assert read_teams(helios, 0.25) == {"aa": 16, "bb": 2, "cc": 1}  # rounded up, at least one node
    assert read_teams(write(tmp_path, "t.csv", "team,nodes\nq,3\n"), 0.5) == {"q": 2}


@pytest.mark.parametrize(("name", "text", "match"), [
    ("cols.csv", "when,how_long,gpus,who\n1,2,3,x\n", "bad columns"),
    ("gpus.csv", "submit,runtime,gpus,team\n1,2,0.5,x\n", "whole number"),
    ("time.csv", "submit,runtime,gpus,team\nyesterday,2,1,x\n", "bad time"),
])
def test_bad_traces(tmp_path: Path, name: str, text: str, match: str) -> None:
    with pytest.raises(TraceError, match=match):
        read_trace(write(tmp_path, name, text))


def test_bad_windows_and_team_files(tmp_path: Path) -> None:
    path = write(tmp_path, "philly.csv", PHILLY)
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(TraceError, match="no jobs submitted in the window"):
        read_trace(path, start=parse_time("2018-01-01", ""))
    with pytest.raises(TraceError, match="no jobs of the teams"):
        read_trace(path, {"nobody": 1})
    with pytest.raises(TraceError, match="unknown format"):
        read_teams(write(tmp_path, "bad.csv", "name,gpus\na,8\n"))
    with pytest.raises(TraceError, match="bad node count"):
        read_teams(write(tmp_path, "bad2.csv", "team,nodes\na,many\n"))


def test_setups_and_baselines() -> None:
    setups = parse_setups(["shared", "srtf-shared"], ["none", "oracle"])
    assert [s.name for s in setups] == ["shared", "shared/oracle", "srtf-shared"]
    assert [s.name for s in needs_baseline(setups)] == ["partitioned", "partitioned/oracle", "srtf-partitioned",
                                                        "shared", "shared/oracle", "srtf-shared"]
    with pytest.raises(ValueError, match="unknown set-up"):
        parse_setups(["lottery"], ["none"])
    with pytest.raises(ValueError, match="unknown declaration"):
        parse_setups(["shared"], ["psychic"])


def test_specs_per_declaration() -> None:
    job = TraceJob("j1", "a", 0.0, 1000.0, 12)
    oracle, none, noisy = (job_spec(job, d, seed=1) for d in ("oracle", "none", "noisy"))
    assert (oracle.replicas, oracle.gpus) == (3, 4)  # 12 GPUs: 3 x 4, as large as divides job and node
    assert oracle.duration_s == 1000.0 and oracle.max_runtime_s is None
    assert none.duration_s is None and none.max_runtime_s is None
    assert noisy.duration_s is None and noisy.max_runtime_s is not None
    assert 1000.0 <= noisy.max_runtime_s <= 1000.0 * (1 + NOISY_F)
    assert noisy.max_runtime_s == job_spec(job, "noisy", seed=1).max_runtime_s  # seeded
    assert all(s.labels[SIM_RUNTIME_S] == "1000.0" and s.checkpoint_interval_s == CHECKPOINT_INTERVAL_S
               for s in (oracle, none, noisy))
    assert (job_spec(TraceJob("j2", "a", 0.0, 5.0, 16), "none", 1).replicas, 8) == (2, 8)


# Team a has one node and two 8-GPU jobs; team b one node and a job that comes later.
TINY = [TraceJob("a1", "a", 0.0, 1000.0, 8), TraceJob("a2", "a", 10.0, 1000.0, 8),
        TraceJob("b1", "b", 20.0, 500.0, 8), TraceJob("a3", "a", 30.0, 100.0, 16)]
TEAMS = {"a": 1, "b": 1}


def by_id(outcomes: list[JobOutcome]) -> dict[str, JobOutcome]:
    return {o.job.job_id: o for o in outcomes}


DECLARE = pytest.mark.parametrize("declare", ["none", "oracle", "noisy"])


@DECLARE
def test_partitioned_team_waits_for_its_own_quota(declare: str) -> None:
    out = by_id(run_platform(TINY, TEAMS, Setup("partitioned", "platform", "partitioned", declare)))
    assert (out["a1"].first_start_s, out["a1"].end_s) == (0.0, 1000.0)
    assert (out["a2"].first_start_s, out["a2"].end_s) == (1000.0, 2000.0)  # b's idle node is not lent
    assert (out["b1"].first_start_s, out["b1"].end_s) == (20.0, 520.0)
    assert out["a3"].rejected and out["a3"].first_start_s is None  # 16 GPUs, its quota is 8
    assert sum(o.preemptions for o in out.values()) == 0


@DECLARE
def test_shared_borrows_then_reclaims_after_the_delay(declare: str) -> None:
    out = by_id(run_platform(TINY, TEAMS, Setup("shared", "platform", "shared", declare), reclaim_after_s=600.0))
    assert out["a2"].first_start_s == 10.0  # borrows b's idle quota
    # b1 waits for the reclaim: 600 s after it queued, seen at the next 60 s tick (660), then the victim's
    # 30 s grace (it does not save on the signal): it starts at 690.
    assert out["b1"].first_start_s == 690.0 and out["b1"].end_s == 1190.0
    assert out["a2"].preemptions == 1
    assert out["a2"].lost_gpu_s == pytest.approx((690.0 - 10.0) * 8)  # no periodic checkpoint yet (30 min)
    assert not out["a3"].rejected  # the whole cluster holds 16 GPUs
    assert out["a3"].end_s is not None
    # a2 starts over (nothing saved): its whole 1000 s, not before a1 frees a's quota at 1000.
    assert out["a2"].end_s is not None and out["a2"].end_s >= 1000.0 + 1000.0
    assert not any(o.limit_stopped for o in out.values())


def outcome(job_id: str, team: str, submit: float, runtime: float, gpus: int, start: float | None,
            end: float | None, **kw: float | int | bool) -> JobOutcome:
    return JobOutcome(TraceJob(job_id, team, submit, runtime, gpus), start, end, **kw)  # type: ignore[arg-type]


def test_figures_arithmetic() -> None:
    jobs = [outcome("1", "a", 0, 100, 1, 0, 100),
            outcome("2", "a", 0, 100, 1, 50, 150),
            outcome("3", "b", 10, 5, 2, 40, 45),
            outcome("4", "b", 0, 100, 4, None, None, rejected=True),
            outcome("5", "b", 0, 50, 2, 0, 200, preemptions=2, lost_gpu_s=100.0)]
    f = figures(jobs, cluster_gpus=4, window_s=100.0)
    assert f["jobs"] == 5 and f["rejected"] == 1 and f["finished"] == 4
    assert f["offered_load"] == pytest.approx((100 + 100 + 10 + 400 + 100) / 400)
    assert f["jct_s"]["mean"] == pytest.approx((100 + 150 + 35 + 200) / 4)
    assert f["jct_s"]["median"] == pytest.approx(125.0)
    assert f["queueing_delay_s"]["mean"] == pytest.approx((0 + 50 + 30 + 0) / 4)
    # JCT / max(runtime, 10), at least 1: 1, 1.5, 35/10, 200/50.
    assert f["mean_bounded_slowdown"] == pytest.approx((1 + 1.5 + 3.5 + 4) / 4, abs=1e-3)
    assert bounded_slowdown(3.0, 2.0) == 1.0
    # Busy in [0, 100]: 100 + 50 (job 2's first half) + 10 (job 3) + (100 + 100) x 100 / 200 (job 5).
    assert busy_in_window(jobs[4], 100.0) == pytest.approx(100.0)
    assert f["gpu_utilisation"] == pytest.approx((100 + 50 + 10 + 100) / 400)
    assert f["preemptions"] == 2 and f["lost_gpu_hours"] == pytest.approx(100 / 3600, abs=0.01)
    assert team_delays(jobs) == {"a": 25.0, "b": 15.0}
    base = [outcome("1", "a", 0, 100, 1, 100, 200), outcome("3", "b", 0, 5, 1, 0, 5)]
    ratio = figures(jobs, 4, 100.0, baseline=base)["teams"]
    assert ratio["a"] == {"jobs": 2, "mean_queueing_delay_s": 25.0, "ratio_to_partitioned": 0.25, "preemptions": 0}
    assert ratio["b"]["ratio_to_partitioned"] is None  # its baseline waited 0
    assert ratio["b"]["preemptions"] == 2
    # a asked 200 GPU-s of 4 GPUs x 100 s; b 10 + 100 of 1 GPU x 100 s (its rejected job asks nothing).
    roles = figures(jobs, 4, 100.0, team_gpus={"a": 4, "b": 1})["teams"]
    assert (roles["a"]["asked_of_quota"], roles["a"]["role"]) == (0.5, "lender")
    assert (roles["b"]["asked_of_quota"], roles["b"]["role"]) == (1.1, "borrower")


def test_cli_json_on_a_tiny_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path, "jobs.csv", "submit,runtime,gpus,team\n" + "".join(
        f"{j.submit_s:g},{j.runtime_s:g},{j.gpus},{j.team}\n" for j in TINY) + "40,10,1,ghost\n")
    teams = write(tmp_path, "teams.csv", "team,nodes\na,1\nb,1\n")
    main(["sim", "trace", "--trace", str(trace), "--teams", str(teams), "--setups", "shared",
          "--declare", "oracle", "--quiet", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["jobs"] == 4 and result["dropped_jobs"] == 1 and result["cluster_gpus"] == 16
    assert list(result["setups"]) == ["partitioned/oracle", "shared/oracle"]  # its baseline runs too
    shared = result["setups"]["shared/oracle"]
    assert shared["preemptions"] == 1 and shared["rejected"] == 0
    assert result["setups"]["partitioned/oracle"]["rejected"] == 1
    assert shared["teams"]["b"]["mean_queueing_delay_s"] == 670.0
    assert shared["teams"]["a"]["ratio_to_partitioned"] is not None


@pytest.mark.parametrize("args", [
    ["--trace", "missing.csv", "--teams", "teams.csv"],
    ["--trace", "jobs.csv", "--teams", "jobs.csv"],  # not a teams file
    ["--trace", "jobs.csv", "--teams", "teams.csv", "--start", "2030-01-01"],
    ["--trace", "jobs.csv", "--teams", "teams.csv", "--setups", "lottery"],
])
def test_cli_bad_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    write(tmp_path, "jobs.csv", "submit,runtime,gpus,team\n0,10,1,a\n")
    write(tmp_path, "teams.csv", "team,nodes\na,1\n")
    args = [str(tmp_path / a) if a.endswith(".csv") else a for a in args]
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "trace", *args, "--quiet"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_textbook_setups_run_through_run_textbook() -> None:
    from libs.sim.trace_run import run_setup

    out = by_id(run_setup(Setup("fifo-partitioned", "fifo", "partitioned"), TINY, TEAMS))
    assert (out["a2"].first_start_s, out["b1"].first_start_s) == (1000.0, 20.0)
    assert out["a3"].rejected
    shared = by_id(run_setup(Setup("fifo-shared", "fifo", "shared"), TINY, TEAMS))
    assert shared["a2"].first_start_s == 10.0 and not shared["a3"].rejected


def test_cli_plot_without_matplotlib_fails_before_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import libs.sim.trace_plot as trace_plot

    monkeypatch.setattr(trace_plot, "can_plot", lambda: "--plot needs matplotlib")
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "trace", "--trace", "nowhere.csv", "--teams", "nowhere.csv", "--plot", str(tmp_path / "x.png")])
    assert exit_.value.code == 2 and "matplotlib" in capsys.readouterr().err


def test_pooled_and_las_setups() -> None:
    setups = parse_setups(["pooled", "shared-las", "pooled-las"], ["none"])
    assert [(s.name, s.pool, s.las) for s in setups] == [
        ("pooled", "pooled", False), ("shared-las", "shared", True), ("pooled-las", "pooled", True)]
    assert {s.baseline for s in setups} == {"partitioned"}
    with pytest.raises(ValueError, match="unknown set-up 'fifo-pooled'"):
        parse_setups(["fifo-pooled"], ["none"])  # the textbook's shared pool is one queue already


def test_pooled_is_one_queue_of_the_cluster_with_teams_as_users() -> None:
    inputs, rejected = world_inputs(TINY, TEAMS, Setup("pooled-las", "platform", "pooled", "none", las=True))
    queues = [e.queue for e in inputs if isinstance(e, QueuePolicyChanged)]
    assert [(q.name, q.nominal_gpus, q.cohort, q.las_threshold_gpu_hours) for q in queues] == [
        ("pool", 16, "", LAS_THRESHOLD_GPU_HOURS)]
    specs = {e.job_id: e.spec for e in inputs if isinstance(e, SubmitJob)}
    assert {(s.queue, s.team, s.user) for s in specs.values()} == {("pool", "pool", "a"), ("pool", "pool", "b")}
    assert rejected == []  # a3's 16 GPUs fit the cluster
    out = by_id(run_platform(TINY, TEAMS, Setup("pooled", "platform", "pooled", "none")))
    assert out["a2"].first_start_s == 10.0 and out["b1"].first_start_s == 1000.0  # no quota of b's to reclaim


def test_wait_split_by_the_reason_last_told() -> None:
    waits = WaitReasons({"j": 0.0, "k": 0.0})
    for e in (QuotaDeferred(id="1", ts=5.0, source="quota", job_id="j", queue="q", code="cohort_quota_exhausted",
                            message=""),
              QuotaReserved(id="2", ts=20.0, source="quota", job_id="j", queue="q", gpu_milli=1000),
              PlacementDeferred(id="3", ts=25.0, source="placement", job_id="j", code="fragmentation", message=""),
              JobStarted(id="4", ts=40.0, source="sim-executor", job_id="j"),
              QuotaDeferred(id="5", ts=50.0, source="quota", job_id="j", queue="q", code="x", message=""),
              JobStarted(id="6", ts=0.0, source="sim-executor", job_id="k")):
        waits.fold(e)
    assert waits.waited == {"j": {"admission": 5.0, "quota:cohort_quota_exhausted": 15.0, "placing": 5.0,
                                  "placement:fragmentation": 15.0}, "k": {}}
    started = [outcome("j", "a", 0.0, 10.0, 1, 40.0, 50.0, waited_for=waits.waited["j"]),
               outcome("k", "a", 0.0, 10.0, 1, 0.0, 10.0)]
    assert wait_by_reason(started) == {"quota:cohort_quota_exhausted": 7.5, "placement:fragmentation": 7.5,
                                       "admission": 2.5, "placing": 2.5}
