"""A queue's preemption and flavor settings (libs/core/kernel/queue_policies.py): a bad value is refused with an
error naming the setting and its values, wherever queue specs are checked (check_tree); and the order a job tries
its flavors in by flavor fungibility."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import FlavorQuota, QueueSpec
from libs.core.kernel.queue_limits import check_tree
from libs.core.kernel.queue_policies import flavors_in_turn


@pytest.mark.parametrize("fields, error", [
    ({"reclaim_within_cohort": "LowerPriority"},
     "reclaim_within_cohort must be any, lower-priority or never, not 'LowerPriority'"),
    ({"within_queue_preemption": "always"},
     "within_queue_preemption must be lower-priority, lower-or-newer-equal-priority or never, not 'always'"),
    ({"borrow_within_cohort": "any"}, "borrow_within_cohort must be never or lower-priority, not 'any'"),
    ({"when_can_borrow": "preempt"}, "when_can_borrow must be borrow or try-next-flavor, not 'preempt'"),
    ({"when_can_preempt": "borrow"}, "when_can_preempt must be try-next-flavor or preempt, not 'borrow'"),
    ({"borrow_within_cohort_max_priority": 100},
     "borrow_within_cohort_max_priority needs borrow_within_cohort lower-priority"),
    ({"within_queue_preemption": "never", "las_threshold_gpu_hours": 1.0},
     "within_queue_preemption never forbids what las_threshold_gpu_hours asks: preemption within the queue"),
])
def test_a_bad_setting_is_refused_with_its_name(fields: dict[str, Any], error: str) -> None:
    assert check_tree({}, QueueSpec(name="q", team="q", **fields)) == error


@pytest.mark.parametrize("kind", ["npu:*", "gpu:*", "Ascend910*"])
def test_a_kind_of_device_is_no_flavor(kind: str) -> None:
    """A flavor of "npu:*" once let a job of any GPU (which never runs on an NPU) take its quota and be placed on
    NPUs: the flavor's name is what placement narrows the job's models to."""
    queue = QueueSpec(name="q", team="q", flavors=(FlavorQuota(model=kind, nominal_gpus=4),
                                                    FlavorQuota(model="A100", nominal_gpus=4)))
    assert check_tree({}, queue) == (f'a flavor is quota of one model or of any model ("*"), not of a kind or '
                                     f'family ({kind})')


def test_good_settings_are_accepted() -> None:
    assert check_tree({}, QueueSpec(name="q", team="q", reclaim_within_cohort="never",
                                    within_queue_preemption="lower-or-newer-equal-priority",
                                    borrow_within_cohort="lower-priority", borrow_within_cohort_max_priority=300,
                                    when_can_borrow="try-next-flavor", when_can_preempt="preempt")) is None


# (nominal left, room) per flavor, in thousandths: A lent out (nominal left 2, no room), B borrows, C own room.
LEFT = {"A": (2000, 0), "B": (0, 4000), "C": (4000, 4000)}
# The jobs holding what the queue lent of each flavor, as (priority, thousandths of GPUs): one of priority 100
# holds A's 2 lent GPUs.
LENT_TO: dict[str, tuple[tuple[int, int], ...]] = {"A": ((100, 2000),), "B": (), "C": ()}


@pytest.mark.parametrize("fields, order", [
    ({}, ("A", "B", "C")),
    ({"when_can_borrow": "try-next-flavor"}, ("A", "C", "B")),
    ({"when_can_preempt": "preempt"}, ("A",)),
    ({"when_can_borrow": "try-next-flavor", "when_can_preempt": "preempt"}, ("A",)),
])
def test_flavors_are_tried_in_turn_by_fungibility(fields: dict[str, Any], order: tuple[str, ...]) -> None:
    queue = QueueSpec(name="q", team="q", **fields)
    assert flavors_in_turn(queue, ("A", "B", "C"), 2000, LEFT.__getitem__, 200, LENT_TO.__getitem__) == order
    # B first: with preempt, B (borrowing) stays before the cut at A; with try-next-flavor, after A.
    both: dict[str, Any] = {"when_can_borrow": "try-next-flavor", "when_can_preempt": "preempt"}
    assert flavors_in_turn(QueueSpec(name="q", team="q", **both), ("B", "A", "C"), 2000, LEFT.__getitem__, 200,
                           LENT_TO.__getitem__) == ("A", "B")


@pytest.mark.parametrize("reclaim, priority, holders, waits", [
    ("any", 100, ((100, 2000),), True),  # any borrower may be taken back
    ("lower-priority", 200, ((100, 2000),), True),  # the holder is of lower priority: the reclaim may take it
    ("lower-priority", 100, ((100, 2000),), False),  # of its own priority: no reclaim would serve it at A
    ("lower-priority", 100, ((100, 1000), (300, 1000)), False),  # nor of higher priority
    ("lower-priority", 200, ((300, 1000), (100, 1000), (50, 1000)), True),  # those it may take free enough
    ("lower-priority", 200, ((300, 1000), (100, 1000)), False),  # the one it may take frees 1 GPU of the 2 it lacks
    ("any", 100, (), False),  # nobody holds what the queue lent of A (its room is bounded elsewhere)
    ("never", 200, ((100, 2000),), False),  # the queue reclaims nothing
])
def test_a_job_waits_to_preempt_only_where_its_reclaim_could_make_room(
        reclaim: str, priority: int, holders: tuple[tuple[int, int], ...], waits: bool) -> None:
    queue = QueueSpec(name="q", team="q", when_can_preempt="preempt", reclaim_within_cohort=reclaim)
    lent_to = {**LENT_TO, "A": holders}
    order = flavors_in_turn(queue, ("A", "B", "C"), 2000, LEFT.__getitem__, priority, lent_to.__getitem__)
    assert order == (("A",) if waits else ("A", "B", "C"))
