"""What a quota pass keeps between passes equals what it would find afresh, at every pass of random worlds of
many queues (tests/unit/many_queue_worlds.py): the waiting queues and demands per cohort and the jobs not told
they wait (recounted from the queues), each kept head and order key (walked and computed again), each kept
quiet answer, and each cohort's calm heap (every waiting queue in it exactly once, or restless; every calm one
quiet, keeping its head, in its place). test_decision_shortcuts checks the decisions; this checks the reasons."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from libs.core.kernel.decider import Decisions
from libs.core.kernel.wait_reasons import WAITING_FOR_QUOTA
from libs.core.quota import calm as quota_calm
from libs.core.quota import heads as quota_heads
from libs.core.quota import reach as quota_reach
from libs.core.quota import scheduling_pass as quota_pass
from libs.core.quota.decider import QuotaDecider
from libs.core.quota.order import Order, order_key
from libs.core.quota.state import Pass, QuotaJob
from tests.unit.many_queue_worlds import random_world, run_log


def fresh_head(d: QuotaDecider, queue: str) -> QuotaJob:
    return next(iter(Order(d, queue).walk))


def recount(d: QuotaDecider) -> tuple[dict[str, set[str]], dict[str, Counter[int]], dict[str, set[str]]]:
    waiting: dict[str, set[str]] = {}
    demands: dict[str, Counter[int]] = {}
    loud: dict[str, set[str]] = {}
    for queue, levels in d.pending.items():
        cohort = d.book.cohort.get(queue, "")
        for users in levels.values():
            for keys in users.values():
                for _, job_id in keys:
                    if cohort:
                        waiting.setdefault(cohort, set()).add(queue)
                        demands.setdefault(cohort, Counter())[d.jobs[job_id].demand] += 1
                    if d.deferred.get(job_id) not in WAITING_FOR_QUOTA:
                        loud.setdefault(queue, set()).add(job_id)
    return waiting, demands, loud


def check_bookkeeping(d: QuotaDecider) -> None:
    waiting, demands, loud = recount(d)
    assert {c: set(qs) for c, qs in d.waiting_in.items() if qs} == waiting
    assert {c: Counter(n) for c, n in d.cohort_demands.items() if n} == demands
    assert {q: set(js) for q, js in d.loud.items() if js} == loud


def check_calm(d: QuotaDecider, cohort: str, restless: list[str], p: Pass, seen: Counter[str]) -> None:
    places: dict[str, tuple[object, ...]] = {}
    for entry in d.calm.get(cohort, []):
        if quota_calm.valid(d, entry, p):
            assert entry[1] not in places, f"two entries of {entry[1]} in its cohort's calm heap"
            places[entry[1]] = entry[0]
    for queue in d.waiting_in.get(cohort, {}):
        if queue in restless:
            assert queue not in places
            continue
        assert queue in places, f"waiting queue {queue} neither restless nor in its cohort's calm heap"
        assert quota_reach._quiet(d, queue) and quota_heads.keeps(d, queue, p.backing_off)
        head = fresh_head(d, queue)
        assert d.heads[queue][1] == head.job_id
        assert places[queue] == order_key(d, head, Pass(now=p.now))
        seen["calm"] += 1


@pytest.mark.parametrize("seed", [2, 5, 8, 11])
def test_what_a_pass_keeps_is_what_it_would_find(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    seen: Counter[str] = Counter()
    calm_heap, kept_head, quiet = quota_pass.calm_heap, quota_heads.kept_head, quota_reach.quiet

    def checked_calm_heap(d: QuotaDecider, cohort: str, p: Pass, out: Decisions) -> list[str]:
        check_bookkeeping(d)
        restless = calm_heap(d, cohort, p, out)
        check_calm(d, cohort, restless, p, seen)
        return restless

    def checked_kept_head(d: QuotaDecider, queue: str, p: Pass) -> Any:
        kept = kept_head(d, queue, p)
        if kept is not None:
            head = fresh_head(d, queue)
            assert kept[0].job_id == head.job_id
            assert kept[1] == order_key(d, head, Pass(now=p.now))
            seen["kept"] += 1
        return kept

    def checked_quiet(d: QuotaDecider, queue: str, backing_off: set[str]) -> bool:
        answer = quiet(d, queue, backing_off)
        if queue not in backing_off:
            assert answer == quota_reach._quiet(d, queue)
            seen["quiet"] += 1
        return answer

    monkeypatch.setattr(quota_pass, "calm_heap", checked_calm_heap)
    for module in (quota_pass, quota_calm):
        monkeypatch.setattr(module, "kept_head", checked_kept_head)
        monkeypatch.setattr(module, "quiet", checked_quiet)
    assert len(run_log(random_world(seed))) > 1000
    assert seen["calm"] > 0 and seen["kept"] > 0 and seen["quiet"] > 0
