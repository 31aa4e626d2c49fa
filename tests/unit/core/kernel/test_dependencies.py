"""What a pass reads triggers it (libs/core/kernel/dependencies.py): each decider reacts to exactly the inputs
that change a part its pass reads and reacts to, every input a decider folds has its changes declared, and no
fold changes a part of the state that the declaration does not name for that input (so a new kind of change
cannot slip past the triggers unseen)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from contracts import ClockTick, QuotaDeferred, QuotaReleased, QuotaReserved
from libs.core.kernel.dependencies import CHANGES, Reads
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PASS as PREEMPTION_PASS
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import PASS as QUOTA_PASS
from libs.core.quota.decider import QuotaDecider
from libs.core.quota.reactions import REACTIONS
from libs.core.quota.state import QuotaState
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
# Scenarios that change what a pass reads while jobs run: classes, budgets, nodes of new models, queue trees.
FOLDED = ("borrower-held-for-lender-whose-budget-ran-out", "borrower-keeps-the-minimum-runtime-it-started-with",
          "preemptor-hold-takes-its-class-new-priority", "held-for-starving-job-reserved-in-the-same-cycle",
          "lender-job-evicted-after-a-reclaim-never-reclaims-again", "cohort-joined-while-holding-quota",
          "job-refused-quota-placed-once-a-node-of-a-new-model-registers",
          "queue-switched-to-least-attained-service-while-jobs-run",
          "placement-waiter-reclaims-in-a-queue-tree", "lending-limit-lowered-while-lent", "budget-charged-by-run-time",
          "cancelled-preemptor-evicts-nothing-more", "job-held-for-a-cancelled-nominee-is-placed",
          "removed-drained-node-registered-again-takes-jobs", "lowered-quota-does-not-block-queue")


def _encode(value: object) -> bytes:
    return msgspec.json.encode(value, order="deterministic")


# The quota state, part by part: what a fold of each kind of input may change.
QUOTA_PARTS: dict[Reads, Callable[[QuotaState], object]] = {
    Reads.QUEUES: lambda s: _encode(sorted(s.policy.queues.items())),
    Reads.CLASSES: lambda s: _encode(sorted(s.policy.classes.items())),
    Reads.SETTINGS: lambda s: _encode(s.policy.settings),
    Reads.NODES: lambda s: s.fleet.version,
    Reads.SUBMISSIONS: lambda s: sorted(s.submitted),
    Reads.ARRIVALS: lambda s: s.arrivals,
    Reads.HELD: lambda s: (sorted(s.queue_used.items()),
                           sorted(j for j, job in s.jobs.items() if job.state != "pending")),
    # (what a job told, or nominated for, leaves with it: a job ending is a change of HELD; see `same`)
    Reads.DEFERRALS: lambda s: {j: code for j, code in s.deferred.items()
                                if j in s.jobs and s.jobs[j].state == "pending"},
    Reads.NOMINATIONS: lambda s: {j: at for j, at in s.nominated.items() if j in s.jobs},
    Reads.RUNS: lambda s: sorted(s.budgets.runs),
}


def same(before: object, after: object) -> bool:
    """Per job (a dict): equal for the jobs still there after, and no job added; else plainly equal."""
    if isinstance(before, dict) and isinstance(after, dict):
        return set(after) <= set(before) and all(before[j] == after[j] for j in after)
    return before == after


def test_every_input_a_decider_folds_declares_what_it_changes() -> None:
    for decider in (QuotaDecider(), PlacementDecider(), PreemptionDecider()):
        assert [t.__name__ for t in decider.input_types() if t not in CHANGES] == []


def test_quota_reacts_to_exactly_the_inputs_that_change_what_its_pass_reads() -> None:
    assert set(REACTIONS) == set(QuotaDecider().reacts_to())
    assert QUOTA_PASS.live() & Reads.CLOCK and QUOTA_PASS.live() & Reads.CLASSES


def test_preemption_reacts_to_deferrals_and_the_clock_and_leaves_the_rest_to_the_next_tick() -> None:
    assert set(PreemptionDecider().reacts_to()) == {t for t in PreemptionDecider().input_types()
                                                   if CHANGES[t] & (Reads.DEFERRALS | Reads.CLOCK)}
    assert PREEMPTION_PASS.live() | Reads.CLOCK | Reads.DEFERRALS == PREEMPTION_PASS.live()
    assert all(reason for reason in PREEMPTION_PASS.not_triggered.values())


@pytest.mark.parametrize("name", FOLDED)
def test_no_quota_fold_changes_a_part_its_input_does_not_declare(name: str) -> None:
    log = [e for _, e in run_scenario(load_scenario(SCENARIOS / f"{name}.yaml")).log]
    decider = QuotaDecider()
    folded = {*decider.input_types(), QuotaReserved, QuotaReleased, QuotaDeferred}
    for event in log:
        if type(event) not in folded:
            continue
        before = {part: read(decider.state) for part, read in QUOTA_PARTS.items()}
        decider.fold(event)
        changed = [part for part, read in QUOTA_PARTS.items() if not same(before[part], read(decider.state))]
        undeclared = [part.name for part in changed if not part & CHANGES[type(event)]]
        assert undeclared == [], f"{type(event).__name__} at {event.ts:g} changed {undeclared}"


@pytest.mark.parametrize("name", FOLDED[:4])
def test_every_preemption_fold_but_a_ticks_marks_the_world_changed(name: str) -> None:
    log = [e for _, e in run_scenario(load_scenario(SCENARIOS / f"{name}.yaml")).log]
    decider = PreemptionDecider()
    folded = set(decider.input_types())
    for event in log:
        if type(event) in folded and not isinstance(event, ClockTick):
            decider.state.changed = False
            decider.fold(event)
            assert decider.state.changed
