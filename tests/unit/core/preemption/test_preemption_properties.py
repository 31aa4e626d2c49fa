"""Preemption and recovery as properties of whole runs in virtual time.

Random worlds go through the whole decision pipeline (`libs.sim.pipeline.run_virtual`: admission, quota,
placement, preemption and the simulated executor): 2-4 nodes of 4-8 GPUs; 2-4 queues, some in one cohort
(named outright or formed by a parent queue) with random nominal quota, borrowing and lending limits,
sometimes a blast-radius budget or a reclaim grace, or (a third of the worlds) two queues that split the
cluster between them and lend each other everything; the default priority classes, sometimes with a minimum
runtime; 5-25 jobs submitted at random times over 200 s (random queue, class, 1-4 GPUs x 1-2 replicas,
5-120 s, sometimes checkpointing, sometimes scripted exit codes such as "137,0" or "1"); settings that make
preemption frequent (preempt_min_remaining_s 0) with a random slack; sometimes a cancellation, a node lost
(and back later) or a GPU failing (and healed later).

Checked on the log:
  1. no job is lost: every admitted job ends exactly once (finished, failed for good or cancelled), and
     nothing happens to it afterwards, but one its queue could never hold (admitted, as a change of policy could
     serve it), which waits told so and takes nothing;
  2. no preemption cycles: no two jobs evict each other, and no preemptor evicts the same job twice;
  3. no eviction beyond need: the victims of a decision hold at most the preemptor's demand plus the slack;
  4. blast-radius budgets hold in every window of each queue's eviction_window_s;
  5. no quota limit and no GPU is ever overrun (the log auditors);
  6. checkpoints: a preempted job that checkpoints saves exactly the work it has done, and its last run
     takes exactly what was left;
and the same inputs give the same log, byte for byte, in this process and in another.

The smallest worlds of the four bugs these properties found (all fixed meanwhile) are kept as regression tests
and as explicit examples of the properties they broke.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contracts import (
    RECLAIM,
    CancelJob,
    EventBase,
    GpuHealthChanged,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobSpec,
    JobStarted,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    QuotaDeferred,
    QuotaReserved,
    SchedulingSettings,
    SchedulingSettingsChanged,
    SubmitJob,
)
from contracts.codec import encode
from libs.audit.guarantees import check_safety
from libs.audit.guarantees.violation import RECLAIM_ONLY_WHILE_BORROWING
from libs.audit.invariants import overallocations
from libs.audit.quota_audit import quota_violations
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES, demand_milli
from libs.core.kernel.wait_reasons import INADMISSIBLE
from libs.sim.executor import SIM_EXIT_CODES
from libs.sim.pipeline import run_virtual
from tests.unit.builders import job, node

ROOT = Path(__file__).resolve().parents[4]
T0 = 1_000_000.0
CLASSES = tuple(c.name for c in DEFAULT_PRIORITY_CLASSES)
EXIT_CODES = ("137,0", "1", "137,137,137", "0,137")
ABS = 1e-6
# What happens to a job (its quota's release and late deferrals aside).
LIFECYCLE = (QuotaReserved, JobPlaced, JobStarted, JobCheckpointed, JobEvicted, JobFinished, JobFailed, JobCancelled)

Log = list[tuple[int, EventBase]]


class World:
    """The inputs of one run, and what the checks need to know about them (read back from the inputs)."""

    def __init__(self, inputs: list[EventBase]) -> None:
        self.inputs = inputs
        self.jobs = {e.job_id: e.spec for e in inputs if isinstance(e, SubmitJob)}
        self.queues = {e.queue.name: e.queue for e in inputs if isinstance(e, QueuePolicyChanged)}
        self.classes = {c.name: c for c in DEFAULT_PRIORITY_CLASSES}
        self.scheduling = SchedulingSettings()
        for e in inputs:
            if isinstance(e, PriorityClassesChanged):
                self.classes = {c.name: c for c in e.classes}
            elif isinstance(e, SchedulingSettingsChanged):
                self.scheduling = e.settings

    def __repr__(self) -> str:
        lines = [f"  {type(e).__name__}(ts=T0{e.ts - T0:+g}, {_fields(e)})" for e in self.inputs]
        return "World(\n" + "\n".join(lines) + "\n)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # what hypothesis prints for a failing example
        p.text(repr(self))


def _fields(e: EventBase) -> str:
    raw = msgspec.to_builtins(e)
    return ", ".join(f"{k}={v!r}" for k, v in raw.items() if k not in ("id", "ts", "source", "type"))


# --- random worlds ------------------------------------------------------------------------------------------


def seconds(lo: int, hi: int) -> st.SearchStrategy[float]:
    """Mostly half seconds (ties with each other and with the 1 s clock ticks), sometimes milliseconds (the
    executor keeps progress to the millisecond)."""
    return st.one_of(st.integers(2 * lo, 2 * hi).map(lambda n: n / 2),
                     st.integers(1000 * lo, 1000 * hi).map(lambda n: n / 1000))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    inputs: list[EventBase] = []
    n = 0

    def add(event_type: type[EventBase], ts: float, **fields: Any) -> None:
        nonlocal n
        n += 1
        inputs.append(event_type(id=f"in-{n}", ts=ts, source="test", **fields))

    nodes: list[NodeSpec] = [node(f"n{i}", draw(st.integers(4, 8))) for i in range(draw(st.integers(2, 4)))]
    for n_spec in nodes:
        add(NodeRegistered, T0 - 10, node=n_spec)

    scheduling = SchedulingSettings(preempt_min_remaining_s=0.0,
                                    preemption_slack_gpus=draw(st.integers(0, 8)),
                                    starvation_after_s=draw(st.sampled_from([None, 600.0, 60.0])))
    add(SchedulingSettingsChanged, T0 - 9, settings=scheduling, version=1)

    min_runtime = draw(st.sampled_from([0.0, 0.0, 10.0, 30.0]))
    classes = tuple(msgspec.structs.replace(c, min_runtime_s=min_runtime if draw(st.booleans()) else 0.0,
                                            retry_backoff_s=draw(st.sampled_from([1.0, 5.0, 10.0])))
                    for c in DEFAULT_PRIORITY_CLASSES)
    add(PriorityClassesChanged, T0 - 8, classes=classes, version=1)

    # Queues: a cohort "c" (named outright, or formed by a parent "org"), sometimes a queue on its own. A third
    # of the worlds are two queues that split the cluster's GPUs between them as nominal quota and lend each
    # other everything: quota, not capacity, binds there, and quota moves back and forth by reclaim.
    queues: list[QueueSpec] = []
    if draw(st.integers(0, 2)) == 0:
        total = sum(len(n_spec.gpus) for n_spec in nodes)
        n_queues = 2
        for i, nominal in enumerate((total // 2, total - total // 2)):
            queues.append(QueueSpec(name=f"q{i}", team=f"q{i}", cohort="c", nominal_gpus=nominal,
                                    reclaim_after_s=draw(st.sampled_from([0.0, 0.0, 5.0]))))
    else:
        n_queues = draw(st.integers(2, 4))
        by_parent = draw(st.booleans())
        in_cohort = draw(st.lists(st.sampled_from([True, True, False]), min_size=n_queues, max_size=n_queues))
        if by_parent and any(in_cohort):
            queues.append(QueueSpec(name="org", team="org"))
        for i in range(n_queues):
            budget = draw(st.sampled_from([None, None, 0, 2, 4, 8]))
            queues.append(QueueSpec(
                name=f"q{i}", team=f"q{i}", parent="org" if in_cohort[i] and by_parent else "",
                cohort="c" if in_cohort[i] and not by_parent else "",
                nominal_gpus=draw(st.sampled_from([None, 0, 2, 4, 6, 8, 12])),
                borrowing_limit_gpus=draw(st.sampled_from([None, None, 0, 2, 4])),
                lending_limit_gpus=draw(st.sampled_from([None, None, 0, 2, 4])),
                eviction_budget_gpus=budget,
                eviction_window_s=draw(st.sampled_from([30.0, 60.0, 3600.0])) if budget is not None else 3600.0,
                reclaim_after_s=draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 30.0])),
            ))
    for q in queues:
        add(QueuePolicyChanged, T0 - 7, queue=q, version=1)

    submits: list[tuple[float, str, JobSpec]] = []
    n_jobs = draw(st.integers(5, 25))
    for j in range(n_jobs):
        qname = f"q{draw(st.integers(0, n_queues - 1))}"
        labels = {SIM_EXIT_CODES: draw(st.sampled_from(EXIT_CODES))} if draw(st.integers(0, 4)) == 0 else {}
        spec = (job(team=qname, queue=qname).gpus(draw(st.integers(1, 4))).replicas(draw(st.sampled_from([1, 1, 2])))
                .priority(draw(st.sampled_from(CLASSES)))
                .having(duration_s=draw(seconds(5, 120)),
                        checkpoint_interval_s=draw(st.sampled_from([None, None, 5.0, 20.0])), labels=labels).spec)
        submits.append((T0 + draw(seconds(0, 200)), f"j{j:02d}", spec))
    for ts, job_id, spec in sorted(submits, key=lambda s: s[0]):
        add(SubmitJob, ts, job_id=job_id, spec=spec)

    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        add(CancelJob, T0 + draw(seconds(0, 250)), job_id=f"j{draw(st.integers(0, n_jobs - 1)):02d}")

    trouble = draw(st.sampled_from(["none", "none", "node", "gpu"]))
    if trouble != "none":
        which = draw(st.integers(0, len(nodes) - 1))
        at = T0 + draw(seconds(0, 150))
        back = at + draw(seconds(1, 120))
        if trouble == "node":
            add(NodeLost, at, node=nodes[which].name, reason="heartbeat_missed")
            add(NodeRegistered, back, node=nodes[which])
        else:
            index = draw(st.integers(0, len(nodes[which].gpus) - 1))
            add(GpuHealthChanged, at, node=nodes[which].name, index=index, healthy=False, reason="xid")
            add(GpuHealthChanged, back, node=nodes[which].name, index=index, healthy=True, reason="recovered")

    inputs.sort(key=lambda e: e.ts)  # stable: same-time inputs keep their order
    return World(inputs)


def final_event(world: World, history: list[EventBase]) -> list[int]:
    """Where a job's history ends it for good: finished, cancelled, or failed without a retry to come (killed
    by a signal, or an exit code the job lists, runs again up to its class's max_retries)."""
    spec = world.jobs[next(e.job_id for e in history if isinstance(e, SubmitJob | JobAdmitted))]
    finals, failures = [], 0
    for i, e in enumerate(history):
        if isinstance(e, JobFinished | JobCancelled):
            finals.append(i)
        elif isinstance(e, JobFailed):
            failures += 1
            retryable = e.exit_code >= 128 or e.exit_code in spec.retry_exit_codes
            if failures > world.classes[spec.priority].max_retries or not retryable:
                finals.append(i)
    return finals


