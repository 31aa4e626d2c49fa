"""An executor's late word on an earlier run changes nothing: every report names its run (the JobPlaced that
started it), and a report about a run that is over neither releases the current run's quota or GPUs nor ends
the job. A report that names no run (logs written before reports named theirs) is taken as it always was."""

from __future__ import annotations

import msgspec
import pytest

from contracts import (
    EventBase,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PreemptionDecided,
    QueuePolicyChanged,
    ReplicaPlacement,
    SubmitJob,
)
from contracts.codec import encode
from libs.audit.replay import replay
from libs.core.accounting.ledger import Ledger
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import derived_id, run_decider
from libs.core.kernel.runs import NO_RUN, RUN_REPORTS, CurrentRuns
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from libs.reports.inference import ServiceTimeline, ServiceTracker
from libs.runtime.state_image import capture, restore
from libs.sim.executor import SOURCE as SIM_EXECUTOR
from libs.sim.live_executor import SimExecutor
from libs.sim.pipeline import run_virtual
from services.agent.executor import ProcessExecutor
from services.node_telemetry.roster import NodeRoster
from tests.unit.builders import EventFeed, brief, job, node, of, pipeline, queue

JOB = "j"


def deciders(feed: EventFeed) -> tuple[AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider]:
    admission, quota, placement, preemption = feed.deciders
    assert isinstance(admission, AdmissionDecider) and isinstance(quota, QuotaDecider)
    assert isinstance(placement, PlacementDecider) and isinstance(preemption, PreemptionDecider)
    return admission, quota, placement, preemption


def ledger_of(feed: EventFeed) -> Ledger:
    assert feed.ledger is not None
    return feed.ledger


def placed_twice() -> tuple[EventFeed, JobPlaced, JobPlaced]:
    """A 2-GPU job placed (run 1), started, evicted with its node's GPU lost, placed again (run 2), started."""
    feed = pipeline(ledger=True)
    feed.at(900.0).queues(queue("ml-train", "ml", 8))
    feed.nodes(node("a", 8))
    [first] = of(feed.at(1000.0).submit(JOB, job().gpus(2).having(duration_s=600.0)), JobPlaced)
    assert feed.at(1010.0).send(JobStarted, job_id=JOB, run=first.id) == []
    requeued = feed.at(1020.0).send(JobEvicted, job_id=JOB, run=first.id, reason="gpu_removed")
    assert brief(requeued) == [("QuotaReleased", JOB), ("QuotaReserved", JOB), ("JobPlaced", JOB)]
    [second] = of(requeued, JobPlaced)
    assert second.id != first.id
    assert feed.at(1030.0).send(JobStarted, job_id=JOB, run=second.id) == []
    return feed, first, second


def assert_still_running(feed: EventFeed, second: JobPlaced) -> None:
    admission, quota, placement, preemption = deciders(feed)
    assert quota.state.jobs[JOB].state == "reserved" and JOB in quota.state.reserved["ml-train"]
    assert placement.state.placed[JOB] == second.placements
    assert placement.cluster.nodes["a"].gpus[0].free_milli == 0  # its GPUs stay allocated
    assert JOB in preemption.state.running
    assert admission.state.jobs[JOB] == "admitted"
    view = ledger_of(feed).state.jobs[JOB]
    assert (view.state, view.phase, view.placements, view.finished_at) == ("running", "running", second.placements,
                                                                          None)
    assert ledger_of(feed).node_view("a").allocated_gpus == 2.0
    assert ledger_of(feed).state.usage.started_at(JOB) == 1030.0


def assert_ended(feed: EventFeed, decided: list[EventBase]) -> None:
    admission, quota, placement, preemption = deciders(feed)
    assert brief(decided) == [("QuotaReleased", JOB)]
    assert JOB not in quota.state.jobs and JOB not in placement.state.placed and JOB not in preemption.state.running
    assert placement.cluster.nodes["a"].gpus[0].free_milli == 1000
    assert admission.state.jobs[JOB] == "succeeded"
    view = ledger_of(feed).state.jobs[JOB]
    assert (view.state, view.placements) == ("succeeded", ())
    assert ledger_of(feed).node_view("a").allocated_gpus == 0.0


