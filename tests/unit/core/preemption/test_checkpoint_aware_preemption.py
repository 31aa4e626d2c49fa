"""Checkpoint-aware preemption, end to end in virtual time: a job that checkpoints is told to stop, saves
its state and resumes from it; one that does not loses its run. The accounting ledger charges the loss."""

from __future__ import annotations

import pytest

from contracts import (
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFinished,
    NodeRegistered,
    PreemptionDecided,
    QueuePolicyChanged,
    SubmitJob,
)
from libs.core.accounting.ledger import Ledger
from libs.sim.pipeline import run_virtual
from tests.unit.builders import job, node, queue

T0 = 1_000_000.0


def history(checkpoint_every: float | None) -> list[tuple[int, EventBase]]:
    inputs: list[EventBase] = [
        NodeRegistered(id="n", ts=T0 - 2, source="node-telemetry", node=node("a", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", 4), version=1),
        SubmitJob(id="s1", ts=T0, source="test", job_id="long",
                  spec=job().gpus(4).priority("batch").having(duration_s=100.0,
                                                              checkpoint_interval_s=checkpoint_every).spec),
        SubmitJob(id="s2", ts=T0 + 40, source="test", job_id="urgent",
                  spec=job().gpus(4).priority("urgent").having(duration_s=10.0).spec),
    ]
    return run_virtual(inputs, tick_s=1.0).log


@pytest.mark.parametrize(("checkpoint_every", "finish_at", "progress", "lost"), [
    pytest.param(30.0, 110.0, 40.0, 0.0, id="it checkpoints when stopped: resumes at 40 s and loses nothing"),
    pytest.param(None, 150.0, 0.0, 160.0, id="it does not checkpoint: starts over, 40 s x 4 GPUs lost"),
])
def test_a_preempted_job_resumes_from_its_checkpoint(checkpoint_every: float | None, finish_at: float,
                                                     progress: float, lost: float) -> None:
    log = history(checkpoint_every)
    [decided] = [e for _, e in log if isinstance(e, PreemptionDecided)]
    assert [v.job_id for v in decided.victims] == ["long"] and decided.ts == T0 + 40
    [evicted] = [e for _, e in log if isinstance(e, JobEvicted)]
    assert evicted.progress_s == pytest.approx(progress)
    checkpoints = [e for _, e in log if isinstance(e, JobCheckpointed)]
    assert [c.progress_s for c in checkpoints] == ([pytest.approx(40.0)] if checkpoint_every else [])
    if checkpoints:
        assert evicted.checkpoint == checkpoints[0].checkpoint
    finished = {e.job_id: e.ts - T0 for _, e in log if isinstance(e, JobFinished)}
    assert finished == {"urgent": pytest.approx(50.0), "long": pytest.approx(finish_at)}
    ledger = Ledger()
    for seq, e in log:
        ledger.fold(e, seq)
    assert ledger.state.jobs["long"].lost_gpu_seconds == pytest.approx(lost)
    assert ledger.state.teams["ml"].lost_gpu_seconds == pytest.approx(lost)


def test_a_job_that_checkpoints_is_the_cheaper_victim() -> None:
    """Same priority, same start: the one whose eviction loses nothing goes first."""
    inputs: list[EventBase] = [
        NodeRegistered(id="n", ts=T0 - 2, source="node-telemetry", node=node("a", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", 4), version=1),
        SubmitJob(id="s1", ts=T0, source="test", job_id="plain",
                  spec=job().gpus(2).priority("batch").having(duration_s=100.0).spec),
        SubmitJob(id="s2", ts=T0, source="test", job_id="saver",
                  spec=job().gpus(2).priority("batch").having(duration_s=100.0, checkpoint_interval_s=60.0).spec),
        SubmitJob(id="s3", ts=T0 + 40, source="test", job_id="urgent",
                  spec=job().gpus(2).priority("urgent").having(duration_s=10.0).spec),
    ]
    log = run_virtual(inputs, tick_s=1.0).log
    [decided] = [e for _, e in log if isinstance(e, PreemptionDecided)]
    assert [(v.job_id, v.lost_gpu_seconds) for v in decided.victims] == [("saver", 0.0)]


def test_a_gang_on_a_lost_node_is_requeued_whole_and_resumes_from_its_last_periodic_checkpoint() -> None:
    from contracts import JobPlaced, NodeLost

    inputs: list[EventBase] = [
        NodeRegistered(id="na", ts=T0 - 3, source="node-telemetry", node=node("a", 4)),
        NodeRegistered(id="nb", ts=T0 - 2, source="node-telemetry", node=node("b", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", None), version=1),
        SubmitJob(id="s1", ts=T0, source="test", job_id="gang",
                  spec=job().gpus(4).replicas(2).having(duration_s=100.0, checkpoint_interval_s=30.0).spec),
        NodeLost(id="lost", ts=T0 + 50, source="node-telemetry", node="b", reason="heartbeat_missed"),
        NodeRegistered(id="nc", ts=T0 + 60, source="node-telemetry", node=node("c", 4)),
    ]
    log = run_virtual(inputs, tick_s=1.0).log
    [evicted] = [e for _, e in log if isinstance(e, JobEvicted)]
    assert (evicted.reason, evicted.progress_s, evicted.ts - T0) == ("node_lost", 30.0, 50.0)
    placed = [e for _, e in log if isinstance(e, JobPlaced)]
    assert [sorted(p.node for p in e.placements) for e in placed] == [["a", "b"], ["a", "c"]]
    [finished] = [e for _, e in log if isinstance(e, JobFinished)]
    assert finished.ts - T0 == pytest.approx(60.0 + 70.0)  # 30 s of work kept; 70 s to go from the new start


@pytest.mark.parametrize(("exit_codes", "outcome", "failures"), [
    pytest.param("137,0", "finished", 1, id="killed (137): runs again after its backoff and succeeds"),
    pytest.param("1", "failed", 1, id="an application error (1): failed for good"),
    pytest.param("137,137,137", "failed", 3, id="killed three times: two retries, then failed"),
    pytest.param("3,0", "finished", 1, id="an exit code the job lists as retryable"),
])
def test_retryable_failures_run_again_with_backoff(exit_codes: str, outcome: str, failures: int) -> None:
    from contracts import JobFailed
    from libs.sim.executor import SIM_EXIT_CODES

    spec = job().gpus(1).having(duration_s=10.0, labels={SIM_EXIT_CODES: exit_codes}, retry_exit_codes=(3,)).spec
    inputs: list[EventBase] = [
        NodeRegistered(id="n", ts=T0 - 2, source="node-telemetry", node=node("a", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", 4), version=1),
        SubmitJob(id="s", ts=T0, source="test", job_id="j", spec=spec),
    ]
    log = run_virtual(inputs, tick_s=1.0).log
    failed = [e.ts - T0 for _, e in log if isinstance(e, JobFailed)]
    assert len(failed) == failures
    if failures >= 2:  # backoff doubles: 10 s after the first failure, 20 s after the second
        assert failed[1] - failed[0] == pytest.approx(10.0 + 10.0, abs=1.0)
        assert failed[2] - failed[1] == pytest.approx(20.0 + 10.0, abs=1.0)
    finished = [e.ts - T0 for _, e in log if isinstance(e, JobFinished)]
    assert bool(finished) == (outcome == "finished")
    ledger = Ledger()
    for seq, e in log:
        ledger.fold(e, seq)
    view = ledger.state.jobs["j"]
    assert view.state == ("succeeded" if outcome == "finished" else "failed")
    assert view.retries == (failures if outcome == "finished" else failures - 1)


@pytest.mark.parametrize(("write_s", "stopped_at", "reason", "progress"), [
    pytest.param("5", 45.0, "preempted", 40.0, id="its checkpoint takes 5 s: stopped then, with 40 s of work saved"),
    pytest.param("100", 70.0, "grace_expired", 60.0,
                 id="it takes longer than the 30 s grace: killed at 70 s, keeping its periodic checkpoint of 60 s"),
])
def test_a_victim_has_its_classs_grace_to_write_its_checkpoint(write_s: str, stopped_at: float, reason: str,
                                                                progress: float) -> None:
    from contracts import JobStarted
    from libs.sim.executor import SIM_CHECKPOINT_S

    inputs: list[EventBase] = [
        NodeRegistered(id="n", ts=T0 - 2, source="node-telemetry", node=node("a", 4)),
        QueuePolicyChanged(id="q", ts=T0 - 1, source="operator", queue=queue("ml-train", "ml", 4), version=1),
        SubmitJob(id="s1", ts=T0, source="test", job_id="long",
                  spec=job().gpus(4).priority("batch").having(duration_s=100.0, checkpoint_interval_s=30.0,
                                                              labels={SIM_CHECKPOINT_S: write_s}).spec),
        SubmitJob(id="s2", ts=T0 + 40, source="test", job_id="urgent",
                  spec=job().gpus(4).priority("urgent").having(duration_s=10.0).spec),
    ]
    log = run_virtual(inputs, tick_s=1.0).log
    [evicted] = [e for _, e in log if isinstance(e, JobEvicted)]
    assert (evicted.ts - T0, evicted.reason, evicted.progress_s) == (pytest.approx(stopped_at), reason,
                                                                      pytest.approx(progress))
    started = [e.ts - T0 for _, e in log if isinstance(e, JobStarted) and e.job_id == "urgent"]
    assert started == [pytest.approx(stopped_at)]  # the preemptor starts once its victim is gone
