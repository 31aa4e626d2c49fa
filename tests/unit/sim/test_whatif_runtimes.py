"""What-if over a recorded log whose jobs declare no runtime: each runs as long as the log shows it ran (never
the executor's "until stopped", which a replay would stretch to its horizon), and the result says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts import (
    RUNTIME_LIMIT,
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobSpec,
    JobStarted,
    NodeRegistered,
    QueuePolicyChanged,
    SubmitJob,
)
from contracts.codec import decode
from libs.cli.main import main
from libs.sim.executor import SIM_RUNTIME_S
from libs.sim.log_runtimes import with_log_runtimes
from libs.sim.observed import observed_runs
from libs.sim.pipeline import SCRIPT, VirtualWorld, world_inputs
from libs.sim.whatif import parse_change, what_if
from tests.unit.builders import node, queue

GOLDEN = Path(__file__).parents[2] / "golden" / "demo-log.jsonl"
T0 = 1_000_000.0
ENDS_AT = 600.0  # job "a" ends this long after it started, though it never said so
LOG_END = 900.0  # the log is cut here, with job "b" still running and job "c" still waiting


def submit(job_id: str, at: float, gpus: int = 1, **fields: Any) -> SubmitJob:
    spec = JobSpec(team="ml", queue="ml-train", gpus=gpus, **fields)
    return SubmitJob(id=f"submit-{job_id}", ts=T0 + at, source="api", job_id=job_id, spec=spec)


def recorded_log() -> list[EventBase]:
    """A history as the platform records it: three jobs that declare no runtime on a queue of 2 GPUs; "a" ends
    after ENDS_AT (its process exited), "b" still runs and "c" (2 GPUs) still waits for quota when the log is
    cut."""
    world = VirtualWorld(tick_s=5.0)
    world.feed([NodeRegistered(id="n1", ts=T0, source="node-telemetry", node=node("n1", gpus=8)),
                QueuePolicyChanged(id="q", ts=T0, source="operator", version=1, queue=queue(nominal_gpus=2)),
                submit("a", 1.0), submit("b", 2.0), submit("c", 3.0, gpus=2),
                JobFinished(id="a-exits", ts=T0 + 1.0 + ENDS_AT, source=SCRIPT, job_id="a")])
    world.begin()
    world.advance(T0 + LOG_END)
    return [e for _, e in world.log]


@pytest.fixture(scope="module")
def result() -> dict[str, object]:
    log = recorded_log()
    return what_if(world_inputs(enumerate(log)), [parse_change("queue.ml-train.nominal=4")], recorded=log)


def test_a_job_that_declares_no_runtime_is_charged_what_the_log_shows_it_ran(result: dict) -> None:
    before = result["teams"]["ml"]["before"]
    ran_s = ENDS_AT + (LOG_END - 2.0)  # "a" to its end, "b" to the log's end; "c" never ran
    assert before["gpu_hours"] == pytest.approx(ran_s / 3600, abs=0.002)
    assert result["makespan_s"]["before"] == pytest.approx(LOG_END, abs=10.0)  # not 30 days


def test_a_job_that_never_ran_in_the_log_stops_at_its_end_when_the_change_lets_it_start(result: dict) -> None:
    before, after = result["teams"]["ml"]["before"], result["teams"]["ml"]["after"]
    assert (before["started"], after["started"]) == (2, 3)
    assert after["gpu_hours"] - before["gpu_hours"] == pytest.approx(2 * (LOG_END - 3.0) / 3600, abs=0.002)
    assert result["makespan_s"]["after"] == pytest.approx(LOG_END, abs=10.0)


def test_the_result_says_how_the_jobs_without_a_runtime_ran(result: dict) -> None:
    runtimes = result["runtimes"]
    assert {k: runtimes[k] for k in ("undeclared", "observed", "running_at_end", "never_started")} == {
        "undeclared": 3, "observed": 2, "running_at_end": 1, "never_started": 1}
    note = runtimes["note"]
    assert note.startswith("3 jobs declare no runtime")
    assert "each runs as long as the log shows it ran" in note and "still running at the end of the log" in note
    assert "never started in the log" in note


def test_the_cli_prints_the_treatment_under_the_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from contracts.codec import encode

    path = tmp_path / "log.jsonl"
    path.write_text("".join(f'{{"seq":{seq},"event":{encode(e).decode()}}}\n'
                            for seq, e in enumerate(recorded_log(), start=1)))
    main(["whatif", "--log", str(path), "--set", "queue.ml-train.nominal=4", "--json"])
    out, err = capsys.readouterr()
    assert json.loads(out)["runtimes"]["undeclared"] == 3
    assert "3 jobs declare no runtime" in err


def test_a_declared_or_simulated_runtime_is_left_as_it_is() -> None:
    declared, labelled = submit("d", 0.0, duration_s=60.0), submit("s", 0.0, labels={SIM_RUNTIME_S: "30.0"})
    inputs, treated = with_log_runtimes([declared, labelled], [])
    assert inputs == [declared, labelled]
    assert (treated.undeclared, treated.simulated, treated.observed, treated.never_started) == (1, 1, 0, 0)


def test_observed_work_counts_a_resumed_runs_progress_once_and_skips_late_reports() -> None:
    def at(t: float) -> dict[str, Any]:
        return {"id": f"e{t}", "ts": t, "source": "sim-executor", "job_id": "j"}

    log: list[EventBase] = [
        JobStarted(run="r1", **at(0.0)),
        JobCheckpointed(run="r1", checkpoint="c", progress_s=100.0, **at(100.0)),
        JobEvicted(run="r1", reason="preempted", progress_s=100.0, **at(101.0)),
        JobStarted(run="r2", **at(200.0)),
        JobEvicted(run="r1", reason="preempted", **at(210.0)),
        JobFinished(run="r2", **at(250.0)),
    ]
    seen = observed_runs(log, end=1000.0)["j"]
    assert (seen.work_s, seen.running_at_end, seen.at_limit) == (150.0, False, False)


def test_a_job_stopped_at_its_limit_runs_to_its_limit_again() -> None:
    limited = submit("l", 0.0, max_runtime_s=50.0)
    log: list[EventBase] = [limited, JobStarted(id="s", ts=T0 + 1, source="sim-executor", job_id="l"),
                            JobFailed(id="f", ts=T0 + 51, source="sim-executor", job_id="l", exit_code=124,
                                      reason=RUNTIME_LIMIT)]
    inputs, treated = with_log_runtimes([limited], log)
    assert inputs == [limited] and (treated.limit_only, treated.at_limit) == (1, 1)


def test_what_if_on_the_recorded_demo_log_finishes_and_reports_its_progress() -> None:
    log = [decode(line.split(b',"event":', 1)[1][:-1]) for line in GOLDEN.read_bytes().splitlines() if line]
    seen: list[tuple[str, int, float]] = []
    result = what_if(world_inputs(enumerate(log)), [parse_change("queue.demo.nominal=4")], recorded=log,
                     progress=lambda replay, events, virtual_s: seen.append((replay, events, virtual_s)))
    assert set(result["teams"]) == {"demo", "platform", "product", "research"}
    assert result["runtimes"]["undeclared"] == 0 and result["runtimes"]["note"] == ""
    assert [r for r, _, _ in seen][-1] == "after" and "before" in [r for r, _, _ in seen]


def test_an_inference_service_still_deployed_at_the_logs_end_is_deleted_there() -> None:
    from contracts import DeployService, ServiceSpec

    world = VirtualWorld(tick_s=5.0)
    world.feed([NodeRegistered(id="n1", ts=T0, source="node-telemetry", node=node("n1", gpus=8)),
                QueuePolicyChanged(id="q", ts=T0, source="operator", version=1, queue=queue(nominal_gpus=4)),
                DeployService(id="d", ts=T0 + 1, source="api", service=ServiceSpec(
                    name="chat", replica=JobSpec(team="ml", queue="ml-train", gpus=1), min_replicas=2,
                    max_replicas=2))])
    world.begin()
    world.advance(T0 + LOG_END)
    log = [e for _, e in world.log]
    result = what_if(world_inputs(enumerate(log)), [parse_change("queue.ml-train.nominal=8")], recorded=log)
    assert result["runtimes"]["services"] == 1 and "inference service" in result["runtimes"]["note"]
    assert result["makespan_s"]["before"] == pytest.approx(LOG_END, abs=10.0)  # its replicas stop there
    assert result["teams"]["ml"]["before"]["gpu_hours"] == pytest.approx(2 * (LOG_END - 1.0) / 3600, abs=0.002)
