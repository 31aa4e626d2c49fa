"""The path to a placement first: the services off it run at a lower CPU priority when the supervisor starts
them (GPUSCHED_OFF_PATH_NICE) and wait longer for their batches to fill (GPUSCHED_BATCH_WAIT_MS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.runtime import supervisor
from libs.runtime.settings import OFF_PATH, SERVICES, Settings, batch_wait_s, service_nice
from libs.runtime.supervisor import Supervisor

PATH = ("admission", "quota", "placement")


def test_the_services_off_the_path_are_accounting_preemption_and_node_telemetry() -> None:
    assert set(OFF_PATH) == {"accounting", "preemption", "node-telemetry"}
    assert set(SERVICES) == set(OFF_PATH) | set(PATH)


def test_off_the_path_a_service_runs_ten_nice_levels_lower_by_default() -> None:
    assert {s: service_nice(s, {}) for s in SERVICES} == {**dict.fromkeys(PATH, 0), **dict.fromkeys(OFF_PATH, 10)}


def test_the_off_path_nice_level_is_a_setting_and_zero_turns_it_off() -> None:
    assert [service_nice(s, {"GPUSCHED_OFF_PATH_NICE": " 5 "}) for s in ("accounting", "placement")] == [5, 0]
    assert all(service_nice(s, {"GPUSCHED_OFF_PATH_NICE": "0"}) == 0 for s in SERVICES)
    assert service_nice("preemption", {"GPUSCHED_OFF_PATH_NICE": ""}) == 10
    for bad in ("-1", "20"):
        with pytest.raises(ValueError, match="between 0 and 19"):
            service_nice("accounting", {"GPUSCHED_OFF_PATH_NICE": bad})


def test_off_the_path_a_batch_waits_50_ms_for_more_and_on_it_takes_what_is_there() -> None:
    waits = {s: batch_wait_s(s, {}) for s in SERVICES}
    assert waits == {**dict.fromkeys(PATH, 0.0), **dict.fromkeys(OFF_PATH, 0.05)}
    assert batch_wait_s("agent", {}) == 0.0  # anything else does as the path does


def test_the_batch_wait_is_a_setting_for_every_service_or_for_one() -> None:
    env = {"GPUSCHED_BATCH_WAIT_MS": "20", "GPUSCHED_NODE_TELEMETRY_BATCH_WAIT_MS": "100"}
    assert [batch_wait_s(s, env) for s in ("placement", "accounting", "node-telemetry")] == [0.02, 0.02, 0.1]
    assert batch_wait_s("accounting", {"GPUSCHED_BATCH_WAIT_MS": " "}) == 0.05
    assert batch_wait_s("accounting", {"GPUSCHED_BATCH_WAIT_MS": "0"}) == 0.0
    for bad, key in (("-1", "GPUSCHED_BATCH_WAIT_MS"), ("1001", "GPUSCHED_QUOTA_BATCH_WAIT_MS")):
        with pytest.raises(ValueError, match=f"{key} must be from 0 to 1000 ms"):
            batch_wait_s("quota", {key: bad})


def test_each_service_s_settings_carry_its_batch_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCHED_BATCH_WAIT_MS", raising=False)
    assert Settings.from_env("accounting").batch_wait_s == 0.05
    assert Settings.from_env("admission").batch_wait_s == 0.0
    monkeypatch.setenv("GPUSCHED_PREEMPTION_BATCH_WAIT_MS", "80")
    assert Settings.from_env("preemption").batch_wait_s == 0.08
    assert Settings(service="agent").batch_wait_s == 0.0  # built field by field


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


@pytest.fixture
def idle_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every service's module replaced by one that only waits: the supervisor's own code path, no bus."""
    for name in SERVICES:
        monkeypatch.setitem(supervisor.MODULES, name, "tests.unit.idle_service")


def _started(tmp_path: Path, env: dict[str, str]) -> Supervisor:
    sup = Supervisor(env=env, ports=dict.fromkeys(SERVICES, 0), log_dir=tmp_path / "logs")
    sup.start()
    return sup


def _pid(sup: Supervisor, name: str) -> int:
    proc = sup.children[name].proc
    assert proc is not None and proc.poll() is None, (sup.log_dir / f"{name}.log").read_text()
    return proc.pid


@pytest.mark.usefixtures("idle_services")
def test_the_supervisor_starts_the_services_off_the_path_at_a_lower_priority_and_restarts_them_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCHED_OFF_PATH_NICE", raising=False)
    own = _nice(0)
    sup = _started(tmp_path, {})
    try:
        assert {n: _nice(_pid(sup, n)) for n in SERVICES} == {
            **dict.fromkeys(PATH, own), **dict.fromkeys(OFF_PATH, min(own + 10, 19))}
        sup.kill("accounting")
        assert sup.restart_dead() == ["accounting"]
        assert _nice(_pid(sup, "accounting")) == min(own + 10, 19)  # a new process, lowered again
    finally:
        sup.stop()


@pytest.mark.usefixtures("idle_services")
def test_the_supervisor_s_environment_sets_the_level_and_zero_keeps_every_service_at_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_OFF_PATH_NICE", "3")  # the process environment, overridden by the platform's
    own = _nice(0)
    sup = _started(tmp_path, {"GPUSCHED_OFF_PATH_NICE": "0"})
    try:
        assert {_nice(_pid(sup, n)) for n in SERVICES} == {own}
    finally:
        sup.stop()
    sup = _started(tmp_path, {})
    try:
        assert _nice(_pid(sup, "preemption")) == min(own + 3, 19)
    finally:
        sup.stop()


@pytest.mark.usefixtures("idle_services")
def test_a_wrong_level_starts_no_service(tmp_path: Path) -> None:
    sup = Supervisor(env={"GPUSCHED_OFF_PATH_NICE": "25"}, ports=dict.fromkeys(SERVICES, 0), log_dir=tmp_path)
    with pytest.raises(ValueError, match="GPUSCHED_OFF_PATH_NICE"):
        sup.start()
    assert sup.children == {}
