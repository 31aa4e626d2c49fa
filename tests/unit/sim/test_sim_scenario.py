"""Scenario files: every file in tests/scenarios/ passes `gpusched sim scenario FILE --check` (those that show
a known hole of the deciders are expected to fail until it is fixed, each with the hole named); the Kueue
conformance files of tests/scenarios/kueue/ run the same way, each expecting what the Kueue test it names
expects (those where gpusched differs today are expected to fail, each with the difference named); and the
scenario machinery itself: parsing, scripted executor actions, expectations, the CLI's exit status and JSON,
and the way back from world inputs to a file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from contracts import JobEvicted, JobFailed, JobFinished, JobPlaced, QueuePolicyChanged, SubmitJob
from libs.cli.main import main
from libs.sim.scenario import job_outcomes, run_scenario, scenario_end, scenario_inputs
from libs.sim.scenario_model import ScenarioError, parse_scenario
from libs.sim.scenario_write import write_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
# Scenario files that fail today, each for a hole in the deciders (file stem -> the hole).
KNOWN_HOLES: dict[str, str] = {
    "queue-flavor-preempt-waits-for-a-reclaim-that-would-not-place-it": (
        "when_can_preempt preempt waits at a lent flavor for a reclaim that frees the quota but would not place the "
        "job, which preemption (simulating placement) never makes: the job waits for good beside its next flavor"),
    "queue-flavor-preempt-waits-where-its-reclaim-may-take-too-little": (
        "reclaim_could_serve sums the quota of every holder a reclaim may take, not what Kueue's whole-jobs rule "
        "lets it take from each borrowing queue: the job waits at a lent flavor for good beside room in the next"),
}


# Kueue conformance: each file is a case of Kueue's own scheduler or preemption tests, in gpusched's terms, expecting
# what Kueue's test expects. Not in the frozen net (libs/sim/frozen/sets.py records tests/scenarios/*.yaml only):
# these files are to change their outcome as the differences below are closed.
KUEUE = SCENARIOS / "kueue"
# The reasons gpusched decides otherwise today.
PREEMPT_FOR_BORROWING = ("when_can_preempt preempt makes a job wait only at a flavor whose lent nominal quota a "
                         "reclaim would give back; Kueue waits too where a borrowing preemption "
                         "(borrowWithinCohort) could make room")
STRICT_FIFO_HOLD = ("gpusched freezes a cohort's borrowing only for a waiting job within its queue's nominal quota; "
                    "Kueue also holds borrowing of the idle quota of a StrictFIFO queue whose head waits beyond it")
# Conformance files that fail today (file stem -> why gpusched decides otherwise).
KUEUE_DIFFERENCES: dict[str, str] = {
    "preemption-borrow-within-cohort-shared-queue": PREEMPT_FOR_BORROWING,
    "scheduler-pending-lender-blocks-borrowing": STRICT_FIFO_HOLD,
}


def scenario_files() -> list[object]:
    return [pytest.param(path, id=path.stem,
                         marks=[pytest.mark.xfail(reason=KNOWN_HOLES[path.stem], strict=True)]
                         if path.stem in KNOWN_HOLES else [])
            for path in sorted(SCENARIOS.glob("*.yaml"))]


@pytest.mark.parametrize("path", scenario_files())
def test_scenario_file_passes_its_check(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["sim", "scenario", str(path), "--check"])
    except SystemExit as exit:
        pytest.fail(f"--check exited {exit.code}: {capsys.readouterr().err.strip()}")


def test_known_holes_name_existing_files() -> None:
    assert set(KNOWN_HOLES) <= {p.stem for p in SCENARIOS.glob("*.yaml")}


def kueue_files() -> list[object]:
    return [pytest.param(path, id=f"kueue/{path.stem}",
                         marks=[pytest.mark.xfail(reason=KUEUE_DIFFERENCES[path.stem], strict=True)]
                         if path.stem in KUEUE_DIFFERENCES else [])
            for path in sorted(KUEUE.glob("*.yaml"))]


@pytest.mark.parametrize("path", kueue_files())
def test_kueue_conformance_file_expects_what_kueue_expects(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["sim", "scenario", str(path), "--check"])
    except SystemExit as exit:
        pytest.fail(f"--check exited {exit.code}: {capsys.readouterr().err.strip()}")


def test_kueue_differences_name_existing_files() -> None:
    assert set(KUEUE_DIFFERENCES) <= {p.stem for p in KUEUE.glob("*.yaml")}


@pytest.mark.parametrize("path", sorted(KUEUE.glob("*.yaml")), ids=lambda p: p.stem)
def test_kueue_file_names_the_kueue_test_it_comes_from(path: Path) -> None:
    scenario = parse_scenario(path.read_text(), str(path))
    assert scenario.name == path.stem
    assert re.search(r"Kueue: (pkg|test)/\S+_test\.go, [^\"]*\"[^\"]+\"", " ".join(scenario.description.split())), (
        f"{path.name}: its description names no Kueue test as `Kueue: <file>_test.go, [Test] \"<test case>\"`")
    assert scenario.expect.violations == [], f"{path.name}: a conformance file expects every guarantee kept"


SMALL = """
name: small
settings: {tick_s: 5, quiet_s: 60}
queues: [{name: a, team: a, nominal_gpus: 2}]
cluster: {nodes: [{name: n0, gpus: 2}]}
events:
  - {at: 0, submit: {job: long, team: a, queue: a, gpus: 1, duration_s: 1000}}
  - {at: 0, submit: {job: short, team: a, queue: a, gpus: 1, duration_s: 10}}
  - {at: 0, submit: {job: big, team: a, queue: a, gpus: 3}}
  - {at: 7, fail: {job: long, exit_code: 3}}
  - {at: 8, finish: short}
  - {at: 9, finish: short}
