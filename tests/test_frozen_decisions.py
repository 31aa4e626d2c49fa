"""The frozen net: on every run of libs/sim/frozen/sets.py (the scenario files, seeded pipeline sequences, node
health sequences, a contention case in Kueue's generator format and a slice of the Philly trace, all in virtual
time) the deciders decide exactly what tests/golden/frozen/<set>.json recorded, byte for byte. A rewrite of the
decision core that is to change nothing passes unchanged; a deliberate change of decisions re-records the sets it
changes (`.venv/bin/python scripts/freeze_decisions.py --set NAME`) and states the difference in its commit.

Runs are named <set>/<run>: `-k "not philly"` leaves out the slice of the Philly trace (a few seconds) when
iterating locally. That slice reads the reference trace where the project keeps it, next to the checkout
(../shared/data), in place: the trace is never copied into the checkout, so where that folder is absent those
three runs are skipped with that reason. Every other run needs nothing outside the checkout."""

from __future__ import annotations

import functools

import msgspec
import pytest

from libs.sim.frozen.compare import differences
from libs.sim.frozen.digest import DECIDERS, Log, record_of
from libs.sim.frozen.sets import SCENARIOS, SETS, SHARED_DATA, Runs, scenario_log
from libs.sim.frozen.store import FrozenFile, frozen_path, read_frozen, rerecord_hint

# The sets that read the reference data next to the checkout.
NEEDS_SHARED_DATA = frozenset({"philly"})


@functools.cache
def runs_of(name: str) -> Runs:
    return SETS[name].runs()


@functools.cache
def frozen_of(name: str) -> FrozenFile | None:
    return read_frozen(name)


def frozen_runs() -> list[object]:
    params: list[object] = []
    for name in SETS:
        frozen = frozen_of(name)
        marks = [] if name not in NEEDS_SHARED_DATA else [pytest.mark.skipif(
            not SHARED_DATA.is_dir(), reason=f"the reference data is not next to the checkout ({SHARED_DATA})")]
        params += [pytest.param(name, run_id, id=f"{name}/{run_id}", marks=marks)
                   for run_id in (frozen or {"runs": {}})["runs"]]
    return params


@pytest.mark.parametrize(("name", "run_id"), frozen_runs())
def test_run_decides_as_frozen(name: str, run_id: str) -> None:
    frozen = frozen_of(name)
    assert frozen is not None
    make = runs_of(name).get(run_id)
    assert make is not None, f"{name}/{run_id} is frozen but the set no longer has it; {rerecord_hint(name)}"
    found = differences(f"{name}/{run_id}", frozen["runs"][run_id], record_of(make(), frozen["checkpoint_every"]),
                        frozen["checkpoint_every"])
    assert not found, (f"{name}/{run_id} decides differently from {frozen_path(name).name}:\n"
                       + "\n".join(f"  {d}" for d in found) + f"\n{rerecord_hint(name)}")


@pytest.mark.parametrize("name", list(SETS))
def test_every_run_of_the_set_is_frozen(name: str) -> None:
    """A run added to a set (a new scenario file) is recorded before it can guard anything."""
    frozen = frozen_of(name)
    assert frozen is not None, f"{frozen_path(name)} was never recorded; {rerecord_hint(name)}"
    missing = sorted(set(runs_of(name)) - set(frozen["runs"]))
    assert not missing, f"runs of {name} never frozen: {', '.join(missing)}; {rerecord_hint(name)}"


# --- the record tells a change apart, and says where it is ----------------------------------------------------


EVERY = 10  # a small interval, so that a short scenario has several checkpoints


@pytest.fixture(scope="module")
def log() -> Log:
    return scenario_log(SCENARIOS / "placement-timeout-backoff-is-a-reason.yaml")


def positions(log: Log, service: str) -> list[int]:
    return [i for i, (_, e) in enumerate(log) if e.source == service]


def test_the_record_is_exact_and_lists_every_decider(log: Log) -> None:
    record = record_of(log, EVERY)
    assert list(record["decisions"]) == list(DECIDERS)
    assert record == record_of(list(log), EVERY)
    assert record["decisions"]["quota"]["count"] > 3 * EVERY
    assert len(record["decisions"]["quota"]["checkpoints"]) == record["decisions"]["quota"]["count"] // EVERY


def test_an_altered_decision_is_found_in_its_window(log: Log) -> None:
    at = positions(log, "quota")[2 * EVERY + 4]  # the 25th quota decision: in the third window
    seq, event = log[at]
    altered = [*log[:at], (seq, msgspec.structs.replace(event, correlation_id=event.correlation_id + "x")),
               *log[at + 1:]]
    found = differences("run", record_of(log, EVERY), record_of(altered, EVERY), EVERY)
    assert [(d.what, d.detail) for d in found] == [
        ("quota", f"{len(positions(log, 'quota'))} decisions frozen, {len(positions(log, 'quota'))} now; first "
                  f"differing checkpoint #3 of {len(positions(log, 'quota')) // EVERY} frozen: the first difference "
                  f"is in decisions 21-30")]


def test_a_lost_decision_changes_the_count_and_the_log_length(log: Log) -> None:
    at = positions(log, "placement")[-1]
    found = differences("run", record_of(log, EVERY), record_of([*log[:at], *log[at + 1:]], EVERY), EVERY)
    count = len(positions(log, "placement"))
    assert [d.what for d in found] == ["placement", "events"]
    assert found[0].detail.startswith(f"{count} decisions frozen, {count - 1} now")


def test_two_decisions_swapped_differ_though_the_same_ones_are_made(log: Log) -> None:
    first, second = positions(log, "admission")[:2]
    swapped = list(log)
    swapped[first], swapped[second] = log[second], log[first]
    found = differences("run", record_of(log, EVERY), record_of(swapped, EVERY), EVERY)
    assert [d.what for d in found] == ["admission"]
    assert "decisions 1-10" in found[0].detail


def test_a_changed_input_is_told_apart_from_a_changed_decision(log: Log) -> None:
    at = next(i for i, (_, e) in enumerate(log) if e.source == "scenario")
    seq, event = log[at]
    changed = [*log[:at], (seq, msgspec.structs.replace(event, id=event.id + "x")), *log[at + 1:]]
    assert [d.what for d in differences("run", record_of(log, EVERY), record_of(changed, EVERY), EVERY)] == ["inputs"]