def unfinished(world: World, log: Log) -> list[str]:
    admitted = sorted(e.job_id for _, e in log if isinstance(e, JobAdmitted))
    return [j for j in admitted if not final_event(world, of_job(log, j))]


_RUNS: dict[bytes, Log] = {}


def run(world: World) -> Log:
    key = b"\x1e".join(encode(e) for e in world.inputs)
    if key not in _RUNS:
        if len(_RUNS) > 64:
            _RUNS.clear()
        _RUNS[key] = run_virtual(world.inputs, tick_s=1.0).log
    return _RUNS[key]


def of_job(log: Log, job_id: str) -> list[EventBase]:
    return [e for _, e in log if getattr(e, "job_id", None) == job_id]


# --- the properties -----------------------------------------------------------------------------------------


def check_no_job_lost(world: World, log: Log) -> None:
    admitted = {e.job_id for _, e in log if isinstance(e, JobAdmitted)}
    rejected = {e.job_id for _, e in log if isinstance(e, JobRejected)}
    assert admitted | rejected == set(world.jobs), "every submission is admitted or rejected"
    for job_id in sorted(admitted):
        history = of_job(log, job_id)
        finals = final_event(world, history)
        kinds = [type(e).__name__ for e in history]
        if not finals and waits_for_policy(history):
            continue  # its queue could never hold it as the policy is now: it waits, holding nothing, told so
        assert finals, f"{job_id} was admitted and never ended: {kinds}"
        assert len(finals) == 1, f"{job_id} ended {len(finals)} times: {kinds}"
        after = [type(e).__name__ for e in history[finals[0] + 1:] if isinstance(e, LIFECYCLE)]
        if isinstance(history[finals[0]], JobCancelled):
            # A running job cancelled: its executor reports it gone; nothing starts again.
            assert after in ([], ["JobEvicted"]), f"{job_id} went on after its cancellation: {after}"
        else:
            assert not after, f"{job_id} went on after it ended: {after}"