"""


def test_scripted_actions_end_the_running_job_only() -> None:
    run = run_scenario(parse_scenario(SMALL))
    ended = [(e.job_id, type(e).__name__, e.ts - run.scenario.settings.start) for _, e in run.log
             if isinstance(e, JobFinished | JobFailed)]
    # The second `finish: short` comes after it ended: nothing happens. Reports come from the executor.
    assert ended == [("long", "JobFailed", 7.0), ("short", "JobFinished", 8.0)]
    assert all(e.source == "sim-executor" for _, e in run.log if isinstance(e, JobFinished | JobFailed))
    outcomes = job_outcomes(run.log)
    assert (outcomes["long"].state, outcomes["short"].state) == ("failed", "succeeded")
    assert (outcomes["big"].state, outcomes["big"].code) == ("rejected", "exceeds_node_capacity")
    assert run.end == run.scenario.settings.start + 9 + 60


def test_expectations_that_do_not_hold_are_reported() -> None:
    text = SMALL + "expect:\n  jobs:\n    short: {state: failed}\n    ghost: {state: running}\n  violations: []\n"
    run = run_scenario(parse_scenario(text))
    assert run.unmet == ["job ghost: expected running, the log never mentions it",
                         "job short: expected failed, got succeeded"]
    assert not run.passed


def test_check_exits_non_zero_with_the_unmet_expectation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SMALL + "expect:\n  jobs:\n    big: {state: rejected, code: unknown_queue}\n")
    with pytest.raises(SystemExit) as exit:
        main(["sim", "scenario", str(path), "--check", "--json"])
    assert exit.value.code == 1
    out = capsys.readouterr()
    assert "job big: expected code unknown_queue, got exceeds_node_capacity" in out.err
    document = json.loads(out.out)
    assert set(document) >= {"events", "violations"}
    placed = [e["job_id"] for e in document["events"] if e["type"] == "JobPlaced"]
    assert placed == ["long", "short"]
    assert document["violations"] == []


def test_a_check_that_holds_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SMALL + "expect:\n  jobs:\n    big: {state: rejected, code: exceeds_node_capacity}\n")
    main(["sim", "scenario", str(path), "--check"])
    assert "JobPlaced" in capsys.readouterr().out


def test_a_flavor_expectation_names_where_the_job_holds_its_quota() -> None:
    text = SMALL + ("expect:\n  jobs:\n    short: {state: succeeded, flavor: ''}\n    long: {flavor: H100}\n"
                    "    big: {flavor: ''}\n")
    run = run_scenario(parse_scenario(text))
    # long failed and gave its quota back; short finished: neither holds any. A held flavor of any model is "*".
    assert run.unmet == ["job long: expected its quota in flavor H100, got none"]
    running = SMALL.replace("  - {at: 7, fail: {job: long, exit_code: 3}}\n", "")
    again = run_scenario(parse_scenario(running + "expect:\n  jobs:\n    long: {state: running, flavor: '*'}\n"))
    assert again.unmet == []


@pytest.mark.parametrize(("text", "problem"), [
    ("events: [{at: 1, cancel: j, finish: j}]", "exactly one action per event, got cancel, finish"),
    ("events: [{at: 1}]", "exactly one action per event, got none"),
    ("events: [{at: -1, cancel: j}]", "never negative"),
    ("clusterr: {}", "unknown field"),
    ("queues: [{name: a, team: a, parent: nowhere}]", "queue 'a'"),
])
def test_bad_scenarios_are_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ScenarioError, match=problem):
        scenario_inputs(parse_scenario(text))


def test_written_scenario_makes_the_same_inputs_and_run(tmp_path: Path) -> None:
    scenario = parse_scenario((SCENARIOS / "lifecycle.yaml").read_text())
    inputs = scenario_inputs(scenario)
    until = scenario_end(scenario) - scenario.settings.quiet_s
    text = write_scenario(inputs, tmp_path / "again.yaml", settings=scenario.settings, until=until,
                          expect=scenario.expect)
    again = parse_scenario((tmp_path / "again.yaml").read_text())
    assert text == (tmp_path / "again.yaml").read_text()
    assert scenario_inputs(again) == inputs
    assert scenario_end(again) == scenario_end(scenario)
    assert [e for _, e in run_scenario(again).log] == [e for _, e in run_scenario(scenario).log]


LATE = """
name: late
settings: {tick_s: 5, quiet_s: 60}
queues: [{name: a, team: a, nominal_gpus: 1}]
cluster: {nodes: [{name: n0, gpus: 1}, {name: n1, gpus: 1}]}
events:
  - {at: 0, submit: {job: j, team: a, queue: a, gpus: 1}}
  - {at: 5, evict: {job: j, reason: node_pressure}}
  - {at: 10, finish: {job: j, run: 1}}
  - {at: 11, fail: {job: j, run: 1, exit_code: 3}}
  - {at: 12, evict: {job: j, run: 2}}
  - {at: 13, finish: j}
