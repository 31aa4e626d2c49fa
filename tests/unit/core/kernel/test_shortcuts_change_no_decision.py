"""The deciders' shortcuts change what a decision costs, never what it is: a random loaded trace through every
set-up gives the same log, byte for byte, with each shortcut switched off.

- quota skips a job the starving job would hold again, as it holds one of the same key (quota_next_head.next_head,
  shortcuts/repeated_holds.held_like_another);
- quota releases the reservations without a declared end summed per queue when it looks for the starving job's
  shadow (quota_starvation._summed);
- preemption skips the victim search of a reclaim whose queue could not fit its nominal quota even with all its
  own candidates gone (libs/core/preemption/shortcuts.py could_fit_nominal);
- quota does not look at a queue none of whose waiting jobs could get quota in the cycle, when trying them would
  tell nobody anything new (shortcuts/skipped_queues.skippable), nor, while the cohort has no room, at a queue
  that would then be such a queue (shortcuts/skipped_queues.lent_only);
- quota reads back a queue's head and its order key from an earlier cycle when nothing they depend on
  changed (shortcuts/kept_heads.kept_head), and keeps a cohort's lent-only queues ranked between cycles
  (shortcuts/ranked_queues);
- quota leaves out a cycle over a queue without a cohort whose earlier cycle tried its jobs and decided nothing,
  when nothing those tries read changed since (shortcuts/kept_failures.failures_stand);
- quota reads back the starving job's shadow found by an earlier cycle over its group when neither the usage its
  rooms read, the policy, the starving job nor its flavors changed (shortcuts/kept_shadow.kept_shadow);
- quota shares the flavors a job may use, and whether the present nodes could hold it, among the jobs asking
  alike (shortcuts/request_shapes.shaped_flavors, shaped_holdable);
- on a tick, preemption considers no waiting job alike to one that found no victims since the last decision
  (libs/core/preemption/shortcuts.py alike_key).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from libs.core.preemption import shortcuts as preemption_shortcuts
from libs.core.quota import cycle as quota_cycle
from libs.core.quota import fit as quota_fit
from libs.core.quota import next_head as quota_next_head
from libs.core.quota import starvation as quota_starvation
from libs.core.quota.shortcuts import ranked_queues as quota_ranked
from libs.core.quota.state import QuotaJob
from libs.runtime.settings import DEFAULT_CLUSTER
from libs.sim.pipeline import VirtualWorld, run_virtual
from libs.sim.scenario import run_scenario
from libs.sim.scenario_model import load_scenario
from libs.sim.trace_outcome import TraceJob
from libs.sim.trace_run import Setup, world_inputs
from libs.sim.workload import synthetic_inputs
from tests.unit.many_queue_worlds import random_world, run_log

TEAMS = {"a": 1, "b": 2, "c": 1}  # nodes of 8 GPUs: 32 GPUs
SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
# Every scenario (among them held-job-tried-again-after-another-queues-reservation.yaml, where a shortcut once
# decided otherwise than the long way).
SCENARIO_FILES = sorted(cycle.name for cycle in SCENARIOS.glob("*.yaml"))


def loaded_trace(seed: int, jobs: int = 160) -> list[TraceJob]:
    """More work than the cluster holds, of mixed sizes (gangs too), one team far above its share."""
    rng = random.Random(seed)
    out = []
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(1 / 40.0)
        team = rng.choice("aaabbc")
        out.append(TraceJob(job_id=f"j{i:04d}", team=team, submit_s=round(t, 1),
                            runtime_s=round(rng.uniform(60, 4000), 1), gpus=rng.choice((1, 1, 1, 2, 4, 8, 16))))
    return out


def log_bytes(jobs: list[TraceJob], setup: Setup) -> list[bytes]:
    inputs, _ = world_inputs(jobs, TEAMS, setup, seed=3, reclaim_after_s=300.0)
    world = VirtualWorld(60.0)
    world.feed(inputs)
    world.begin()
    while world.busy():
        world.step()
    return [msgspec.json.encode(e) for _, e in world.log]


def no_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quota_next_head, "held_like_another", lambda d, job, cycle: False)
    monkeypatch.setattr(quota_cycle, "skippable", lambda d, queue, cycle: False)
    monkeypatch.setattr(quota_cycle, "failures_stand", lambda d, queue, cycle: False)
    for module in (quota_cycle, quota_ranked):
        monkeypatch.setattr(module, "lent_only", lambda d, queue, backing_off: False)
        monkeypatch.setattr(module, "kept_head", lambda d, queue, cycle: None)

    def one_by_one(jobs: list[QuotaJob]) -> list[QuotaJob]:
        return jobs

    monkeypatch.setattr(quota_starvation, "_summed", one_by_one)
    monkeypatch.setattr(quota_starvation, "kept_shadow",
                        lambda state, group, starving, flavors, now, find: find(state, group, starving, flavors, now))
    monkeypatch.setattr(quota_fit, "shaped_flavors", lambda state, job, find: find(state, job))
    monkeypatch.setattr(quota_fit, "shaped_holdable", lambda state, job, flavors, find: find(state, job))
    monkeypatch.setattr(preemption_shortcuts, "could_fit_nominal", lambda sim, flavor, own: True)
    monkeypatch.setattr(preemption_shortcuts, "alike_key", lambda state, policy, job_id, now, preemptors: None)


@pytest.mark.parametrize("pool", ["partitioned", "shared"])
@pytest.mark.parametrize("declare", ["none", "noisy"])
@pytest.mark.parametrize("las", [False, True])
def test_shortcuts_decide_as_the_long_way(monkeypatch: pytest.MonkeyPatch, pool: str, declare: str,
                                          las: bool) -> None:
    jobs = loaded_trace(seed=7)
    setup = Setup(pool, "platform", pool, declare, las=las)
    taken: dict[str, int] = {"held": 0, "summed": 0, "no_reclaim": 0, "skippable": 0, "lent_only": 0, "kept": 0,
                             "failures_stand": 0, "kept_shadow": 0,
                             "shapes": 0}
    with monkeypatch.context() as m:
        count_shortcuts(m, taken)
        fast = log_bytes(jobs, setup)
    with monkeypatch.context() as m:
        no_shortcuts(m)
        slow = log_bytes(jobs, setup)
    assert len(fast) > 1000  # a loaded run: many jobs wait, some starve, reclaims are tried
    assert fast == slow
    # Each shortcut was taken where it can be: skipping held jobs and summing need jobs without a runtime
    # limit, a reclaim a cohort.
    assert taken["summed"] > 0 or declare == "noisy"
    # Skipping a held job is a shortcut of a cycle over one queue, rare in a shared pool, where a hold also ends
    # as soon as the starving job holds quota (quota/reserve.py): it is taken in the partitioned pools.
    assert taken["held"] > 0 or declare == "noisy" or pool == "shared"
    assert taken["no_reclaim"] > 0 or pool == "partitioned"
    assert taken["skippable"] > 0
    assert taken["kept_shadow"] > 0
    assert taken["shapes"] > 0
    # (A queue alone in its pass, with no cohort, is ranked against nobody.)
    assert (taken["kept"] > 0 and taken["lent_only"] > 0) or pool == "partitioned"


def count_shortcuts(monkeypatch: pytest.MonkeyPatch, taken: dict[str, int]) -> None:
    held, summed = quota_next_head.held_like_another, quota_starvation._summed
    could = preemption_shortcuts.could_fit_nominal
    skippable, lent_only, kept = quota_cycle.skippable, quota_cycle.lent_only, quota_cycle.kept_head
    stand = quota_cycle.failures_stand
    shadow = quota_starvation.kept_shadow
    flavors_shared, holdable_shared = quota_fit.shaped_flavors, quota_fit.shaped_holdable

    def counted_flavors(state: Any, job: Any, find: Any) -> Any:
        found: list[int] = []
        answer = flavors_shared(state, job, lambda *args: found.append(1) or find(*args))
        taken["shapes"] += not found
        return answer

    def counted_holdable(state: Any, job: Any, flavors: Any, find: Any) -> Any:
        found: list[int] = []
        answer = holdable_shared(state, job, flavors, lambda *args: found.append(1) or find(*args))
        taken["shapes"] += not found
        return answer

    def counted_shadow(state: Any, group: Any, starving: Any, flavors: Any, now: float, find: Any) -> Any:
        found: list[int] = []

        def finding(*args: Any) -> Any:
            found.append(1)
            return find(*args)

        answer = shadow(state, group, starving, flavors, now, finding)
        taken["kept_shadow"] += not found
        return answer

    def counted_stand(*args: Any) -> bool:
        answer = stand(*args)
        taken["failures_stand"] += answer
        return answer

    def counted_lent_only(*args: Any) -> bool:
        answer = lent_only(*args)
        taken["lent_only"] += answer
        return answer

    def counted_kept(*args: Any) -> Any:
        answer = kept(*args)
        taken["kept"] += answer is not None
        return answer

    def counted_skippable(*args: Any) -> bool:
        answer = skippable(*args)
        taken["skippable"] += answer
        return answer

    def counted_held(*args: Any) -> bool:
        answer = held(*args)
        taken["held"] += answer
        return answer

    def counted_summed(jobs: list[QuotaJob]) -> list[quota_starvation.Charge]:
        sums = summed(jobs)
        taken["summed"] += len(sums) < len(jobs)
        return sums

    def counted_could(*args: Any) -> bool:
        answer = could(*args)
        taken["no_reclaim"] += not answer
        return answer

    monkeypatch.setattr(quota_next_head, "held_like_another", counted_held)
    monkeypatch.setattr(quota_starvation, "_summed", counted_summed)
    monkeypatch.setattr(quota_starvation, "kept_shadow", counted_shadow)
    monkeypatch.setattr(quota_fit, "shaped_flavors", counted_flavors)
    monkeypatch.setattr(quota_fit, "shaped_holdable", counted_holdable)
    monkeypatch.setattr(preemption_shortcuts, "could_fit_nominal", counted_could)
    monkeypatch.setattr(quota_cycle, "skippable", counted_skippable)
    monkeypatch.setattr(quota_cycle, "failures_stand", counted_stand)
    for module in (quota_cycle, quota_ranked):
        monkeypatch.setattr(module, "lent_only", counted_lent_only)
        monkeypatch.setattr(module, "kept_head", counted_kept)


@pytest.mark.parametrize("name", SCENARIO_FILES)
def test_scenario_decides_as_the_long_way(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Each scenario decides the same with every shortcut off."""
    scenario = load_scenario(SCENARIOS / name)
    fast = [msgspec.json.encode(e) for _, e in run_scenario(scenario, SCENARIOS).log]
    with monkeypatch.context() as m:
        no_shortcuts(m)
        slow = [msgspec.json.encode(e) for _, e in run_scenario(scenario, SCENARIOS).log]
    assert fast == slow


