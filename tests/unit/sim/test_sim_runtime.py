"""How long a job really runs is the simulated world's, apart from what its user declares: `duration_s` is an
estimate the deciders believe, `max_runtime_s` a limit the executor enforces, and the `sim/runtime-s` label the
actual runtime, which no decider or view reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts import (
    RUNTIME_LIMIT,
    RUNTIME_LIMIT_EXIT_CODE,
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PreemptionDecided,
    ReplicaPlacement,
    Victim,
)
from contracts.views import JobView
from libs.core.kernel.policy import PolicyBook, declared_runtime
from libs.core.kernel.retries import RetryBook, retryable
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.sim.executor import SIM_RUNTIME_S, ExecutorBook
from libs.sim.scenario import job_outcomes, run_scenario
from libs.sim.scenario_model import parse_scenario
from libs.views.explain import expected_end

ROOT = Path(__file__).resolve().parents[3]
# Where the platform's beliefs live: none of it may know how long a job really runs.
BELIEVERS = ("libs/core", "libs/views", "libs/audit")
WORLD_ONLY = re.compile(r"SIM_RUNTIME_S|sim/runtime-s|libs\.sim\.executor")


def believer_files() -> list[Path]:
    return sorted(p for d in BELIEVERS for p in (ROOT / d).rglob("*.py"))


def test_no_decider_view_or_audit_reads_the_actual_runtime() -> None:
    files = believer_files()
    assert len(files) > 20  # the walk found the packages
    offenders = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
                 for n, line in enumerate(p.read_text().splitlines(), 1) if WORLD_ONLY.search(line)]
    assert offenders == []


def test_the_check_itself_catches_a_read_of_the_label() -> None:
    assert WORLD_ONLY.search('spec.labels.get("sim/runtime-s")')
    assert WORLD_ONLY.search("from libs.sim.executor import SIM_RUNTIME_S")
    assert not WORLD_ONLY.search("declared_runtime(spec)")


@pytest.mark.parametrize(("duration", "limit", "believed"), [
    (30.0, None, 30.0),  # the estimate
    (None, 60.0, 60.0),  # no estimate: the limit
    (30.0, 60.0, 30.0),  # the estimate, within the limit
    (90.0, 60.0, 60.0),  # an estimate past the limit: the run is stopped there
    (None, None, None),  # nothing declared
])
def test_declared_runtime(duration: float | None, limit: float | None, believed: float | None) -> None:
    spec = JobSpec(team="a", queue="a", duration_s=duration, max_runtime_s=limit,
                   labels={SIM_RUNTIME_S: "1000"})  # never read: the world's, not a declaration
    assert declared_runtime(spec) == believed


def _spec(**fields: object) -> JobSpec:
    return JobSpec(team="a", queue="a", gpus=1, **fields)  # type: ignore[arg-type]


def _run(book: ExecutorBook, spec: JobSpec, at: float = 0.0, job: str = "j",
         placed_id: str = "p1") -> list[EventBase]:
    """Submit (once) and place the job on n0's GPU 0 at `at`: the executor's reports."""
    if job not in book.durations:
        book.react(JobSubmitted(id=f"s-{job}", ts=at, source="admission", job_id=job, spec=spec), at)
    placed = JobPlaced(id=placed_id, ts=at, source="placement", job_id=job,
                       placements=(ReplicaPlacement(replica=0, node="n0", gpu_indices=(0,), gpu_milli=1000),))
    return book.react(placed, at)


def test_the_executor_runs_the_labels_runtime_while_deciders_see_the_estimate() -> None:
    spec = _spec(duration_s=30.0, labels={SIM_RUNTIME_S: "100"})
    book = ExecutorBook()
    assert [type(e) for e in _run(book, spec, at=5.0)] == [JobStarted]
    run = book.runs["j"]
    assert run.ends_at() == 105.0
    finished = book.finish(run, 105.0)
    assert isinstance(finished, JobFinished)
    assert declared_runtime(spec) == 30.0
    # In the virtual pipeline: the run takes 100 s, while placement and preemption believe it ends at 30 s.
    scenario = parse_scenario("""
queues: [{name: a, team: a}]
cluster: {nodes: [{name: n0, gpus: 1}]}
settings: {quiet_s: 200}
events:
  - {at: 0, submit: {job: j, team: a, queue: a, gpus: 1, duration_s: 30, labels: {sim/runtime-s: "100"}}}
