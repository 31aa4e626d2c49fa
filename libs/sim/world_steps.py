"""The steps a generated world is made of, and how often each kind comes: the vocabulary both the stateful
pipeline test (tests/unit/sim/test_pipeline_stateful.py, drawing with hypothesis) and the frozen sequences
(libs/sim/frozen/sequences.py, drawing from a seeded random) build their worlds from. The choices are flat
lists: one of a rare value about once in `odds` draws. Changing one moves the frozen sequences' inputs: re-record
them (scripts/freeze_decisions.py --set sequences)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from contracts import FlavorQuota, PriorityClass, QueueSpec, SchedulingSettings
from libs.core.kernel.queue_policies import CHOICES as POLICY_CHOICES
from libs.sim.executor import SIM_EXIT_CODES
from libs.sim.scenario_model import Ended, Report, Settings, Step

SETTINGS = Settings(tick_s=5.0, quiet_s=600.0, preempt_min_remaining_s=0.0, starvation_after_s=120.0)
MODELS = ("A100", "H100", "T4")
NODES = ("n0", "n1", "n2")
QUEUES = ("a", "b")
CLASSES = ("production-inference", "urgent", "training", "experiment", "batch")
# Profiles of the 80 GB A100 and H100 (valid there), of other products, and no profile at all.
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.20gb", "3g.20gb", "1g.5gb", "9g.90gb",
                "banana")
GAPS = (0.0, 0.0, 1.0, 5.0, 15.0, 40.0, 120.0)
LABELS: tuple[dict[str, str], ...] = ({}, {"rack": "r1", "block": "b1"}, {"rack": "r2", "block": "b1"})
QUEUE_CHANGES = ("raise", "lower", "flavors", "limits", "budget", "user", "evictions", "reclaim")
# Queue changes the stateful test draws besides QUEUE_CHANGES (the frozen sequences draw only those).
MORE_QUEUE_CHANGES = ("las", "policies")
NODE_CHANGES = ("same", "fewer", "mig", "model", "new")
REPORT_KINDS = ("finish", "fail", "fail_retryable", "evict")
# Changes of a priority class while jobs of it run or wait, of the scheduling settings, and of where a queue
# sits in the tree (the stateful test draws these; the frozen sequences do not, so adding one moves nothing).
CLASS_CHANGES = ("value", "min_runtime", "preemptible")
CLASS_VALUES = (50, 400, 900, 1200)
MIN_RUNTIMES = (0.0, 30.0, 600.0)
SETTINGS_CHANGES = ("starvation", "remaining", "timeout", "half_life", "slack")
TREE_SHAPES = ("flat", "cohort", "three_levels")
MOVES = ("other_cohort", "no_cohort", "under_mid", "under_org")
T = TypeVar("T")


def mostly(common: Sequence[T], rare: Sequence[T], odds: int) -> list[T]:
    """One flat list to choose from: one of `rare` about once in `odds` draws (a flat choice is cheap to draw,
    and for hypothesis to shrink, towards the first of `common`)."""
    copies = max(1, round(len(rare) * (odds - 1) / len(common)))
    return [*common] * copies + [*rare]


# Most submissions are ones the platform admits: bad queues, classes, models and sizes come rarely.
QUEUE_OF_JOB = mostly(QUEUES, ["zz"], odds=12)
SHAPES = ["whole"] * 5 + ["fraction"] * 2 + ["mig", "huge"]
WHOLE_GPUS = (1, 1, 1, 2, 2, 4, 8)
HUGE_GPUS = (9, 16, 64)
GPU_MILLI = (100, 250, 500, 750, 999)
GPU_MEMORY = mostly([0, 0, 8_192, 40_000], [200_000], odds=8)
TOPOLOGY = mostly([""], ["node", "rack", "block"], odds=4)
REPLICAS = mostly([1, 1, 1, 2, 2, 3], [4, 12], odds=8)
PRIORITY = mostly(CLASSES, ["vip"], odds=16)
SPREAD = mostly([False], [True], odds=6)
MODELS_ALLOWED = mostly(["any", "any", "one", "several"], ["unknown"], odds=16)
DURATION = (None, 5.0, 20.0, 60.0, 60.0, 300.0)
CHECKPOINT = (None, None, 10.0)
EXIT_PLAN: list[dict[str, str]] = mostly([{}], [{SIM_EXIT_CODES: "137,0"}, {SIM_EXIT_CODES: "1"}], odds=6)


def changed_queue(queue: QueueSpec, change: str, model: str) -> QueueSpec:
    replace = msgspec.structs.replace

    def flavors_with(**fields: Any) -> tuple[FlavorQuota, ...]:
        return tuple(replace(f, **fields) for f in queue.flavors)

    match change:
        case "raise":
            if queue.flavors:
                return replace(queue, flavors=tuple(replace(f, nominal_gpus=f.nominal_gpus + 8) for f in queue.flavors))
            return replace(queue, nominal_gpus=(queue.nominal_gpus or 0) + 8)
        case "lower":  # below what it uses now, most likely
            return replace(queue, flavors=flavors_with(nominal_gpus=0)) if queue.flavors else replace(
                queue, nominal_gpus=0)
        case "flavors":  # the last flavor removed, or quotas per model where there were none
            if queue.flavors:
                return replace(queue, flavors=queue.flavors[:-1])
            return replace(queue, nominal_gpus=None, borrowing_limit_gpus=None, lending_limit_gpus=None,
                           flavors=(FlavorQuota(model=model, nominal_gpus=2),))
        case "limits":
            if queue.flavors:
                return replace(queue, flavors=flavors_with(borrowing_limit_gpus=0, lending_limit_gpus=0))
            return replace(queue, borrowing_limit_gpus=0, lending_limit_gpus=0)
        case "budget":
            return replace(queue, budget_gpu_hours=0.01, budget_period="day",
                           over_budget="wait" if queue.over_budget == "borrow" else "borrow")
        case "user":
            return replace(queue, user_max_gpus=2)
        case "evictions":
            return replace(queue, eviction_budget_gpus=1, eviction_window_s=60.0)
        case "las":  # least attained service: a job past 36 GPU-seconds waits behind its peers below
            return replace(queue, las_threshold_gpu_hours=None if queue.las_threshold_gpu_hours else 0.01)
        case "policies":  # each preemption and flavor setting to its next value (kernel/queue_policies.py)
            return next_policies(queue)
    return replace(queue, reclaim_after_s=5.0)


def changed_class(cls: PriorityClass, change: str, value: int, min_runtime_s: float) -> PriorityClass:
    """A priority class changed while its jobs run: its value, its minimum runtime, or whether it may be
    preempted (toggled)."""
    replace = msgspec.structs.replace
    match change:
        case "value":
            return replace(cls, value=value)
        case "min_runtime":
            return replace(cls, min_runtime_s=min_runtime_s)
    return replace(cls, preemptible=not cls.preemptible)


def changed_settings(settings: SchedulingSettings, change: str) -> SchedulingSettings:
    """The scheduling settings with one knob turned (toggled between two values)."""
    replace = msgspec.structs.replace
    match change:
        case "starvation":
            return replace(settings, starvation_after_s=None if settings.starvation_after_s else 60.0)
        case "remaining":
            return replace(settings, preempt_min_remaining_s=30.0 if not settings.preempt_min_remaining_s else 0.0)
        case "timeout":
            return replace(settings, placement_timeout_s=60.0 if settings.placement_timeout_s != 60.0 else None)
        case "half_life":
            return replace(settings, fair_share_half_life_s=0.0 if settings.fair_share_half_life_s else 3600.0)
    return replace(settings, preemption_slack_gpus=0 if settings.preemption_slack_gpus else 8)


def moved_queue(queue: QueueSpec, move: str) -> QueueSpec:
    """The queue moved in the tree: into a cohort of its own name ("c2"), out of any cohort (its parent's
    cohort named away as itself), under the middle queue "m", or straight under "org"."""
    replace = msgspec.structs.replace
    match move:
        case "other_cohort":
            return replace(queue, cohort="c2")
        case "no_cohort":
            return replace(queue, parent="", cohort="")
        case "under_mid":
            return replace(queue, parent="m", cohort="")
    return replace(queue, parent="org", cohort="")


def report_step(how: str, job: str, run: int | None = None) -> Step:
    """An executor's report of one of REPORT_KINDS about the job's run `run` (None: its current run)."""
    match how:
        case "finish":
            return Step(finish=job if run is None else Report(job=job, run=run))
        case "fail" | "fail_retryable":
            return Step(fail=Ended(job=job, run=run, exit_code=1 if how == "fail" else 137))
    return Step(evict=Ended(job=job, run=run, reason="node_pressure"))


def next_policies(queue: QueueSpec) -> QueueSpec:
    """The queue with each of its preemption and flavor settings turned to its next value (the borrowing
    preemptor's threshold set with borrow_within_cohort lower-priority, at a class value between batch's and
    urgent's)."""
    fields: dict[str, Any] = {}
    for name, choices in POLICY_CHOICES.items():
        fields[name] = choices[(choices.index(getattr(queue, name)) + 1) % len(choices)]
    fields["borrow_within_cohort_max_priority"] = 500 if fields["borrow_within_cohort"] == "lower-priority" else None
    return msgspec.structs.replace(queue, **fields)
