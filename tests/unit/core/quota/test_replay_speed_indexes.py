"""The indexes the deciders keep for speed always agree with the state they index: checked after every
event of a varied history (cohorts, reclaim grace, budgets, user limits, a change of priority classes)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from contracts import (
    EventBase,
    JobSpec,
    NodeRegistered,
    PriorityClass,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    SchedulingSettings,
    SchedulingSettingsChanged,
    SubmitJob,
)
from libs.core.kernel.decider import Trigger, run_decider
from libs.core.kernel.wait_reasons import BUDGET_WAITS
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.preemption.state import PLACEMENT
from libs.core.quota.decider import QuotaDecider
from libs.nodes.sim import load_cluster_csv
from libs.runtime.settings import DEFAULT_CLUSTER
from libs.sim.pipeline import run_virtual


def history(seed: int = 3, jobs: int = 220) -> list[tuple[int, EventBase]]:
    rng = random.Random(seed)
    inputs: list[EventBase] = [NodeRegistered(id=f"node-{i}", ts=0.0, source="node-telemetry", node=n)
                               for i, n in enumerate(load_cluster_csv(DEFAULT_CLUSTER))]
    inputs.append(SchedulingSettingsChanged(id="settings", ts=0.0, source="operator", version=1,
                                            settings=SchedulingSettings(starvation_after_s=90.0)))
    queues = [QueueSpec(name="org", team="org"),
              QueueSpec(name="a", team="a", parent="org", nominal_gpus=12, borrowing_limit_gpus=6,
                        reclaim_after_s=20.0),
              QueueSpec(name="b", team="b", parent="org", nominal_gpus=10, lending_limit_gpus=6, user_max_gpus=6),
              QueueSpec(name="c", team="c", parent="org", nominal_gpus=8, budget_gpu_hours=0.5, budget_period="day",
                        over_budget="wait"),
              QueueSpec(name="d", team="d", nominal_gpus=6)]
    inputs += [QueuePolicyChanged(id=f"q-{q.name}", ts=0.0, source="operator", version=1, queue=q) for q in queues]
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(1.5)
        team = rng.choice("abcd")
        inputs.append(SubmitJob(id=f"s-{i}", ts=t, source="api", job_id=f"job-{i}", spec=JobSpec(
            team=team, queue=team, user=f"u{rng.randrange(3)}", gpus=rng.choice([1, 1, 2, 4]),
            gpu_milli=rng.choice([0, 0, 0, 500]), priority=rng.choice(["batch", "training", "urgent"]),
            duration_s=rng.uniform(10, 150))))
        if i == jobs // 2:
            inputs.append(PriorityClassesChanged(id="classes", ts=t, source="operator", version=2, classes=(
                PriorityClass(name="urgent", value=300), PriorityClass(name="training", value=500),
                PriorityClass(name="batch", value=100))))
    return run_virtual(inputs, tick_s=5.0, horizon_s=t + 600.0).log


def check_preemption(d: PreemptionDecider) -> None:
    s = d.state
    heads: dict[str, list[tuple[int, str]]] = {}
    grace: dict[str, list[tuple[float, str]]] = {}
    for job_id, w in s.waiting.items():
        spec = s.specs[job_id]
        heads.setdefault(spec.queue, []).append((-d.policy.priority_of(spec), job_id))
        if w.code != PLACEMENT and not w.grace_checked:
            grace.setdefault(spec.queue, []).append((w.since, job_id))
    assert s.heads == {q: sorted(k) for q, k in heads.items()}
    assert s.grace == {q: sorted(k) for q, k in grace.items()}
    by_queue: dict[str, dict[str, object]] = {}
    prios: dict[str, dict[int, int]] = {}
    for job_id, run in s.running.items():
        by_queue.setdefault(run.queue, {})[job_id] = run
        prios.setdefault(run.queue, {})[run.priority] = prios.get(run.queue, {}).get(run.priority, 0) + 1
    assert s.by_queue == by_queue
    assert s.running_priorities == prios


def check_quota(d: QuotaDecider) -> None:
    assert set(d.state.budget_deferred) == {j for j, code in d.state.deferred.items() if code in BUDGET_WAITS}
    for queue, waits in d.state.by_wait_in.items():
        assert waits == [k for k in d.state.by_wait if d.state.jobs[k[2]].queue == queue]
    assert sum(len(w) for w in d.state.by_wait_in.values()) == len(d.state.by_wait)


def _preemption_state(d: PreemptionDecider) -> object:
    return d.snapshot(), d.state.changed, d.chain.head


def _quota_state(d: QuotaDecider) -> object:
    return d.snapshot(), sorted(d.state.deferred.items()), d.chain.head


def _placement_state(d: PlacementDecider) -> object:
    return d.snapshot(), sorted(d.state.deferred.items()), d.state.recharged, d.chain.head


@pytest.mark.parametrize(("make", "state"), [(PreemptionDecider, _preemption_state), (QuotaDecider, _quota_state),
                                                 (PlacementDecider, _placement_state)])
def test_a_decider_reacts_only_to_what_it_says(make: Callable[[], Any], state: Callable[[Any], object]) -> None:
    """Replay folds, without reacting, the inputs outside a decider's reacts_to: react must answer [] to them
    and change nothing."""
    decider = make()
    accepted, reacts = tuple(decider.input_types()), decider.reacts_to()
    quiet = 0
    for seq, event in history(seed=5, jobs=120):
        if not isinstance(event, accepted):
            continue
        decider.fold(event)
        if isinstance(event, reacts):
            decider.react(Trigger(event, seq))
            continue
        before = state(decider)
        assert decider.react(Trigger(event, seq)) == []
        assert state(decider) == before
        quiet += 1
    assert quiet > 100


def test_indexes_follow_the_state() -> None:
    log = history()
    assert any(type(e).__name__ == "PreemptionDecided" for _, e in log)
    preemption, quota = PreemptionDecider(), QuotaDecider()
    for decider, check in ((preemption, check_preemption), (quota, check_quota)):
        accepted = tuple(decider.input_types())
        for seq, event in log:
            if isinstance(event, accepted):
                run_decider(decider, event, seq)
                check(decider)  # type: ignore[arg-type]