def waits_for_policy(history: list[EventBase]) -> bool:
    """Was the job told its queue could never hold it (a world's policy never changes after its start), and did
    nothing else happen to it: it never took quota?"""
    told = [e.code for e in history if isinstance(e, QuotaDeferred)]
    return bool(told) and told[-1] in INADMISSIBLE and not any(isinstance(e, LIFECYCLE) for e in history)


def check_no_mutual_evictions(log: Log) -> None:
    """No two jobs evict each other, in either order, at any time."""
    evicted_by: dict[str, set[str]] = {}  # preemptor -> every job it evicted
    for _, e in log:
        if isinstance(e, PreemptionDecided):
            evicted_by.setdefault(e.preemptor_id, set()).update(v.job_id for v in e.victims)
    for a, victims in sorted(evicted_by.items()):
        for b in sorted(victims):
            assert a not in evicted_by.get(b, set()), f"{a} evicted {b} and {b} evicted {a}"


def check_no_victim_evicted_twice_by_one_preemptor(log: Log) -> None:
    """A preemptor evicts a job at most once while its run lasts, however often the victim runs: once the
    preemptor's own run is over (evicted, or failed to run again), the room it took is gone, and a victim that
    borrows that room again may be taken again (else its lender waits for good)."""
    evicted_by: dict[str, set[str]] = {}  # preemptor -> every job it evicted since its run last ended
    for _, e in log:
        if isinstance(e, JobEvicted | JobFailed | JobFinished):
            evicted_by.pop(e.job_id, None)
        elif isinstance(e, PreemptionDecided):
            pairs = evicted_by.setdefault(e.preemptor_id, set())
            for v in e.victims:
                assert v.job_id not in pairs, f"{e.preemptor_id} evicted {v.job_id} again at T0{e.ts - T0:+g}"
                pairs.add(v.job_id)


