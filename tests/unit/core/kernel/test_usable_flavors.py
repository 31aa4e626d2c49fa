"""The one rule of which of its queue's flavors a job can use, as quota reserves by it and preemption simulates
by it (libs/core/kernel/usable_flavors.py): the queue's flavors the job allows, less those of a model the
nodes present do not serve; all of them when none is served."""

from __future__ import annotations

from contracts import (
    FlavorQuota,
    GpuSpec,
    JobSpec,
    NodeCordoned,
    NodeRegistered,
    NodeSpec,
    QueuePolicyChanged,
    QueueSpec,
)
from libs.core.kernel.quota_math import QuotaBook
from libs.core.kernel.usable_flavors import ModelCounts, usable_flavors
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider

QUEUE = QueueSpec(name="a", team="a", flavors=(FlavorQuota(model="H100", nominal_gpus=1),
                                               FlavorQuota(model="A100", nominal_gpus=1)))
ANY_MODEL = JobSpec(team="a", queue="a", gpus=1)


def _registered(name: str, model: str) -> NodeRegistered:
    return NodeRegistered(id=f"reg-{name}", ts=0.0, source="test",
                          node=NodeSpec(name=name, gpus=(GpuSpec(index=0, model=model),)))


def _book() -> QuotaBook:
    book = QuotaBook()
    book.set_queue(QUEUE)
    return book


def test_a_flavor_of_a_model_no_node_serves_is_left_out() -> None:
    models = ModelCounts()
    models.fold(_registered("n0", "A100"))
    assert usable_flavors(_book(), models, ANY_MODEL, 1000) == ("A100",)
    assert usable_flavors(_book(), models, JobSpec(team="a", queue="a", gpus=1, gpu_models=("H100",)),
                          1000) == ("H100",)  # none it allows is served: all it allows


def test_every_flavor_when_no_node_serves_any() -> None:
    models = ModelCounts()
    models.fold(_registered("n0", "A100"))
    models.fold(NodeCordoned(id="c", ts=1.0, source="test", node="n0"))
    assert usable_flavors(_book(), models, ANY_MODEL, 1000) == ("H100", "A100")


def test_quota_and_preemption_see_the_same_models_from_the_same_log() -> None:
    events = [QueuePolicyChanged(id="q", ts=0.0, source="test", queue=QUEUE, version=1), _registered("n0", "A100"),
              _registered("n1", "H100"), NodeCordoned(id="c", ts=1.0, source="test", node="n1")]
    quota, preemption = QuotaDecider(), PreemptionDecider()
    for event in events:
        quota.fold(event)
        preemption.fold(event)
    assert quota.state.fleet.by_model == preemption.world.models.by_model == {"A100": 1}
