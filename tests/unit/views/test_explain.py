"""'Why is my job pending?': the right reason, what would unblock it, and when, for a table of situations."""

from __future__ import annotations

import pytest

from contracts import JobSpec, ReplicaPlacement
from contracts.views import JobView, NodeView, QueueView
from libs.views.explain import explain

NOW = 1_000.0


def job(job_id: str, state: str = "pending", phase: str = "admitted", reason: str = "", gpus: int = 2,
        models: tuple[str, ...] = (), shortfall: int = 0, started: float | None = None, duration: float | None = None,
        on: str = "", held: int = 0) -> JobView:
    spec = JobSpec(team="ml", queue="ml", gpus=gpus, gpu_models=models, duration_s=duration)
    placements = (ReplicaPlacement(replica=0, node=on, gpu_indices=tuple(range(held)), gpu_milli=1000,
                                   model=(models or ("A100",))[0]),) if held else ()
    return JobView(id=job_id, state=state, team="ml", queue="ml", spec=spec, phase=phase, reason=reason,
                   message=f"{reason} message" if reason else "", shortfall_milli=shortfall, started_at=started,
                   placements=placements)


RAISE_2 = "raise queue ml's nominal quota by 2 GPUs (it uses 8 of 8)"
QUEUE = QueueView(name="ml", team="ml", nominal_gpus=8, reserved_gpus=8.0)
NODES = [NodeView(name="n1", gpus=8, models=("A100",), gpu_free_milli=(0,) * 8),
         NodeView(name="n2", gpus=4, models=("H100",), gpu_free_milli=(1000, 0, 0, 0))]
RUNNING = [job("r1", "running", "running", gpus=4, started=900.0, duration=300.0, on="n1", held=4),
           job("r2", "running", "running", gpus=4, started=950.0, duration=100.0, on="n1", held=4)]


@pytest.mark.parametrize(("view", "code", "unblock", "start"), [
    pytest.param(job("p", reason="queue_quota_exhausted", shortfall=2000), "queue_quota",
                 [RAISE_2, "2 GPUs of queue ml free when r2 end at about 1970-01-01T00:17:30Z"],
                 1050.0, id="over its queue's quota: raise it, or wait for the job that ends first"),
    pytest.param(job("p", reason="queue_quota_exhausted", gpus=6, shortfall=6000), "queue_quota",
                 ["raise queue ml's nominal quota by 6 GPUs (it uses 8 of 8)",
                  "6 GPUs of queue ml free when r2, r1 end at about 1970-01-01T00:20:00Z"],
                 1200.0, id="needs more than one running job gives back"),
    pytest.param(job("p", reason="behind_higher_priority"), "priority",
                 [RAISE_2, "2 GPUs of queue ml free when r2 end at about 1970-01-01T00:17:30Z"],
                 1050.0, id="held behind a higher-priority job of its queue"),
    pytest.param(job("p", phase="reserved", reason="insufficient_gpus", shortfall=2000), "capacity",
                 ["2 GPUs of any model free when r2 end at about 1970-01-01T00:17:30Z"], 1050.0,
                 id="quota granted but no free GPUs"),
    pytest.param(job("p", phase="reserved", reason="no_model_match", models=("TPU",), shortfall=2000), "capacity",
                 ["2 GPUs more of TPU (no running job declares when it ends)"], None,
                 id="a model the cluster lacks"),
    pytest.param(job("p", phase="reserved", reason="fragmentation", gpus=1, shortfall=1000), "fragmentation",
                 ["1 GPU of any model free when r2 end at about 1970-01-01T00:17:30Z"], 1050.0,
                 id="enough share, scattered"),
    pytest.param(job("p", phase="reserved", reason="reserved_for_preemptor"), "protected_for_preemptor",
                 ["1 GPU of any model free when r2 end at about 1970-01-01T00:17:30Z"], 1050.0,
                 id="capacity held for a preemptor"),
    pytest.param(job("p", reason="no_node_could_hold", gpus=16, shortfall=16000), "no_node",
                 ["a node that could hold it (registered, healthy, not cordoned) joins or comes back; until then no "
                  "quota or capacity is held for it, however long it waits"], None,
                 id="no node present could hold it: no running job ending helps"),
    pytest.param(job("p", reason="no_quota_for_models", models=("H100",)), "no_quota_for_models",
                 ["queue ml is given quota of H100 (a flavor); until then it waits without holding back other jobs"],
                 None, id="no quota of its model: only a policy change helps"),
])
def test_a_pending_job_is_explained(view: JobView, code: str, unblock: list[str], start: float | None) -> None:
    answer = explain(view, QUEUE, RUNNING, RUNNING, NODES, NOW)
    assert answer.state == "pending"
    assert [r.code for r in answer.reasons] == [code]
    assert answer.reasons[0].message.endswith("message")
    assert answer.unblock == unblock
    assert answer.estimated_start == start


def test_a_running_job_started_when_it_started_and_a_final_one_says_why_it_ended() -> None:
    running = explain(RUNNING[0], QUEUE, RUNNING, RUNNING, NODES, NOW)
    assert (running.state, running.reasons, running.estimated_start) == ("running", [], 900.0)
    rejected = explain(job("x", "rejected", "rejected", reason="unknown_queue"), QUEUE, [], [], NODES, NOW)
    assert [r.code for r in rejected.reasons] == ["unknown_queue"] and rejected.unblock == []


def test_free_capacity_counts_what_the_job_could_use() -> None:
    """A whole-GPU job counts only wholly free plain GPUs; a fraction counts what is left of split ones too;
    neither counts a MIG-enabled GPU's share."""
    from contracts import JobSpec
    from contracts.views import JobView, NodeView
    from libs.views.explain import _free_for

    node = NodeView(name="n", gpu_free_milli=(1000, 750, 1000), gpu_modes=("whole", "split", "mig"))
    whole = JobView(id="w", state="pending", team="t", queue="q", spec=JobSpec(team="t", queue="q", gpus=2))
    part = JobView(id="p", state="pending", team="t", queue="q", spec=JobSpec(team="t", queue="q", gpu_milli=250))
    assert (_free_for(whole, node), _free_for(part, node)) == (1000, 1750)
