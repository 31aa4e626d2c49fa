"""Random worlds of many queues (tests/unit/many_queue_worlds.py) run the same every time, keep the platform's
guarantees, and exercise what they are made for: borrowing, reclaims, every kind of wait for quota.

Seeds other than SEEDS on which the guarantee checker reports violations are listed below, each marked xfail
(strict: once fixed, it passes and the mark must go) with what breaks and why, as far as it was traced. They
are tied to the generator as it is now: a change to what it draws changes which seeds break."""

from __future__ import annotations

from functools import cache

import msgspec
import pytest

from contracts import EventBase, JobFinished, PreemptionDecided, QuotaDeferred, QuotaReserved
from libs.bench.guarantee_figures import guarantee_figures
from tests.unit.many_queue_worlds import random_world, run_log, run_world

SEEDS = (1, 2, 3, 4, 5, 7, 9, 12, 13)
WAITS = {"cohort_quota_exhausted", "quota_lent_out", "behind_higher_priority", "exceeds_queue_quota", "user_limit"}


@cache
def world_log(seed: int) -> list[tuple[int, EventBase]]:
    return run_world(random_world(seed)).log


def broken(seed: int, reason: str) -> object:
    return pytest.param(seed, marks=pytest.mark.xfail(reason=reason, strict=True, raises=AssertionError))


# Seeds whose worlds break a guarantee (found with this generator; see the module doc).
BROKEN = [
    broken(8, "reclaim_within_bound: q03 (under org, nominal 8, holding 0) waits 540 s for j0211 (8 GPUs), past its "
              "bound of 487.5 s: borrowers of cohort-a (j0370, j0375, j0016) are reserved while it waits, as the "
              "lender-first rule (quota/reclaim.py lent_out) looks only at the queues of a cycle's own group, not at "
              "a child of a member with quota waiting for what that member lent; reserved and unplaced, they hold "
              "its quota to their placement timeouts, past the bound taken when its wait began: not fixed"),
    broken(15, "reclaim_within_bound: q18 (A100 nominal 2, holding 0) waits 600 s, past its bound of 540.2 s: at "
               "16800 j0050 gives back 8 A100 GPUs at its placement timeout, and in that cycle q08's head j0109 (8 "
               "GPUs, borrowing 2) goes before q18's j0278 (2 GPUs within q18's nominal), both ranked entitled "
               "(quota/order.py: q08 by level_entitled, its smaller j0146 fitting its nominal) and q08 lower in the "
               "fair order; with no lender waiting at the cycle's start, j0109 borrows what j0278 was owed and, "
               "reserved but unplaced, holds it to its placement timeout: not fixed"),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_world_runs_the_same_twice(seed: int) -> None:
    assert [msgspec.json.encode(e) for e in random_world(seed)] == [msgspec.json.encode(e) for e in random_world(seed)]
    once = [msgspec.json.encode(e) for _, e in world_log(seed)]
    assert len(once) > 3000
    assert run_log(random_world(seed)) == once


@pytest.mark.parametrize("seed", [*SEEDS, *BROKEN])
def test_a_world_keeps_every_guarantee(seed: int) -> None:
    figures = guarantee_figures(world_log(seed))
    assert figures["guarantee_violations"] == 0, figures


@pytest.mark.parametrize("seed", SEEDS)
def test_a_world_exercises_borrowing_reclaims_and_every_wait(seed: int) -> None:
    log = [e for _, e in world_log(seed)]
    inputs = random_world(seed)
    assert any(isinstance(e, QuotaReserved) and e.borrowed_milli > 0 for e in log)
    codes = {e.code for e in log if isinstance(e, QuotaDeferred)}
    assert codes >= WAITS, WAITS - codes
    # The job planted above the lowered quota is told so.
    assert any(isinstance(e, QuotaDeferred) and e.job_id == "big" and e.code == "exceeds_queue_quota" for e in log)
    decided = [e for e in log if isinstance(e, PreemptionDecided)]
    assert {"reclaim", "within_queue_priority"} <= {e.code for e in decided}
    submitted = sum(type(e).__name__ == "SubmitJob" for e in inputs)
    assert sum(isinstance(e, JobFinished) for e in log) > submitted * 2 // 3
    # Every mid-run input is there, after the inventory and the policy.
    kinds = {type(e).__name__ for e in inputs if e.ts > 0}
    assert kinds >= {"SubmitJob", "CancelJob", "NodeLost", "NodeRegistered", "NodeCordoned", "NodeUncordoned",
                     "QueuePolicyChanged", "PriorityClassesChanged"}
    assert [e.ts for e in inputs] == sorted(e.ts for e in inputs)
