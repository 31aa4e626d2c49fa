"""What simulated jobs declare of their runtime, apart from how long they run: one function for every benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import JobSpec
from libs.bench.inference_scenario import training_backlog
from libs.bench.kueue_scenario import load_scenario, plan_jobs
from libs.sim.declare import NOISY_F, check_declaration, declared
from libs.sim.executor import SIM_RUNTIME_S

GENERATORS = Path(__file__).resolve().parents[3] / "libs" / "bench" / "generators"


def test_each_declaration_tells_its_own_and_the_world_keeps_the_truth() -> None:
    spec = JobSpec(team="t", queue="t", gpus=1, duration_s=5.0, labels={"keep": "me"})
    oracle = declared(spec, 100.0, "oracle", seed=1, key="j")
    none = declared(spec, 100.0, "none", seed=1, key="j")
    noisy = declared(spec, 100.0, "noisy", seed=1, key="j")
    assert (oracle.duration_s, oracle.max_runtime_s) == (100.0, None)
    assert (none.duration_s, none.max_runtime_s) == (None, None)
    assert noisy.duration_s is None and noisy.max_runtime_s is not None
    assert 100.0 <= noisy.max_runtime_s <= 100.0 * (1 + NOISY_F)
    assert declared(spec, 100.0, "noisy", seed=1, key="j") == noisy  # seeded per job
    assert declared(spec, 100.0, "noisy", seed=2, key="j") != noisy
    for s in (oracle, none, noisy):
        assert s.labels == {SIM_RUNTIME_S: "100.0", "keep": "me"}


def test_unknown_declaration_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown declaration 'exact': use none, oracle, noisy"):
        check_declaration("exact")


def test_kueue_jobs_declare_exactly_by_default_and_otherwise_on_request() -> None:
    queues = load_scenario(GENERATORS / "queues-30.yaml", 1.0)
    exact = plan_jobs(queues)[:50]
    hidden = plan_jobs(queues, declare="none")[:50]
    assert all(j.spec.duration_s is not None and SIM_RUNTIME_S not in j.spec.labels for j in exact)
    for e, h in zip(exact, hidden, strict=True):
        assert h.spec.duration_s is None and h.spec.labels[SIM_RUNTIME_S] == repr(e.spec.duration_s)


def test_training_backlog_declares_as_asked() -> None:
    exact, noisy = training_backlog(1, gpu_hours=100.0), training_backlog(1, gpu_hours=100.0, declare="noisy")
    assert [s.gpus for s in exact] == [s.gpus for s in noisy]
    for e, n in zip(exact, noisy, strict=True):
        assert e.duration_s is not None and n.duration_s is None
        assert n.max_runtime_s is not None and n.max_runtime_s >= e.duration_s