def check_eviction_within_need(world: World, log: Log) -> None:
    """A preemptor evicts in its own queue at most its need plus the slack. What a reclaim takes from other
    queues is bounded otherwise: whole jobs of a queue only while it borrows (a borrower's job larger than the
    need is taken all the same, or it would keep lent quota for ever), which the checker's
    reclaim_only_while_borrowing judges."""
    slack = world.scheduling.preemption_slack_gpus * 1000
    for _, d in log:
        if isinstance(d, PreemptionDecided):
            own = world.jobs[d.preemptor_id].queue
            taken = sum(v.gpu_milli for v in d.victims if not (v.reason == RECLAIM and v.queue != own))
            need = demand_milli(world.jobs[d.preemptor_id])
            assert taken <= need + slack, f"{d.preemptor_id} (needs {need}) evicted {taken} with slack {slack}"
    assert [v for v in check_safety(log) if v.guarantee == RECLAIM_ONLY_WHILE_BORROWING] == []


def check_budgets(world: World, log: Log) -> None:
    chosen: dict[str, list[tuple[float, int]]] = {}
    for _, d in log:
        if isinstance(d, PreemptionDecided):
            for v in d.victims:
                if v.reason != "reclaim":  # a reclaim of lent quota is outside the budget
                    chosen.setdefault(v.queue, []).append((d.ts, v.gpu_milli))
    for queue, evictions in chosen.items():
        spec = world.queues[queue]
        if spec.eviction_budget_gpus is None:
            continue
        for end, _ in evictions:  # every window (end - window, end] that ends at an eviction
            inside = sum(m for t, m in evictions if end - spec.eviction_window_s < t <= end)
            assert inside <= spec.eviction_budget_gpus * 1000, (
                f"{queue} lost {inside / 1000:g} GPUs in the {spec.eviction_window_s:g} s up to {end - T0:g}, "
                f"budget {spec.eviction_budget_gpus}")


