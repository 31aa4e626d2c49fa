"""What a pass reads triggers it (libs/core/kernel/dependencies.py): each decider reacts to exactly the inputs
that change a part its pass reads and reacts to, every input a decider folds has its changes declared, and no
fold changes a part of the state that the declaration does not name for that input (so a new kind of change
cannot slip past the triggers unseen)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from contracts import (
    ClockTick,
    JobPlaced,
    PlacementDeferred,
    QuotaDeferred,
    QuotaRecalled,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.kernel.dependencies import CHANGES, Reads
from libs.core.placement.cycle import REACTIONS as PLACEMENT_REACTIONS
from libs.core.placement.decider import PASS as PLACEMENT_PASS
from libs.core.placement.decider import PlacementDecider
from libs.core.placement.state import PlacementState
from libs.core.preemption.decider import PASS as PREEMPTION_PASS
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import PASS as QUOTA_PASS
from libs.core.quota.decider import QuotaDecider
from libs.core.quota.reactions import REACTIONS as QUOTA_REACTIONS
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

# And for placement besides: reservations that follow a queue's flavors, a nominee's quota going back.
PLACED = (*FOLDED, "placement-waiter-tried-again-when-its-quota-covers-another-model",
          "placement-timeout-waits-for-leaving-victims", "placement-timeout-at-grace-end",
          "lower-priority-nominee-takes-starving-jobs-room")


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
    # (a reservation asked back leaves the part as it goes back, or as its job is placed: see `same`)
    Reads.RECALLS: lambda s: {j: j == s.returned for j in s.recalled
                              if j in s.jobs and s.jobs[j].state == "reserved" and not s.jobs[j].placed},
}


def _usable_free(state: PlacementState) -> dict[tuple[str, int], int]:
    return {(node.name, gpu.index): gpu.free_milli for node in state.cluster.sorted_nodes() if node.online
            for gpu in node.gpus if gpu.healthy}


# The placement state, part by part. FREED and RESERVED are gains (`grew`): GPUs taken, or a job no longer
# waiting, is a change of HELD.
PLACEMENT_PARTS: dict[Reads, Callable[[PlacementState], object]] = {
    Reads.QUEUES: lambda s: _encode(sorted(s.policy.queues.items())),
    Reads.CLASSES: lambda s: _encode(sorted(s.policy.classes.items())),
    Reads.SETTINGS: lambda s: _encode(s.policy.settings),
    Reads.NODES: lambda s: [(node.name, node.online, sorted(node.models),
                             [(gpu.index, gpu.model, gpu.healthy) for gpu in node.gpus])
                            for node in s.cluster.sorted_nodes()],
    Reads.FREED: _usable_free,
    # (the spec as submitted: the one a reservation narrowed to its flavor's model is part of what it holds)
    Reads.SUBMISSIONS: lambda s: {j: s.submitted.get(j, spec) for j, spec in s.specs.items()},
    Reads.HELD: lambda s: {**{j: ("placed", placements) for j, placements in s.placed.items()},
                           **{j: ("waiting", s.specs[j].gpu_models) for j in s.waiting if j in s.specs}},
    Reads.RESERVED: lambda s: dict.fromkeys(s.waiting),
    Reads.DEFERRALS: lambda s: {j: code for j, code in s.deferred.items() if j in s.waiting},
    Reads.NOMINATIONS: lambda s: {j: (n.at, n.victims, n.reclaim, n.least_served) for j, n in s.nominated.items()},
    Reads.RUNS: lambda s: dict(s.ends),
    Reads.RECALLS: lambda s: s.let_go,
}
GAINS = Reads.FREED | Reads.RESERVED


def grew(before: object, after: object) -> bool:
    """A key added, or a value grown (free GPU share)."""
    assert isinstance(before, dict) and isinstance(after, dict)
    return any(key not in before or (value is not None and value > before[key]) for key, value in after.items())


def moved(part: Reads, before: object, after: object) -> bool:
    """Did a placement part change: for a gain, grow; for any other, change (as `same` judges)?"""
    return grew(before, after) if part & GAINS else not same(before, after)


def same(before: object, after: object) -> bool:
    """Per job (a dict): equal for the jobs still there after, and no job added; else plainly equal."""
    if isinstance(before, dict) and isinstance(after, dict):
        return set(after) <= set(before) and all(before[j] == after[j] for j in after)
    return before == after


def test_every_input_a_decider_folds_declares_what_it_changes() -> None:
    for decider in (QuotaDecider(), PlacementDecider(), PreemptionDecider()):
        assert [t.__name__ for t in decider.input_types() if t not in CHANGES] == []


def test_quota_reacts_to_exactly_the_inputs_that_change_what_its_pass_reads() -> None:
    assert set(QUOTA_REACTIONS) == set(QuotaDecider().reacts_to())
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
    folded = {*decider.input_types(), QuotaReserved, QuotaReleased, QuotaRecalled, QuotaDeferred}
    for event in log:
        if type(event) not in folded:
            continue
        before = {part: read(decider.state) for part, read in QUOTA_PARTS.items()}
        decider.fold(event)
        changed = [part for part, read in QUOTA_PARTS.items() if not same(before[part], read(decider.state))]
        undeclared = [part.name for part in changed if not part & CHANGES[type(event)]]
        assert undeclared == [], f"{type(event).__name__} at {event.ts:g} changed {undeclared}"


def test_placement_reacts_to_exactly_the_inputs_that_change_what_its_pass_reads() -> None:
    assert set(PLACEMENT_REACTIONS) == set(PlacementDecider().reacts_to())
    # What only takes away (a node lost or cordoned, a reservation gone back, a cancel) triggers nothing.
    assert not PLACEMENT_PASS.live() & (Reads.NODES | Reads.HELD | Reads.NOMINATIONS)
    assert all(reason for reason in PLACEMENT_PASS.not_triggered.values())


@pytest.mark.parametrize("name", PLACED)
def test_no_placement_fold_changes_a_part_its_input_does_not_declare(name: str) -> None:
    log = [e for _, e in run_scenario(load_scenario(SCENARIOS / f"{name}.yaml")).log]
    decider = PlacementDecider()
    folded = {*decider.input_types(), JobPlaced, PlacementDeferred}
    for event in log:
        if type(event) not in folded:
            continue
        before = {part: read(decider.state) for part, read in PLACEMENT_PARTS.items()}
        decider.fold(event)
        changed = [part for part, read in PLACEMENT_PARTS.items() if moved(part, before[part], read(decider.state))]
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
