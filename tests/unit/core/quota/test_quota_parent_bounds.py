"""A parent queue's quota bounds its subtree: its quota of a model bounds the subtree's usage of that model, and
its quota of any model ("*") the subtree's usage of every model together, whichever flavors its children use."""

from __future__ import annotations

from contracts import FlavorQuota, QueueSpec
from libs.core.kernel.quota_math import ANY, QuotaBook


def book(parent_flavors: tuple[FlavorQuota, ...]) -> QuotaBook:
    b = QuotaBook()
    b.set_queues([
        QueueSpec(name="org", team="org", flavors=parent_flavors),
        QueueSpec(name="any", team="t", parent="org", flavors=(FlavorQuota(model=ANY, nominal_gpus=8),)),
        QueueSpec(name="a100", team="t", parent="org", flavors=(FlavorQuota(model="A100", nominal_gpus=8),)),
    ])
    return b


def test_a_parents_any_model_quota_bounds_a_child_of_any_model_by_every_models_usage() -> None:
    b = book((FlavorQuota(model=ANY, nominal_gpus=8),))
    b.add("a100", "A100", 4000)
    assert b.parent_room("any", ANY) == 4000  # not 8: the sibling's A100 counts against org's 8
    assert b.parent_room("a100", "A100") == 4000


def test_a_parents_quota_of_a_model_and_of_any_model_both_bound_the_subtree() -> None:
    b = book((FlavorQuota(model="A100", nominal_gpus=6), FlavorQuota(model=ANY, nominal_gpus=8)))
    b.add("any", ANY, 5000)
    assert b.parent_room("a100", "A100") == 3000  # org's 8 of any model, 5 of them used, binds before its 6 A100
    assert b.ceiling("a100", "A100") == 6000
    b.add("any", ANY, -5000)
    b.add("a100", "A100", 6000)
    assert b.parent_room("a100", "A100") == 0
    assert b.parent_room("any", ANY) == 2000