def check_audits(log: Log) -> None:
    assert quota_violations(e for _, e in log) == []
    assert overallocations(log) == []


def check_checkpoints(world: World, log: Log) -> None:
    for job_id, spec in world.jobs.items():
        saved = 0.0  # work the next run resumes from
        started: float | None = None
        for e in of_job(log, job_id):
            if isinstance(e, JobPlaced):
                started = None
            elif isinstance(e, JobStarted):
                started = e.ts
            elif isinstance(e, JobEvicted):
                ran = 0.0 if started is None else e.ts - started
                if e.reason == "preempted" and spec.checkpoint_interval_s is not None:
                    assert e.progress_s == pytest.approx(saved + ran, abs=ABS), (
                        f"{job_id} preempted at {e.ts - T0:g}: saved {e.progress_s}, worked {saved + ran}")
                    saved = e.progress_s
                elif spec.checkpoint_interval_s is not None and e.reason != "cancelled":
                    # Lost with its node or GPU: only its last periodic checkpoint.
                    assert saved - ABS <= e.progress_s <= saved + ran + ABS
                    saved = e.progress_s
                else:
                    assert e.progress_s == pytest.approx(saved, abs=ABS)
                started = None
            elif isinstance(e, JobCheckpointed):
                assert spec.checkpoint_interval_s is not None
            elif isinstance(e, JobFailed):
                saved, started = 0.0, None
            elif isinstance(e, JobFinished):
                assert started is not None, f"{job_id} finished without a start"
                assert spec.duration_s is not None
                assert e.ts - started == pytest.approx(spec.duration_s - saved, abs=ABS), (
                    f"{job_id}: last run {e.ts - started:g} s, duration {spec.duration_s:g} s, saved {saved:g} s")


# --- worlds the properties found (four bugs, fixed meanwhile in 5873158 and d1dc7d7) -----------------------


def _world(*events: tuple[type[EventBase], float, dict[str, Any]]) -> World:
    return World([kind(id=f"in-{i}", ts=T0 + at, source="test", **fields)
                  for i, (kind, at, fields) in enumerate(events)])


def _job(queue: str, gpus: int, priority: str, duration_s: float, replicas: int = 1, **fields: Any) -> JobSpec:
    return (job(team=queue, queue=queue).gpus(gpus).replicas(replicas).priority(priority)
            .having(duration_s=duration_s, **fields).spec)


def _setup(*queues: QueueSpec, nodes: tuple[NodeSpec, ...]) -> list[tuple[type[EventBase], float, dict[str, Any]]]:
    return [*((NodeRegistered, -3, {"node": n}) for n in nodes),
            (SchedulingSettingsChanged, -2, {"settings": SchedulingSettings(preempt_min_remaining_s=0.0),
                                             "version": 1}),
            *((QueuePolicyChanged, -1, {"queue": q, "version": i + 1}) for i, q in enumerate(queues))]


def reclaim_thrash_world() -> World:
    """One 8-GPU node; a cohort of a lender (nominal 6, lends 2) and a borrower (nominal 0, borrows up to 2).
    The lender runs an urgent 4-GPU job; "big" (experiment, 4 GPUs) waits: it must borrow and nothing is lent.
    The borrower's "d" borrows the lender's 2 lendable GPUs. Then "ant" (experiment, 2 GPUs) arrives: within
    the lender's nominal, but lent out; preemption reclaims d for it."""
    return _world(
        *_setup(QueueSpec(name="lender", team="lender", cohort="c", nominal_gpus=6, lending_limit_gpus=2),
                QueueSpec(name="borrower", team="borrower", cohort="c", nominal_gpus=0, borrowing_limit_gpus=2),
                nodes=(node("a", 8),)),
        (SubmitJob, 0, {"job_id": "urgent", "spec": _job("lender", 4, "urgent", 100.0)}),
        (SubmitJob, 1, {"job_id": "big", "spec": _job("lender", 4, "experiment", 10.0)}),
        (SubmitJob, 2, {"job_id": "d", "spec": _job("borrower", 2, "training", 50.0)}),
        (SubmitJob, 3, {"job_id": "ant", "spec": _job("lender", 2, "experiment", 10.0)}),
    )