@pytest.mark.parametrize("seed", range(12))
def test_many_queue_world_decides_as_the_long_way(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Cohorts of many queues with guaranteed and borrowing limits, a tree, user limits, a budget, models,
    gangs, cancellations, nodes lost and back and quota lowered and raised mid-run: the same log with every
    shortcut off."""
    inputs = random_world(seed)
    with monkeypatch.context() as m:
        if seed % 2:  # the ranked heaps shed their stale entries on every cycle
            m.setattr(quota_ranked, "STALE_SLACK", -1000)
        fast = run_log(inputs)
    with monkeypatch.context() as m:
        no_shortcuts(m)
        slow = run_log(inputs)
    assert len(fast) > 1000
    assert fast == slow


@pytest.mark.parametrize("seed", [1, 2])
def test_synthetic_workload_decides_as_the_long_way(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """The replay benchmark's workload (queues without a cohort, three priorities, jobs arriving faster than
    they end): the same log with every shortcut off, and admissions that decide nothing left out on the way."""
    inputs = synthetic_inputs(DEFAULT_CLUSTER, 400, seed=seed)
    taken: dict[str, int] = {"held": 0, "summed": 0, "no_reclaim": 0, "skippable": 0, "lent_only": 0, "kept": 0,
                             "failures_stand": 0, "kept_shadow": 0,
                             "shapes": 0}
    with monkeypatch.context() as m:
        count_shortcuts(m, taken)
        fast = [msgspec.json.encode(e) for _, e in run_virtual(inputs, tick_s=5.0).log]
    with monkeypatch.context() as m:
        no_shortcuts(m)
        slow = [msgspec.json.encode(e) for _, e in run_virtual(inputs, tick_s=5.0).log]
    assert len(fast) > 4000
    assert fast == slow
    assert taken["failures_stand"] > 0
    assert taken["shapes"] > 0