@pytest.mark.parametrize("late", [
    pytest.param((JobFinished, {}), id="a finish"),
    pytest.param((JobFailed, {"exit_code": 1, "reason": "exit_code"}), id="a failure"),
    pytest.param((JobEvicted, {"reason": "node_lost"}), id="an eviction"),
])
def test_a_late_report_of_the_first_run_leaves_the_second_running(late: tuple[type[EventBase], dict]) -> None:
    feed, first, second = placed_twice()
    kind, fields = late
    assert feed.at(1040.0).send(kind, job_id=JOB, run=first.id, **fields) == []
    assert_still_running(feed, second)
    # The run it is about is over: the ledger charges nothing more for it (run 1's 10 s x 2 GPUs only).
    assert ledger_of(feed).state.jobs[JOB].gpu_seconds == 20.0


def test_the_same_report_naming_the_current_run_ends_it() -> None:
    feed, first, second = placed_twice()
    feed.at(1040.0).send(JobFinished, job_id=JOB, run=first.id)
    assert_ended(feed, feed.at(1050.0).send(JobFinished, job_id=JOB, run=second.id))
    assert ledger_of(feed).state.jobs[JOB].gpu_seconds == 20.0 + 40.0


def test_a_report_naming_no_run_is_about_the_current_run_as_before() -> None:
    feed, _, _ = placed_twice()
    assert_ended(feed, feed.at(1050.0).send(JobFinished, job_id=JOB))


def test_a_late_report_is_not_taken_by_a_decider_restored_from_its_state_image() -> None:
    feed, first, second = placed_twice()
    _, quota, placement, _ = deciders(feed)
    image = capture({"quota": quota, "placement": placement})
    quota_again, placement_again = QuotaDecider(), PlacementDecider()
    restore({"quota": quota_again, "placement": placement_again}, image)
    late = JobFinished(id="late", ts=1040.0, source=SIM_EXECUTOR, job_id=JOB, run=first.id)
    assert run_decider(quota_again, late, 100) == [] and run_decider(placement_again, late, 100) == []
    assert quota_again.state.jobs[JOB].state == "reserved" and placement_again.state.placed[JOB] == second.placements
    current = JobFinished(id="now", ts=1050.0, source=SIM_EXECUTOR, job_id=JOB, run=second.id)
    assert brief(run_decider(quota_again, current, 101)) == [("QuotaReleased", JOB)]


def test_the_book_between_runs_and_after_the_last() -> None:
    runs = CurrentRuns()

    def placed(run: str) -> JobPlaced:
        return JobPlaced(id=run, ts=0.0, source="placement", job_id=JOB, placements=())

    finished = JobFinished(id="f1", ts=0.0, source="x", job_id=JOB, run="r1")
    assert not runs.is_stale(finished)  # a job it never saw placed: taken as it always was
    runs.fold(placed("r1"))
    assert runs.run_of(JOB) == "r1" and not runs.is_stale(finished)
    evicted = JobEvicted(id="e1", ts=0.0, source="x", job_id=JOB, run="r1", reason="preempted")
    runs.fold(evicted)
    # Requeued, not yet placed again: the finish that raced the eviction is about a run that is over.
    assert runs.run_of(JOB) == NO_RUN and runs.is_stale(finished)
    assert not runs.is_stale(JobFinished(id="f0", ts=0.0, source="x", job_id=JOB))
    runs.fold(placed("r2"))
    assert runs.is_stale(finished) and runs.is_stale(evicted)
    assert not runs.is_stale(JobFinished(id="f2", ts=0.0, source="x", job_id=JOB, run="r2"))
    runs.fold(JobFinished(id="f2", ts=0.0, source="x", job_id=JOB, run="r2"))
    assert runs.run_of(JOB) is None  # over for good: forgotten


T0 = 1_000_000.0


