"""Least attained service inside a queue (libs/core/kernel/attained_service.py):
the service each job held, the order of the
waiting jobs of one priority, and the preemption of a job above the threshold for one below it."""

from __future__ import annotations

from pathlib import Path

from contracts import LEAST_ATTAINED_SERVICE, JobEvicted, JobStarted, PreemptionDecided, QueueSpec
from libs.core.kernel.attained_service import AttainedService, threshold_milli_s
from libs.core.kernel.queue_limits import check_tree
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def test_service_adds_up_over_runs_and_counts_the_run_going_on() -> None:
    s = AttainedService()
    s.started("j", 10.0, 2000)
    assert s.of("j", 15.0) == 10_000.0
    s.stopped("j", 20.0)
    assert s.of("j", 99.0) == 20_000.0  # not running: only what it held
    s.started("j", 30.0, 2000)
    assert s.crosses_at("j", 30_000.0) == 35.0
    assert s.of("j", 40.0) == 40_000.0
    s.forget("j")
    assert s.of("j", 40.0) == 0.0 and s.crosses_at("j", 1.0) is None


def test_threshold_is_off_unless_set_and_must_be_positive() -> None:
    assert threshold_milli_s(QueueSpec(name="q", team="t")) is None
    assert threshold_milli_s(QueueSpec(name="q", team="t", las_threshold_gpu_hours=0.5)) == 1_800_000.0
    assert check_tree({}, QueueSpec(name="q", team="t", las_threshold_gpu_hours=0.0)) == (
        "las_threshold_gpu_hours must be > 0")


def test_short_job_preempts_a_long_one_of_its_priority_only_in_a_las_queue() -> None:
    run = run_scenario(load_scenario(SCENARIOS / "least-attained-service-short-job-preempts-long-one.yaml"))
    assert run.violations == [] and run.unmet == []
    events = [e for _, e in run.log]
    decided = [e for e in events if isinstance(e, PreemptionDecided)]
    assert [(d.preemptor_id, d.code, [(v.job_id, v.reason) for v in d.victims]) for d in decided] == [
        ("short", LEAST_ATTAINED_SERVICE, [("long-2", LEAST_ATTAINED_SERVICE)])]
    starts = {(e.job_id, e.ts - run.scenario.settings.start) for e in events if isinstance(e, JobStarted)}
    assert ("short", 100.0) in starts  # at once, in the queue of least attained service
    assert ("plain-short", 400.0) in starts  # the plain queue's long job ran on to its end
    assert ("long-2", 120.0) in starts  # back from its checkpoint once the short job was done
    assert [e.job_id for e in events if isinstance(e, JobEvicted)] == ["long-2"]
