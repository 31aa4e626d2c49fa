"""The read-only book of quota's figures (kernel/quota_ledger.py), which accounting folds for its queue views,
keeps every figure exactly as the quota decider's own fold keeps it: after each event of every scenario and of
seeded sequences, the same quota book, usage, decayed usage and budgets."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.core.kernel.quota_figures import budget_left_s, fair_share
from libs.core.kernel.quota_ledger import QuotaLedger
from libs.core.kernel.runs import CurrentRuns
from libs.core.quota.fold import FOLDED
from libs.core.quota.fold import fold as quota_fold
from libs.core.quota.state import QuotaState
from libs.sim.frozen.digest import Log
from libs.sim.frozen.sequences import run_sequence
from libs.sim.frozen.sets import SCENARIOS, scenario_log

SEEDS = range(0, 100, 7)


def assert_agree(log: Log) -> None:
    state, ledger, runs = QuotaState(), QuotaLedger(), CurrentRuns()
    for seq, event in log:
        if runs.is_stale(event):  # (as accounting folds the log)
            continue
        runs.fold(event)
        if isinstance(event, FOLDED):
            quota_fold(state, event)
        ledger.fold(event)
        assert (ledger.book, ledger.queue_used, ledger.decayed, ledger.budgets) == (
            state.book, state.queue_used, state.decayed, state.budgets), f"after #{seq} {type(event).__name__}"
        for queue in state.policy.queues:
            assert ledger.fair_share(queue, event.ts) == fair_share(state, queue, event.ts)
            assert ledger.budget_left_s(queue, event.ts) == budget_left_s(state, queue, event.ts)


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_scenario(path: Path) -> None:
    assert_agree(scenario_log(path))


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_sequences(seed: int) -> None:
    assert_agree(run_sequence(seed))