def preempted_and_resumed() -> list[tuple[int, EventBase]]:
    """A job that checkpoints, preempted by an urgent one and resumed, in virtual time."""
    inputs: list[EventBase] = [
        NodeRegistered(id="n", ts=T0 - 2, source="node-telemetry", node=node("a", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", 4), version=1),
        SubmitJob(id="s1", ts=T0, source="test", job_id="long",
                  spec=job().gpus(4).priority("batch").having(duration_s=100.0, checkpoint_interval_s=30.0).spec),
        SubmitJob(id="s2", ts=T0 + 40, source="test", job_id="urgent",
                  spec=job().gpus(4).priority("urgent").having(duration_s=10.0).spec),
    ]
    return run_virtual(inputs, tick_s=1.0).log


def test_the_simulated_executor_names_the_run_of_every_report() -> None:
    log = preempted_and_resumed()
    assert any(isinstance(e, PreemptionDecided) for _, e in log)
    current: dict[str, str] = {}
    runs_reported: dict[str, list[tuple[str, str]]] = {}
    for _, event in log:
        if isinstance(event, JobPlaced):
            current[event.job_id] = event.id
        elif isinstance(event, RUN_REPORTS):
            assert event.source == SIM_EXECUTOR and event.run == current[event.job_id]
            runs_reported.setdefault(event.job_id, []).append((type(event).__name__, event.run))
    first, second = (e.id for _, e in log if isinstance(e, JobPlaced) and e.job_id == "long")
    assert runs_reported["long"] == [("JobStarted", first), ("JobCheckpointed", first), ("JobEvicted", first),
                                     ("JobStarted", second), ("JobFinished", second)]
    # Replayed, every decider decides the same again, byte for byte.
    report = replay((seq, encode(e)) for seq, e in log)
    assert report.ok and report.decisions_checked > 0


def replayed(events: list[EventBase]) -> tuple[list[bytes], Ledger, list[list[bytes]]]:
    """The recorded log's events replayed: every decider's state (snapshot) and a ledger after them, and per
    event what the deciders decided about it (their position in the log and chain links left out)."""
    world = [AdmissionDecider(), QuotaDecider(), PlacementDecider(), PreemptionDecider()]
    ledger, decided = Ledger(), []
    for seq, event in enumerate(events, start=1):
        ledger.fold(event, seq)
        decided.append([encode(msgspec.structs.replace(d, trigger_seq=0, chain=""))
                        for decider in world if isinstance(event, tuple(decider.input_types()))
                        for d in run_decider(decider, event, seq)])
    return [d.snapshot() for d in world], ledger, decided


def test_a_late_report_in_a_recorded_log_changes_no_decision_nor_the_ledger() -> None:
    events = [e for _, e in preempted_and_resumed()]
    first = next(e for e in events if isinstance(e, JobPlaced) and e.job_id == "long")
    at = 1 + next(i for i, e in enumerate(events) if isinstance(e, JobStarted) and e.job_id == "long"
                  and e.run != first.id)
    late = JobFinished(id="late", ts=events[at - 1].ts, source=SIM_EXECUTOR, job_id="long", run=first.id)
    states, ledger, decided = replayed(events)
    states_late, ledger_late, decided_late = replayed([*events[:at], late, *events[at:]])
    assert decided_late == [*decided[:at], [], *decided[at:]]  # the late report decides nothing
    assert sum(map(len, decided)) > 10
    assert states_late == states
    view, before = ledger_late.state.jobs["long"], ledger.state.jobs["long"]
    assert (view.state, view.finished_at, view.gpu_seconds) == ("succeeded", T0 + 110.0, before.gpu_seconds)
    assert ledger_late.state.teams["ml"].jobs_finished == ledger.state.teams["ml"].jobs_finished == 2


# --- the executors' own folds ---------------------------------------------------------------------------

ONE_GPU = (ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000),)
SPEC = JobSpec(team="t", queue="q", gpus=1, duration_s=0.2, command=("true",))


def on_n1(run: str, ts: float) -> JobPlaced:
    return JobPlaced(id=run, ts=ts, source="placement", job_id=JOB, placements=ONE_GPU)


def sim_report(kind: type[EventBase], run: str, what: str, ts: float, **fields: object) -> EventBase:
    return kind(id=derived_id(SIM_EXECUTOR, run, what), ts=ts, source=SIM_EXECUTOR, correlation_id=JOB,
                job_id=JOB, run=run, **fields)


async def test_the_simulated_executor_keeps_timing_the_new_run_when_a_late_finish_of_the_old_one_comes() -> None:
    executor = SimExecutor(bus=None)
    history = [JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC), on_n1("r1", 0.0),
               sim_report(JobStarted, "r1", "started", 0.0, executor=SIM_EXECUTOR),
               sim_report(JobEvicted, "r1", "evicted", 0.05, reason="preempted")]
    for seq, event in enumerate(history, start=1):
        executor.replay(seq, event)
    await executor.after_catch_up()
    [started] = executor.on_event(5, on_n1("r2", 0.1))
    assert isinstance(started, JobStarted) and started.run == "r2"
    assert executor.on_event(6, started) == [] and JOB in executor.timers  # r2's finish is timed
    # The replaced process's finish of r1, stored but never handled, read only now: r1 is long over.
    assert executor.on_event(7, sim_report(JobFinished, "r1", "finished", 0.2)) == []
    assert executor.book.runs[JOB].run_id == "r2" and JOB in executor.timers
    assert executor.book.ended_runs.get(JOB, 0) == 0
    executor.timers.pop(JOB).cancel()