""")
    log = [e for _, e in run_scenario(scenario).log]
    started = next(e for e in log if isinstance(e, JobStarted))
    ended = next(e for e in log if isinstance(e, JobFinished | JobFailed))
    assert isinstance(ended, JobFinished) and ended.ts - started.ts == 100.0
    placement, preemption = PlacementDecider(), PreemptionDecider()
    for event in log[:log.index(started) + 1]:  # their inputs, and placement's own decision
        for decider in (placement, preemption):
            if isinstance(event, (*decider.input_types(), JobPlaced)):
                decider.fold(event)
    assert placement.state.ends["j"] == started.ts + 30.0
    assert preemption.state.running["j"].ends_at == started.ts + 30.0


def test_without_the_label_the_executor_runs_the_declared_duration() -> None:
    book = ExecutorBook()
    _run(book, _spec(duration_s=40.0))
    assert book.runs["j"].ends_at() == 40.0


def test_a_run_is_stopped_at_its_runtime_limit_and_not_retried() -> None:
    spec = _spec(duration_s=30.0, max_runtime_s=60.0, labels={SIM_RUNTIME_S: "200"})
    book = ExecutorBook()
    _run(book, spec, at=10.0)
    run = book.runs["j"]
    assert run.ends_at() == 70.0
    failed = book.finish(run, 70.0)
    assert isinstance(failed, JobFailed)
    assert (failed.reason, failed.exit_code) == (RUNTIME_LIMIT, RUNTIME_LIMIT_EXIT_CODE)
    assert "j" not in book.runs
    # Final: not an infrastructure failure to retry, even with an exit code that would read as a kill.
    assert not retryable(spec, failed.exit_code, failed.reason)
    assert not retryable(spec, 137, RUNTIME_LIMIT)
    assert RetryBook().on_failed(failed, spec, PolicyBook()) is None


def test_a_run_within_its_limit_finishes() -> None:
    book = ExecutorBook()
    _run(book, _spec(max_runtime_s=60.0, labels={SIM_RUNTIME_S: "40"}))
    run = book.runs["j"]
    assert run.ends_at() == 40.0
    assert isinstance(book.finish(run, 40.0), JobFinished)


def test_the_limit_counts_per_run_not_the_progress_resumed_from_a_checkpoint() -> None:
    """As Slurm's time limit: each run gets the whole limit again; the work it resumes with does not count."""
    spec = _spec(max_runtime_s=60.0, checkpoint_interval_s=10.0, labels={SIM_RUNTIME_S: "100"})
    book = ExecutorBook()
    _run(book, spec)
    victim = Victim(job_id="j", queue="a", priority=500, gpu_milli=1000, reason="priority")
    stopped = book.react(PreemptionDecided(id="pre", ts=50.0, source="preemption", preemptor_id="k",
                                           victims=(victim,), code="priority"), 50.0)
    assert [e.progress_s for e in stopped if isinstance(e, JobEvicted)] == [50.0]
    _run(book, spec, at=80.0, placed_id="p2")  # resumes with 50 s done: 50 s left, within a fresh 60 s
    run = book.runs["j"]
    assert run.done_before == 50.0 and run.ends_at() == 130.0
    assert isinstance(book.finish(run, 130.0), JobFinished)


def test_a_job_with_nothing_declared_runs_until_stopped() -> None:
    spec = _spec()
    assert declared_runtime(spec) is None
    book = ExecutorBook()
    _run(book, spec)
    assert book.runs["j"].ends_at() is None  # no finish is ever due
    scenario = parse_scenario("""
queues: [{name: a, team: a}]
cluster: {nodes: [{name: n0, gpus: 1}]}
settings: {quiet_s: 600}
events:
  - {at: 0, submit: {job: j, team: a, queue: a, gpus: 1}}
""")
    result = run_scenario(scenario)
    assert not any(isinstance(e, JobFinished | JobFailed | JobEvicted) for _, e in result.log)
    assert job_outcomes(result.log)["j"].state == "running"


def test_a_job_declaring_only_a_limit_is_believed_to_run_that_long_and_stopped_there() -> None:
    spec = _spec(max_runtime_s=50.0)
    assert declared_runtime(spec) == 50.0
    book = ExecutorBook()
    _run(book, spec)
    run = book.runs["j"]
    assert run.ends_at() == 50.0
    failed = book.finish(run, 50.0)
    assert isinstance(failed, JobFailed) and failed.reason == RUNTIME_LIMIT


@pytest.mark.parametrize(("fields", "eta"), [
    ({"duration_s": 30.0, "labels": {SIM_RUNTIME_S: "100"}}, 130.0),  # the estimate, not the actual runtime
    ({"max_runtime_s": 50.0}, 150.0),  # no estimate: the limit
    ({}, None),  # nothing declared: no ETA
])
def test_the_explain_view_times_a_run_by_what_was_declared(fields: dict[str, object], eta: float | None) -> None:
    view = JobView(id="j", state="running", team="a", queue="a", spec=_spec(**fields), started_at=100.0)
    assert expected_end(view, now=110.0) == eta
