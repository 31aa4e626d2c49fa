"""What a quota cycle keeps between cycles equals what it would find afresh, at every cycle of random worlds of
many queues (tests/unit/many_queue_worlds.py): the waiting queues and demands per cohort and the jobs not told
they wait (recounted from the queues), each kept head and order key (found and computed again), each kept
lent-only answer, and each cohort's ranked heap (every waiting queue in it exactly once, or unranked; every
ranked one lent-only, keeping its head, in its place). test_decision_shortcuts checks the decisions; this
checks the reasons."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from libs.core.kernel.decider import Decisions
from libs.core.kernel.wait_reasons import WAITING_FOR_QUOTA
from libs.core.quota import cycle as quota_cycle
from libs.core.quota.order import Order, order_key
from libs.core.quota.shortcuts import kept_heads as quota_kept_heads
from libs.core.quota.shortcuts import ranked_queues as quota_ranked
from libs.core.quota.shortcuts import skipped_queues as quota_skipped
from libs.core.quota.state import Cycle, QuotaJob, QuotaState
from tests.unit.many_queue_worlds import random_world, run_log


def fresh_head(d: QuotaState, queue: str) -> QuotaJob:
    return next(iter(Order(d, queue).remaining))


def recount(d: QuotaState) -> tuple[dict[str, set[str]], dict[str, Counter[int]], dict[str, set[str]]]:
    waiting: dict[str, set[str]] = {}
    demands: dict[str, Counter[int]] = {}
    untold: dict[str, set[str]] = {}
    for queue, levels in d.pending.items():
        cohort = d.book.cohort.get(queue, "")
        for users in levels.values():
            for keys in users.values():
                for _, job_id in keys:
                    if cohort:
                        waiting.setdefault(cohort, set()).add(queue)
                        demands.setdefault(cohort, Counter())[d.jobs[job_id].demand] += 1
                    if d.deferred.get(job_id) not in WAITING_FOR_QUOTA:
                        untold.setdefault(queue, set()).add(job_id)
    return waiting, demands, untold


def check_bookkeeping(d: QuotaState) -> None:
    waiting, demands, untold = recount(d)
    assert {c: set(qs) for c, qs in d.waiting_in.items() if qs} == waiting
    assert {c: Counter(n) for c, n in d.cohort_demands.items() if n} == demands
    assert {q: set(js) for q, js in d.untold.items() if js} == untold


def check_ranked(d: QuotaState, cohort: str, unranked: list[str], cycle: Cycle, seen: Counter[str]) -> None:
    places: dict[str, tuple[object, ...]] = {}
    for entry in d.ranked.get(cohort, []):
        if quota_ranked.still_in_place(d, entry, cycle):
            assert entry[1] not in places, f"two entries of {entry[1]} in its cohort's ranked heap"
            places[entry[1]] = entry[0]
    for queue in d.waiting_in.get(cohort, {}):
        if queue in unranked:
            assert queue not in places
            continue
        assert queue in places, f"waiting queue {queue} neither unranked nor in its cohort's ranked heap"
        assert quota_skipped.lent_only_now(d, queue) and quota_kept_heads.may_keep_head(d, queue, cycle.backing_off)
        head = fresh_head(d, queue)
        assert d.kept_heads[queue][1] == head.job_id
        assert places[queue] == order_key(d, head, Cycle(now=cycle.now))
        seen["ranked"] += 1


@pytest.mark.parametrize("seed", [2, 5, 8, 11])
def test_what_a_pass_keeps_is_what_it_would_find(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    seen: Counter[str] = Counter()
    rank_cohort, kept_head, lent_only = quota_cycle.rank_cohort, quota_kept_heads.kept_head, quota_skipped.lent_only

    def checked_rank_cohort(d: QuotaState, cohort: str, cycle: Cycle, out: Decisions) -> list[str]:
        check_bookkeeping(d)
        unranked = rank_cohort(d, cohort, cycle, out)
        check_ranked(d, cohort, unranked, cycle, seen)
        return unranked

    def checked_kept_head(d: QuotaState, queue: str, cycle: Cycle) -> Any:
        kept = kept_head(d, queue, cycle)
        if kept is not None:
            head = fresh_head(d, queue)
            assert kept[0].job_id == head.job_id
            assert kept[1] == order_key(d, head, Cycle(now=cycle.now))
            seen["kept"] += 1
        return kept

    def checked_lent_only(d: QuotaState, queue: str, backing_off: set[str]) -> bool:
        answer = lent_only(d, queue, backing_off)
        if queue not in backing_off:
            assert answer == quota_skipped.lent_only_now(d, queue)
            seen["lent_only"] += 1
        return answer

    monkeypatch.setattr(quota_cycle, "rank_cohort", checked_rank_cohort)
    for module in (quota_cycle, quota_ranked):
        monkeypatch.setattr(module, "kept_head", checked_kept_head)
        monkeypatch.setattr(module, "lent_only", checked_lent_only)
    assert len(run_log(random_world(seed))) > 1000
    assert seen["ranked"] > 0 and seen["kept"] > 0 and seen["lent_only"] > 0