def test_the_node_agent_keeps_the_new_run_and_its_spec_when_a_late_report_of_the_old_one_comes(tmp_path) -> None:
    agent = ProcessExecutor(node="n1", workdir=tmp_path)
    agent_report = {"source": "agent/n2", "correlation_id": JOB, "job_id": JOB}
    for seq, event in enumerate([JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC),
                                 on_n1("r1", 0.0),
                                 JobEvicted(id="e1", ts=1.0, **agent_report, run="r1", reason="node_lost"),
                                 on_n1("r2", 2.0),
                                 JobFinished(id="f1", ts=3.0, **agent_report, run="r1")], start=1):
        agent.replay(seq, event)
    assert agent.placed[JOB].run_id == "r2" and agent.specs[JOB] == SPEC
    agent.replay(6, JobFinished(id="f2", ts=4.0, **agent_report, run="r2"))
    assert JOB not in agent.placed and JOB not in agent.specs


def test_the_node_roster_keeps_the_new_run_to_report_when_a_late_report_of_the_old_one_comes() -> None:
    roster = NodeRoster()
    for event in [on_n1("r1", 0.0), on_n1("r2", 2.0), JobFinished(id="f1", ts=3.0, source="x", job_id=JOB, run="r1")]:
        roster.fold(event)
    assert roster.runs[JOB] == ("r2", frozenset({"n1"}))
    roster.fold(JobFinished(id="f2", ts=4.0, source="x", job_id=JOB, run="r2"))
    assert JOB not in roster.runs


def test_a_service_replica_stays_ready_when_a_late_eviction_of_its_earlier_run_comes() -> None:
    tracker = ServiceTracker()
    replica = msgspec.structs.replace(SPEC, service="chat")
    tracker.apply(JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=replica))
    tracker.services["chat"] = ServiceTimeline(queue="q", desired=1, since=0.0)
    for event in [on_n1("r1", 1.0), JobReady(id="ready1", ts=1.0, source="x", job_id=JOB, run="r1"),
                  JobEvicted(id="e1", ts=2.0, source="x", job_id=JOB, run="r1", reason="node_lost"),
                  on_n1("r2", 3.0), JobReady(id="ready2", ts=3.0, source="x", job_id=JOB, run="r2"),
                  JobEvicted(id="e1-late", ts=4.0, source="y", job_id=JOB, run="r1", reason="node_lost")]:
        tracker.apply(event)
    assert tracker.services["chat"].ready == {JOB}
    tracker.apply(JobEvicted(id="e2", ts=5.0, source="x", job_id=JOB, run="r2", reason="preempted"))
    assert tracker.services["chat"].ready == set()
