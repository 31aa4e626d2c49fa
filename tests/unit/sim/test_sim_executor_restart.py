"""The simulated executor after a restart: a report the replaced process stored but never handled is what
the log says happened; the new process must apply it, not take it for one of its own already applied."""

from __future__ import annotations

import asyncio

from contracts import (
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PreemptionDecided,
    ReplicaPlacement,
    Victim,
)
from libs.core.kernel.decider import derived_id
from libs.sim.executor import SOURCE
from libs.sim.live_executor import SimExecutor

JOB = "job-1"
SPEC = JobSpec(team="t", queue="q", gpus=1, duration_s=0.2)


def placed(run: str, ts: float) -> JobPlaced:
    return JobPlaced(id=run, ts=ts, source="placement", job_id=JOB,
                     placements=(ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000),))


def report(kind: type, run: str, what: str, ts: float, **fields: object) -> object:
    return kind(id=derived_id(SOURCE, run, what), ts=ts, source=SOURCE, correlation_id=JOB, job_id=JOB, **fields)


async def test_an_eviction_stored_by_the_replaced_process_ends_the_run_it_was_timing() -> None:
    executor = SimExecutor(bus=None)
    # What the log held up to the restart: the job placed (run r1) and started.
    for seq, event in enumerate([JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC),
                                 placed("r1", 0.0), report(JobStarted, "r1", "started", 0.0)], start=1):
        executor.replay(seq, event)
    await executor.after_catch_up()  # r1 was running: its finish is timed again
    assert JOB in executor.timers
    # Live: the replaced process had evicted r1 (stored, never handled by it), then the job is placed again.
    assert executor.on_event(4, report(JobEvicted, "r1", "evicted", 0.1, reason="preempted")) == []
    assert JOB not in executor.book.runs and JOB not in executor.timers
    out = executor.on_event(5, placed("r2", 0.1))
    assert [type(e) for e in out] == [JobStarted]
    assert out[0].id in executor.made  # ours now: applied, waiting to come back through the log
    await asyncio.sleep(0.3)  # r1's time would be up: no finish for a run that ended
    assert executor.book.runs[JOB].run_id == "r2"
    assert not executor._tasks


async def test_our_own_report_coming_back_is_not_applied_twice() -> None:
    executor = SimExecutor(bus=None)
    executor.replay(1, JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC))
    started = executor.on_event(2, placed("r1", 0.0))
    assert executor.on_event(3, started[0]) == []  # the start comes back: the finish is timed from here
    assert not executor.made and JOB in executor.timers
    finished = report(JobFinished, "r1", "finished", 0.2)
    executor.book.finish(executor.book.runs[JOB], 0.2)  # what the timer does, as this process
    executor.made[finished.id] = None
    executor.on_event(4, finished)
    assert executor.book.ended_runs[JOB] == 1  # counted once, when it was made


class TailBus:
    """What the executor asks the bus at a restart: where its durable consumer stands, where the last report is."""

    def __init__(self, floor: int, last_report: int) -> None:
        self.floor, self.last_report = floor, last_report
        self.config = type("Config", (), {"stream": "S"})()
        self.js = self

    async def ack_floor(self, durable: str) -> int:
        return self.floor

    async def get_last_msg(self, stream: str, subject: str) -> object:
        return type("Raw", (), {"seq": self.last_report})()

    def subject_for_type(self, kind: type) -> str:
        return kind.__name__


async def test_runs_resume_only_once_the_replaced_processs_reports_are_read() -> None:
    """The replaced process evicted r1 and stored it just past the floor; r1's time is long up. Timing its
    finish again at once would finish an evicted run: the executor waits until it has read that eviction."""
    executor = SimExecutor(bus=TailBus(floor=3, last_report=4))  # type: ignore[arg-type]
    for seq, event in enumerate([JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC),
                                 placed("r1", 0.0), report(JobStarted, "r1", "started", 0.0)], start=1):
        executor.replay(seq, event)
    await executor.after_catch_up()
    assert not executor.timers  # not yet: a report of the replaced process's is still ahead
    assert executor.on_event(4, report(JobEvicted, "r1", "evicted", 0.1, reason="preempted")) == []
    await asyncio.sleep(0.05)
    assert JOB not in executor.book.runs and not executor.timers and not executor._tasks