def preempted_back_world() -> World:
    """Two cohort queues of nominal 4 on 16 GPUs. q1 runs x (4 GPUs) and b (batch, 2 GPUs, borrowed; its first
    run to end fails with 137). a (q0, 4 GPUs) reclaims b. x ends, b runs again; c (q1, urgent, 4 GPUs) evicts
    b within q1. c ends, b runs, fails and backs off for 10 s; meanwhile e (q0, urgent, 4 GPUs) borrows all of
    q1's quota. b comes back under q1's nominal and reclaims from q0, where a is the cheapest victim."""
    return _world(
        *_setup(QueueSpec(name="q0", team="q0", cohort="c", nominal_gpus=4),
                QueueSpec(name="q1", team="q1", cohort="c", nominal_gpus=4), nodes=(node("n0", 8), node("n1", 8))),
        (SubmitJob, 0, {"job_id": "x", "spec": _job("q1", 4, "training", 20.0)}),
        (SubmitJob, 0, {"job_id": "b", "spec": _job("q1", 2, "batch", 10.0, labels={SIM_EXIT_CODES: "137,0"})}),
        (SubmitJob, 1, {"job_id": "a", "spec": _job("q0", 4, "experiment", 200.0)}),
        (SubmitJob, 21, {"job_id": "c", "spec": _job("q1", 4, "urgent", 10.0)}),
        (SubmitJob, 42, {"job_id": "e", "spec": _job("q0", 4, "urgent", 100.0)}),
    )


def stolen_quota_world() -> World:
    """Nodes of 6 and 5 GPUs; a cohort of q0 (nominal 5) and q1 (nominal 6) lending each other everything. q1
    runs low (batch, 2x3 GPUs) and other (urgent, 2 GPUs, 30 s): 8 of the cohort's 11. big (q0, training,
    2x4) waits: it must borrow 3 and only 3 are idle. vip (q1, production-inference, 2x3) arrives, and
    evicts low within q1."""
    return _world(
        *_setup(QueueSpec(name="q0", team="q0", cohort="c", nominal_gpus=5),
                QueueSpec(name="q1", team="q1", cohort="c", nominal_gpus=6), nodes=(node("a", 6), node("b", 5))),
        (SubmitJob, 0, {"job_id": "low", "spec": _job("q1", 3, "batch", 100.0, replicas=2)}),
        (SubmitJob, 0, {"job_id": "other", "spec": _job("q1", 2, "urgent", 30.0)}),
        (SubmitJob, 1, {"job_id": "big", "spec": _job("q0", 4, "training", 10.0, replicas=2)}),
        (SubmitJob, 2, {"job_id": "vip", "spec": _job("q1", 3, "production-inference", 10.0, replicas=2)}),
    )


def decisions(log: Log) -> list[tuple[float, str, list[str]]]:
    return [(e.ts - T0, e.preemptor_id, [v.job_id for v in e.victims]) for _, e in log
            if isinstance(e, PreemptionDecided)]


def reserved_at(log: Log, at: float) -> list[str]:
    return [e.job_id for _, e in log if isinstance(e, QuotaReserved) and e.ts == T0 + at]


def test_quota_a_reclaim_frees_goes_to_the_preemptor_not_back_to_its_victim() -> None:
    """Once d was evicted on every clock tick until the urgent job ended (99 decisions): the quota its eviction
    freed went straight back to it, as ant waited behind big, a job of its priority that must borrow."""
    log = run(reclaim_thrash_world())
    assert reserved_at(log, 3) == ["ant"]
    assert decisions(log) == [(3.0, "ant", ["d"])]


def test_a_job_evicted_by_two_preemptors_never_preempts_the_first_back() -> None:
    """Once b, evicted by a and then by c, evicted a at 51 s: only a victim's latest preemptor was remembered.
    Now b reclaims e's borrowed quota, and e, of higher priority, evicts a within q0."""
    log = run(preempted_back_world())
    assert decisions(log) == [(1.0, "a", ["b"]), (21.0, "c", ["b"]), (51.0, "b", ["e"]), (51.0, "e", ["a"])]
    check_no_mutual_evictions(log)