"""


def test_a_report_may_name_the_run_it_is_about() -> None:
    scenario = parse_scenario(LATE)
    finish, fail, evict, current = (s.action()[1] for s in scenario.events[2:])
    assert (finish.job, finish.run, fail.run, fail.exit_code, evict.run, current) == ("j", 1, 1, 3, 2, "j")
    inputs = scenario_inputs(scenario)
    assert [e.run for e in inputs if isinstance(e, JobFinished | JobFailed | JobEvicted)] == ["", "#1", "#1", "#2",
                                                                                               ""]
    # Written back, each report names the same run.
    again = parse_scenario(write_scenario(inputs, settings=scenario.settings))
    assert again.events == scenario.events and scenario_inputs(again) == inputs
    # A recorded executor's report names its run by the placement's id, which no scenario can say.
    recorded = JobFinished(id="r", ts=inputs[-1].ts, source="node-agent", job_id="j", run="a-placement-id")
    with pytest.raises(ScenarioError, match="by the job's placements"):
        write_scenario([*inputs, recorded], settings=scenario.settings)


def test_a_late_report_of_an_earlier_run_changes_nothing() -> None:
    run = run_scenario(parse_scenario(LATE))
    placed = [e.id for _, e in run.log if isinstance(e, JobPlaced)]
    reports = [(type(e).__name__, e.run == placed[0], e.ts - run.scenario.settings.start) for _, e in run.log
               if isinstance(e, JobFinished | JobFailed | JobEvicted)]
    # j evicted at 5 runs again (its second run); the late finish and failure name its first run, and the
    # eviction at 12 its second (current) run, which it ends; the finish at 13 finds it on its third.
    assert len(placed) == 3
    assert reports == [("JobEvicted", True, 5.0), ("JobFinished", True, 10.0), ("JobFailed", True, 11.0),
                       ("JobEvicted", False, 12.0), ("JobFinished", False, 13.0)]
    assert job_outcomes(run.log)["j"].state == "succeeded" and run.violations == []


@pytest.mark.parametrize("text", ["events: [{at: 1, finish: {job: j, run: 0}}]",
                                  "events: [{at: 1, fail: {job: j, run: first}}]"])
def test_a_run_is_named_by_its_count_from_one(text: str) -> None:
    with pytest.raises(ScenarioError, match="run"):
        parse_scenario(text)


def test_inputs_from_elsewhere_are_written_as_timed_events() -> None:
    scenario = parse_scenario(SMALL)
    inputs = scenario_inputs(scenario)
    # A queue change later on is a timed event, not part of the policy at the start.
    later = QueuePolicyChanged(id="q2", ts=inputs[-1].ts + 5, source="api", queue=inputs[1].queue, version=2)
    again = parse_scenario(write_scenario([*inputs, later], settings=scenario.settings))
    assert [s.action()[0] for s in again.events] == ["submit", "submit", "submit", "fail", "finish", "finish",
                                                      "queue"]
    assert again.events[-1].at == 14.0
    placed = [e for _, e in run_scenario(again).log if isinstance(e, JobPlaced)]
    assert [p.job_id for p in placed] == ["long", "short"]
    assert sum(isinstance(e, SubmitJob) for e in scenario_inputs(again)) == 3