async def test_with_nothing_ahead_runs_resume_at_once() -> None:
    executor = SimExecutor(bus=TailBus(floor=3, last_report=3))  # type: ignore[arg-type]
    for seq, event in enumerate([JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC),
                                 placed("r1", 0.0), report(JobStarted, "r1", "started", 0.0)], start=1):
        executor.replay(seq, event)
    await executor.after_catch_up()
    assert JOB in executor.timers


def preempted(ts: float) -> PreemptionDecided:
    return PreemptionDecided(id="p1", ts=ts, source="preemption", preemptor_id="urgent", code="priority",
                             victims=(Victim(job_id=JOB, queue="q", priority=100, gpu_milli=1000,
                                             reason="priority"),))


def restarted(last_report: int) -> SimExecutor:
    """A process restarted with the job running (placed and started, up to sequence 3)."""
    executor = SimExecutor(bus=TailBus(floor=3, last_report=last_report))  # type: ignore[arg-type]
    for seq, event in enumerate([JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC),
                                 placed("r1", 0.0), report(JobStarted, "r1", "started", 0.0)], start=1):
        executor.replay(seq, event)
    return executor


async def test_a_preemption_read_before_the_replaced_processs_finish_does_not_evict_the_finished_job() -> None:
    """The replaced process finished r1 before it read the preemption naming r1 (decided before the finish was
    known), and was killed. The new process reads the preemption first: it must not evict a finished job."""
    executor = restarted(last_report=5)
    await executor.after_catch_up()
    assert executor.on_event(4, preempted(0.15)) == []  # folded; acted on once the reports ahead are read
    assert not executor.settled()  # a snapshot now would hold a decision never acted on
    assert executor.on_event(5, report(JobFinished, "r1", "finished", 0.2)) == []
    assert JOB not in executor.book.runs and not executor.timers and executor.settled()


async def test_a_preemption_read_before_the_resume_evicts_a_job_still_running_at_the_resume() -> None:
    executor = restarted(last_report=5)
    await executor.after_catch_up()
    assert executor.on_event(4, preempted(0.15)) == []
    other = JobStarted(id="other", ts=0.2, source=SOURCE, correlation_id="job-2", job_id="job-2")
    out = executor.on_event(5, other)  # the last report of the replaced process: the resume
    assert [(type(e), e.job_id) for e in out] == [(JobEvicted, JOB)]
    assert JOB not in executor.book.runs and not executor.timers and executor.settled()


async def test_a_preemption_read_before_the_resume_spares_the_run_placed_after_it() -> None:
    """The replaced process evicted r1 for the preemption and ran the job again (r2) before it was killed; the
    new process reads all of it before the resume. The preemption was about r1: r2 keeps running."""
    executor = restarted(last_report=7)
    await executor.after_catch_up()
    assert executor.on_event(4, preempted(0.15)) == []
    assert executor.on_event(5, report(JobEvicted, "r1", "evicted", 0.16, reason="preempted")) == []
    assert executor.on_event(6, placed("r2", 0.2)) == []
    out = executor.on_event(7, report(JobStarted, "r2", "started", 0.21))  # the resume
    assert out == [] and executor.book.runs[JOB].run_id == "r2" and JOB in executor.timers


async def test_a_placement_on_a_node_it_does_not_serve_is_never_run_nor_resumed_here() -> None:
    """An agent's node beside the simulated cluster, or a node of an earlier cluster source: another executor's
    run (or nobody's, which node-telemetry's roster reports evicted), never started by the simulated one."""
    executor = SimExecutor(bus=None, serves=lambda node: node != "n1")
    executor.replay(1, JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=SPEC))
    executor.replay(2, placed("r1", 0.0))
    await executor.after_catch_up()
    assert JOB not in executor.book.runs and JOB not in executor.timers
    assert executor.on_event(3, placed("r2", 0.1)) == []