def test_quota_a_within_queue_eviction_frees_goes_to_the_preemptor() -> None:
    """Once big (q0) took the quota vip's eviction of low freed (the cohort pass ranked it first on fair share),
    then waited for the capacity placement held for vip, which waited for big's quota: a deadlock until the
    nomination lapsed 120 s later, and then vip evicted big. vip cannot be preempted, so it may use only q1's
    nominal 6: it evicts low and other; the room low frees first is held for it (big waits), and other, of
    lower priority than vip but allowed to borrow, gets its quota back once vip has its own."""
    log = run(stolen_quota_world())
    assert reserved_at(log, 2) == ["vip", "other"]
    assert decisions(log)[0] == (2.0, "vip", ["low", "other"])
    assert not [d for d in decisions(log) if d[1] == "vip" and "big" in d[2]]


def test_the_virtual_clock_runs_on_while_a_nomination_may_still_release_waiting_jobs() -> None:
    """Once run_virtual stopped when nothing was scheduled, running or backing off, though jobs still waited for
    a nomination to lapse: the stolen-quota world ended at 30 s with big and vip never run."""
    world = stolen_quota_world()
    assert unfinished(world, run_virtual(world.inputs, tick_s=1.0).log) == []


# --- the properties, on random worlds -----------------------------------------------------------------------

PROPERTY = settings(max_examples=70, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@example(world=stolen_quota_world())
@given(worlds())
def test_no_admitted_job_is_lost(world: World) -> None:
    check_no_job_lost(world, run(world))


@PROPERTY
@example(world=preempted_back_world())
@given(worlds())
def test_no_two_jobs_evict_each_other(world: World) -> None:
    check_no_mutual_evictions(run(world))


@PROPERTY
@example(world=reclaim_thrash_world())
@given(worlds())
def test_no_preemptor_evicts_the_same_job_twice(world: World) -> None:
    check_no_victim_evicted_twice_by_one_preemptor(run(world))


@PROPERTY
@given(worlds())
def test_no_eviction_beyond_need_plus_slack(world: World) -> None:
    check_eviction_within_need(world, run(world))


@PROPERTY
@given(worlds())
def test_eviction_budgets_hold_in_every_window(world: World) -> None:
    check_budgets(world, run(world))


@PROPERTY
@given(worlds())
def test_quota_and_capacity_are_never_overrun(world: World) -> None:
    check_audits(run(world))


@PROPERTY
@given(worlds())
def test_checkpoints_save_the_work_done_and_the_last_run_does_the_rest(world: World) -> None:
    check_checkpoints(world, run(world))


# --- determinism --------------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(worlds())
def test_the_same_inputs_give_the_same_log_byte_for_byte(world: World) -> None:
    first = [encode(e) for _, e in run_virtual(world.inputs, tick_s=1.0).log]
    second = [encode(e) for _, e in run_virtual(world.inputs, tick_s=1.0).log]
    assert first == second


# Another process, another string hash seed: set and dict orders that leak into decisions would show.
_ELSEWHERE = """
import hashlib, sys
from contracts.codec import decode, encode
from libs.sim.pipeline import run_virtual
for line in sys.stdin.buffer:
    inputs = [decode(raw) for raw in line.split(b"\\x1e") if raw.strip()]
    log = run_virtual(inputs, tick_s=1.0).log
    print(hashlib.sha256(b"\\n".join(encode(e) for _, e in log)).hexdigest())
"""


@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(worlds(), min_size=3, max_size=3))
def test_another_process_with_another_hash_seed_logs_the_same_bytes(some: list[World]) -> None:
    some = [*some, reclaim_thrash_world(), stolen_quota_world(), preempted_back_world()]
    here = [hashlib.sha256(b"\n".join(encode(e) for _, e in run_virtual(w.inputs, tick_s=1.0).log)).hexdigest()
            for w in some]
    lines = b"".join(b"\x1e".join(encode(e) for e in w.inputs) + b"\n" for w in some)
    seed = "4242" if os.environ.get("PYTHONHASHSEED") != "4242" else "4343"
    there = subprocess.run([sys.executable, "-c", _ELSEWHERE], input=lines, capture_output=True, check=True,
                           cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60).stdout.split()
    assert [h.decode() for h in there] == here
