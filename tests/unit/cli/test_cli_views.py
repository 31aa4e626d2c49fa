"""How `gpusched jobs`, `job`, `wait`, `nodes` and `queues` read: active jobs first with what was hidden, a job's GPUs
in its user's terms and where each of its runs ran, what `wait` says while it waits and when it gives up, free GPUs
by how they are shared, and quota held apart from quota reserved by unplaced jobs.

The API is replaced by fake answers on the Client's methods; no server runs."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.views import FlavorUsage, NodeView, QueueView
from libs.cli.client import Client
from libs.cli.job_views import doing, duration, job_gpus, list_order, run_fields
from libs.cli.main import main
from libs.cli.nodes import NODE_COLUMNS
from libs.cli.queues import QUEUE_COLUMNS, queue_rows
from libs.cli.tables import cells

NOW = 1_800_000_000.0


def a_job(job_id: str, state: str, **fields: Any) -> dict[str, Any]:
    spec = fields.pop("spec", {"team": "ml", "queue": "ml"})
    return {"id": job_id, "team": "ml", "queue": "ml", "state": state, "phase": state, "reason": "", "message": "",
            "placements": [], "evictions": 0, "spec": spec, **fields}


RUNNING_LATE = a_job("run-2", "running", submitted_at=NOW - 900, started_at=NOW - 100)
RUNNING_EARLY = a_job("run-1", "running", submitted_at=NOW - 50, started_at=NOW - 600)
PENDING_OLD = a_job("wait-1", "pending", submitted_at=NOW - 500, reason="queue_quota_exhausted")
PENDING_NEW = a_job("wait-2", "pending", submitted_at=NOW - 10)
DONE_OLD = a_job("done-1", "succeeded", submitted_at=NOW - 3000, finished_at=NOW - 2000)
DONE_NEW = a_job("done-2", "failed", submitted_at=NOW - 2500, finished_at=NOW - 30)
CANCELLED = a_job("gone", "cancelled", submitted_at=NOW - 4000, finished_at=NOW - 3500)
EVERY_JOB = [DONE_OLD, CANCELLED, RUNNING_LATE, PENDING_OLD, DONE_NEW, RUNNING_EARLY, PENDING_NEW]

PLACEMENT = {"replica": 0, "node": "gpu-node-017", "gpu_indices": [2, 3], "gpu_milli": 1000}
FINISHED = a_job(
    "7c1d", "succeeded", submitted_at=NOW - 4000, started_at=NOW - 1200, finished_at=NOW - 600, exit_code=0,
    spec={"team": "ml", "queue": "ml", "name": "llama-finetune", "replicas": 2, "gpus": 2, "gpu_models": ["H100"],
          "gpu_memory_mib": 40960, "duration_s": 1800.0, "max_runtime_s": 3600.0, "command": ["python", "train.py"]},
    run_count=2, runs=[
        {"run": "p1", "placed_at": NOW - 3900, "started_at": NOW - 3800, "ended_at": NOW - 3000, "outcome": "evicted",
         "reason": "preempted", "placements": [PLACEMENT, {**PLACEMENT, "replica": 1, "node": "gpu-node-018"}]},
        {"run": "p2", "placed_at": NOW - 1300, "started_at": NOW - 1200, "ended_at": NOW - 600,
         "outcome": "succeeded", "exit_code": 0, "placements": [{**PLACEMENT, "node": "gpu-node-021"},
                                                                {**PLACEMENT, "replica": 1, "node": "gpu-node-021",
                                                                 "gpu_indices": [4, 5]}]}])


@pytest.fixture(autouse=True)
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for variable in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("libs.cli.jobs.time", SimpleNamespace(time=lambda: NOW, monotonic=lambda: 0.0,
                                                               sleep=lambda s: None))


def serve_jobs(monkeypatch: pytest.MonkeyPatch, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API's list: filtered by state, oldest first, cut at the limit; the calls made, recorded."""
    calls: list[dict[str, Any]] = []

    def listed(self: Client, **filters: Any) -> list[dict[str, Any]]:
        calls.append(filters)
        state = filters.get("state")
        return [j for j in jobs if not state or j["state"] == state][:filters.get("limit", 1000)]

    monkeypatch.setattr(Client, "jobs", listed)
    return calls


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def ids(out: str) -> list[str]:
    """The first cell of each row of a table (after its title and header)."""
    return [line.split()[0] for line in out.splitlines()[2:] if line.strip()]


# --- gpusched jobs -------------------------------------------------------------------------------------------


def test_jobs_shows_the_active_ones_running_first_and_says_how_many_finished_are_hidden(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    serve_jobs(monkeypatch, EVERY_JOB)
    out = run(capsys, "jobs")
    assert out.splitlines()[0].strip() == "4 active jobs (3 finished hidden; -A shows them)"
    assert out.splitlines()[1].split() == ["ID", "NAME", "QUEUE", "STATE", "GPUS", "REASON"]
    assert ids(out) == ["run-1", "run-2", "wait-1", "wait-2"]  # longest running, then next in line


def test_jobs_all_adds_the_finished_ones_newest_first(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    serve_jobs(monkeypatch, EVERY_JOB)
    for flag in ("-A", "--all"):
        out = run(capsys, "jobs", flag)
        assert out.splitlines()[0].strip() == "7 jobs"
        assert ids(out) == ["run-1", "run-2", "wait-1", "wait-2", "done-2", "done-1", "gone"]


def test_jobs_json_is_every_job_the_filters_match_as_the_api_lists_them(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    serve_jobs(monkeypatch, EVERY_JOB)
    assert json.loads(run(capsys, "jobs", "--json")) == EVERY_JOB  # scripts see finished jobs, as before
    assert json.loads(run(capsys, "jobs", "--json", "--state", "pending")) == [PENDING_OLD, PENDING_NEW]


def test_a_state_asked_for_is_shown_whatever_it_is(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    serve_jobs(monkeypatch, EVERY_JOB)
    out = run(capsys, "jobs", "--state", "succeeded")
    assert out.splitlines()[0].strip() == "1 job" and ids(out) == ["done-1"]


def test_past_the_limit_the_active_jobs_come_from_the_per_state_lists(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Oldest first, the limit reached by finished jobs: the active ones lie past it.
    old = [a_job(f"old-{i}", "succeeded", submitted_at=NOW - 9000 + i, finished_at=NOW - 8000) for i in range(3)]
    calls = serve_jobs(monkeypatch, [*old, RUNNING_LATE, PENDING_NEW])
    out = run(capsys, "jobs", "--limit", "3")
    assert out.splitlines()[0].strip() == "2 active jobs (at least 3 finished hidden; -A shows them)"
    assert ids(out) == ["run-2", "wait-2"]
    assert [c.get("state") for c in calls] == [None, "running", "pending"]


def test_the_gpus_column_reads_whole_fraction_and_mig_requests(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [a_job("whole", "running", spec={"replicas": 2, "gpus": 4, "name": "train"}, started_at=NOW),
            a_job("frac", "running", spec={"gpu_milli": 250}, started_at=NOW + 1),
            a_job("mig", "running", spec={"mig_profile": "1g.10gb"}, started_at=NOW + 2),
            a_job("unknown", "pending", spec=None, submitted_at=NOW)]
    serve_jobs(monkeypatch, jobs)
    rows = {line.split()[0]: line.split() for line in run(capsys, "jobs").splitlines()[2:]}
    assert rows["whole"][:5] == ["whole", "train", "ml", "running", "2x4"]
    assert rows["frac"][4] == "1x250m" and rows["mig"][4] == "1x1g.10gb" and rows["unknown"][4] == "-"
    assert job_gpus(jobs[2]) == "1 x MIG 1g.10gb"  # (it showed as 1x1)


def test_the_default_jobs_table_fits_80_columns(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = a_job("3f2b6c1e-8a47-4d2e-9b1a-0c5d7e9f1a23", "pending", submitted_at=NOW, reason="insufficient_gpus",
                spec={"name": "resnet", "replicas": 2, "gpus": 4})
    serve_jobs(monkeypatch, [job])
    assert max(len(line) for line in run(capsys, "jobs").splitlines()) <= 80


def test_the_order_breaks_ties_by_id() -> None:
    twins = [a_job("b", "pending", submitted_at=NOW), a_job("a", "pending", submitted_at=NOW)]
    assert [j["id"] for j in sorted(twins, key=list_order)] == ["a", "b"]


# --- gpusched job ID -------------------------------------------------------------------------------------------


def fields_of(out: str) -> dict[str, str]:
    """FIELD -> VALUE, a value wrapped onto more lines joined again."""
    fields: dict[str, str] = {}
    last = ""
    for line in out.splitlines()[2:]:
        if line[:1].strip():
            last, _, value = line.partition("  ")
            fields[last] = value.strip()
        elif last:
            fields[last] += " " + line.strip()
    return fields


def test_a_job_shows_what_it_asks_for_and_where_each_run_ran(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(Client, "job", lambda self, job_id: FINISHED)
    fields = fields_of(run(capsys, "job", "7c1d"))
    assert list(fields)[:2] == ["id", "name"] and fields["name"] == "llama-finetune"
    assert fields["gpus"] == "2 x 2 whole GPUs" and fields["models"] == "H100"
    assert fields["gpu_memory"] == "40 GiB per replica" and fields["command"] == "python train.py"
    assert fields["runtime"] == "estimate 30m00s, limit 1h00m"
    assert fields["run 1"] == ("gpu-node-017 GPUs 2,3 + gpu-node-018 GPUs 2,3; started 2027-01-15T06:56:40+00:00, "
                               "ran 13m20s; evicted: preempted")
    assert fields["run 2"].startswith("gpu-node-021 GPUs 2,3,4,5; started ") and fields["run 2"].endswith(
        "ran 10m00s; succeeded")
    assert "replica" not in " ".join(fields)


def test_runs_say_how_many_there_were_when_the_view_kept_only_the_last() -> None:
    job = {**FINISHED, "run_count": 12}
    fields = run_fields(job, NOW)
    assert fields[0] == ("runs", "12 in all; the last 2 follow")
    assert [name for name, _ in fields[1:]] == ["run 11", "run 12"]


def test_a_view_without_runs_still_shows_its_placement() -> None:
    job = {**FINISHED, "placements": [{**PLACEMENT, "gpu_milli": 250, "gpu_indices": [3]}]}
    del job["runs"]
    assert run_fields(job, NOW) == [("replica 0", "gpu-node-017 GPUs [3] (250m)")]


def test_fractions_and_mig_instances_say_their_share_and_a_run_not_started_says_so() -> None:
    job = {"runs": [{"run": "p", "placed_at": NOW - 5, "placements": [
        {"replica": 0, "node": "m", "gpu_indices": [0], "gpu_milli": 428, "mig_slices": 3}]}], "run_count": 1}
    ((_, text),) = run_fields(job, NOW)
    assert text == "m GPU 0 (MIG, 3 slices); placed 2027-01-15T08:00:00+00:00, not started yet".replace(
        "08:00:00", "07:59:55")


# --- gpusched wait ID ------------------------------------------------------------------------------------------


def test_what_a_running_job_is_doing_says_how_long_against_what_it_declared() -> None:
    job = a_job("j", "running", started_at=NOW - 125, spec={"duration_s": 300.0, "max_runtime_s": 600.0})
    assert doing(job, NOW) == "running for 2m05s (estimate 5m00s, limit 10m00s)"
    assert doing({**job, "spec": {}}, NOW) == "running for 2m05s (no runtime declared)"
    waiting = a_job("j", "pending", phase="admitted", reason="queue_quota_exhausted",
                    message="2 x 1 whole GPU: queue ml holds 8 of at most 8 GPUs (nominal 8); the job needs 2")
    assert doing(waiting, NOW) == ("pending, admitted: queue_quota_exhausted (2 x 1 whole GPU: queue ml holds 8 of "
                                   "at most 8 GPUs (nominal 8); the job needs 2)")


def test_wait_gives_up_saying_what_the_job_was_doing(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    job = a_job("j", "running", started_at=NOW - 3700, spec={"duration_s": 3600.0})
    monkeypatch.setattr(Client, "job", lambda self, job_id: job)
    with pytest.raises(SystemExit) as exit_:
        main(["wait", "j", "--timeout", "0"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip() == (
        "error: job j is not succeeded after 0s: it is running for 1h01m (estimate 1h00m)")


def test_durations_read_to_the_second_then_to_the_minute() -> None:
    assert [duration(s) for s in (0, 42, 425, 3 * 3600 + 180, 3 * 86400 + 4 * 3600)] == [
        "0s", "42s", "7m05s", "3h03m", "3d04h"]


# --- gpusched nodes --------------------------------------------------------------------------------------------


def node_json(view: NodeView) -> dict[str, Any]:
    import msgspec

    return msgspec.json.decode(msgspec.json.encode(view))


def test_nodes_show_free_gpus_by_sharing_mode(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    plain = NodeView(name="gpu-node-017", gpus=4, models=("A100",), healthy_gpus=4, allocated_gpus=1.25,
                     gpu_free_milli=(1000, 750, 0, 1000), gpu_modes=("whole", "split", "whole", "whole"),
                     idle_gpus=2, split_gpus=1, split_free_milli=750)
    mig = NodeView(name="gpu-node-018", gpus=2, models=("A100",), healthy_gpus=2, allocated_gpus=0.43,
                   gpu_free_milli=(572, 1000), gpu_modes=("mig", "mig"), mig_gpus=2, mig_slices=14,
                   mig_free_slices=11)
    nodes = [node_json(plain), node_json(mig)]
    monkeypatch.setattr(Client, "nodes", lambda self: nodes)
    out = run(capsys, "nodes")
    assert out.splitlines()[1].split() == ["NAME", "STATUS", "MODELS", "DEVICES", "HEALTHY", "IDLE",
                                           "SPLIT-FREE", "MIG-FREE"]
    assert [line.split() for line in out.splitlines()[2:]] == [
        ["gpu-node-017", "ready", "A100", "4", "4", "2", "0.75/1", "-"],
        ["gpu-node-018", "ready", "A100", "2", "2", "0", "-", "11/14"]]
    assert cells(NODE_COLUMNS, nodes, wide=True)[1][-4:] == ["2 mig", "1.572", "yes", "-"]


def test_nodes_from_an_api_without_the_modes_show_no_figures() -> None:
    old = {"name": "n", "gpus": 2, "models": ["A100"], "healthy_gpus": 2, "gpu_free_milli": [1000, 1000]}
    assert cells(NODE_COLUMNS, [old]) == [["n", "ready", "A100", "2", "2", "-", "-", "-"]]
    npu = {"name": "a", "gpus": 8, "models": ["Ascend910"], "kinds": ["npu"], "healthy_gpus": 8}
    wide_cells = cells(NODE_COLUMNS, [npu], wide=True)[0]
    assert "NPU" in wide_cells and "Ascend910" in wide_cells


# --- gpusched queues -------------------------------------------------------------------------------------------


def test_queues_show_quota_held_by_placed_jobs_apart_from_quota_unplaced_jobs_reserved(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    demo = QueueView(name="demo", team="demo", nominal_gpus=8, reserved_gpus=6.0, held_gpus=4.0, unplaced_gpus=2.0,
                     pending=1, running=1, flavors=[FlavorUsage(flavor="*", nominal_gpus=8.0, in_use_gpus=6.0,
                                                                held_gpus=4.0, unplaced_gpus=2.0)])
    free = QueueView(name="free", team="free", reserved_gpus=1.5, held_gpus=1.0, unplaced_gpus=0.5)
    queues = [node_json(demo), node_json(free)]  # type: ignore[arg-type]
    monkeypatch.setattr(Client, "queues", lambda self: queues)
    out = run(capsys, "queues")
    assert out.splitlines()[1].split() == ["QUEUE", "MODEL", "NOMINAL", "HELD", "UNPLACED", "BORROWED", "PEND", "RUN",
                                           "SHARE"]
    assert [line.split()[:5] for line in out.splitlines()[2:]] == [["demo", "*", "8", "4", "2"],
                                                                   ["free", "-", "-", "1", "0.5"]]
    wide = cells(QUEUE_COLUMNS, queue_rows(queues), wide=True)
    used = [c.header for c in QUEUE_COLUMNS].index("USED")
    assert [row[used] for row in wide] == ["6", "1.5"]  # their sum as quota counts it, with -o wide
