"""Seeded world sequences through the whole pipeline: the kinds of steps tests/unit/test_pipeline_stateful.py
takes (submissions of every shape, cancellations, executors' reports current and late, nodes lost and
registered again, cordons and drains, queue changes, clock ticks), drawn from `random.Random(seed)`.

A copy of that test's strategies rather than an import of them, on purpose: what the frozen net feeds the
deciders must not move when the property test's strategies are tuned. Like the test, a step may depend on
what the world did so far (a report names a running job), so the inputs follow the decisions."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from contracts import EventBase, FlavorQuota, QueueSpec
from libs.core.quotas import check_tree
from libs.sim.executor import SIM_EXIT_CODES
from libs.sim.frozen.digest import Log
from libs.sim.pipeline import VirtualWorld
from libs.sim.scenario import POLICY_STEPS, StepIds, apply_input, header_inputs, node_spec, step_inputs
from libs.sim.scenario_model import Cluster, Ended, NodeEntry, Report, Scenario, Settings, Step, Submit
from libs.sim.scenario_write import node_entry

SETTINGS = Settings(tick_s=5.0, quiet_s=600.0, preempt_min_remaining_s=0.0, starvation_after_s=120.0)
STEPS = 40
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
NODE_CHANGES = ("same", "fewer", "mig", "model", "new")
REPORT_KINDS = ("finish", "fail", "fail_retryable", "evict")
T = TypeVar("T")


def mostly(common: Sequence[T], rare: Sequence[T], odds: int) -> list[T]:
    """One flat list to choose from: one of `rare` about once in `odds` draws."""
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


def node_entry_of(rng: random.Random, name: str) -> NodeEntry:
    return NodeEntry(name=name, gpus=rng.randint(1, 8), model=rng.choice(MODELS), nvlink=rng.choice((0, 2, 4, 8)),
                     mig=rng.choice((False, False, True)), labels=dict(rng.choice(LABELS)))


def quota_fields(rng: random.Random) -> dict[str, Any]:
    """One flavor for any model (two times in three), or one quota per model (the order a job tries them)."""
    limits = (None, None, 0, 2, 4)
    if rng.randrange(3) < 2:
        return {"nominal_gpus": rng.choice((None, 0, 2, 4, 8, 16)), "borrowing_limit_gpus": rng.choice(limits),
                "lending_limit_gpus": rng.choice(limits)}
    models = rng.sample(MODELS, rng.randint(1, 3))
    return {"flavors": tuple(FlavorQuota(model=m, nominal_gpus=rng.choice((0, 2, 4, 8)),
                                         borrowing_limit_gpus=rng.choice(limits), lending_limit_gpus=rng.choice(limits))
                             for m in models)}


def queue_specs(rng: random.Random) -> list[QueueSpec]:
    cohort = rng.choice((False, True))
    out = [QueueSpec(name="org", team="org")] if cohort else []
    for name in QUEUES:
        out.append(QueueSpec(name=name, team=name, parent="org" if cohort else "",
                             reclaim_after_s=rng.choice((0.0, 0.0, 10.0, 60.0)), **quota_fields(rng)))
    return out


def submission(rng: random.Random, job: str, models: list[str]) -> Submit:
    """A submission of any shape the API accepts; `models`: those the cluster has."""
    queue = rng.choice(QUEUE_OF_JOB)
    shape = rng.choice(SHAPES)
    fields: dict[str, Any] = {}
    if shape == "whole":
        fields["gpus"] = rng.choice(WHOLE_GPUS)
    elif shape == "fraction":
        fields["gpu_milli"] = rng.choice(GPU_MILLI)
        fields["gpu_memory_mib"] = rng.choice(GPU_MEMORY)
    elif shape == "mig":
        fields["mig_profile"] = rng.choice(MIG_PROFILES)
    else:
        fields["gpus"] = rng.choice(HUGE_GPUS)
    allowed = rng.choice(MODELS_ALLOWED)
    gpu_models: tuple[str, ...] = ()
    if allowed == "one" or (allowed == "several" and len(models) < 2):
        gpu_models = (rng.choice(models),)
    elif allowed == "several":
        gpu_models = tuple(rng.sample(models, rng.randint(2, min(3, len(models)))))
    elif allowed == "unknown":
        gpu_models = ("V100",)
    topology = rng.choice(TOPOLOGY)
    return Submit(job=job, team=queue, queue=queue, replicas=rng.choice(REPLICAS), priority=rng.choice(PRIORITY),
                  topology=topology, topology_required=bool(topology) and rng.choice((False, True)),
                  spread=rng.choice(SPREAD), gpu_models=gpu_models, duration_s=rng.choice(DURATION),
                  checkpoint_interval_s=rng.choice(CHECKPOINT), labels=dict(rng.choice(EXIT_PLAN)), **fields)


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
    return replace(queue, reclaim_after_s=5.0)


def report_step(how: str, job: str, run: int | None = None) -> Step:
    """An executor's report of one of REPORT_KINDS about the job's run `run` (None: its current run)."""
    match how:
        case "finish":
            return Step(finish=job if run is None else Report(job=job, run=run))
        case "fail" | "fail_retryable":
            return Step(fail=Ended(job=job, run=run, exit_code=1 if how == "fail" else 137))
    return Step(evict=Ended(job=job, run=run, reason="node_pressure"))


class WorldSequence:
    """One seeded sequence: a cluster and queues, STEPS steps each followed by a pause, then a quiet period."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.world = self.make_world()
        self.now = SETTINGS.start
        self.ids = StepIds()
        self.version = 1
        self.nodes: dict[str, NodeEntry] = {}
        self.lost: set[str] = set()
        self.queues: dict[str, QueueSpec] = {}
        self.jobs: list[str] = []

    def make_world(self) -> VirtualWorld:
        return VirtualWorld(SETTINGS.tick_s, start=SETTINGS.start)

    def run(self) -> Log:
        rng = self.rng
        self.begin([node_entry_of(rng, name) for name in NODES[:rng.randint(1, 3)]], queue_specs(rng))
        for _ in range(STEPS):
            # A step that cannot be taken as drawn (a queue change the API would refuse) is drawn again.
            while not rng.choice(self.rules())():
                pass
        self.world.advance(self.now + SETTINGS.quiet_s)
        return self.world.log

    def rules(self) -> list[Callable[[], bool]]:
        """The steps possible now, each as often as it is to be drawn: submissions and runs ending weigh more
        than a uniform draw would give them, so that most sequences keep the deciders busy."""
        rules = [self.submit, self.submit, self.submit, self.register, self.change_queue, self.only_ticks]
        if self.jobs:
            rules += [self.cancel, self.late_report]
        if self.world.executor.running:
            rules += [self.end_run, self.end_run]
        if set(self.nodes) - self.lost:
            rules.append(self.lose_node)
        if self.nodes:
            rules.append(self.operate)
        return rules

    # --- driving --------------------------------------------------------------------------------------------

    def begin(self, entries: list[NodeEntry], queues: list[QueueSpec]) -> None:
        self.nodes = {e.name: e for e in entries}
        self.queues = {q.name: q for q in queues}
        for event in header_inputs(Scenario(settings=SETTINGS, cluster=Cluster(nodes=entries), queues=queues)):
            apply_input(self.world, event)

    def act(self, step: Step, gap: float) -> bool:
        if step.action()[0] in POLICY_STEPS:
            self.version += 1
        step = msgspec.structs.replace(step, at=round(self.now - SETTINGS.start, 6))
        self.apply(step_inputs(step, self.ids(step), SETTINGS.start, self.version))
        self.wait(gap)
        return True

    def apply(self, inputs: list[EventBase]) -> None:
        for event in inputs:
            apply_input(self.world, event)

    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.world.advance(self.now)

    def gap(self) -> float:
        return self.rng.choice(GAPS)

    # --- the steps ------------------------------------------------------------------------------------------

    def submit(self) -> bool:
        rng = self.rng
        count, gap = rng.choice((1, 1, 2, 4)), self.gap()
        models = sorted({node_spec(e).gpus[0].model for e in self.nodes.values()}) or list(MODELS)
        for i in range(count):
            job = f"j{len(self.jobs):02d}"
            self.jobs.append(job)
            self.act(Step(submit=submission(rng, job, models)), gap if i == count - 1 else 0.0)
        return True

    def cancel(self) -> bool:
        return self.act(Step(cancel=self.rng.choice(self.jobs)), self.gap())

    def end_run(self) -> bool:
        how = self.rng.choice(REPORT_KINDS)
        return self.act(report_step(how, self.rng.choice(sorted(self.world.executor.running))), self.gap())

    def late_report(self) -> bool:
        """A report naming a run by the job's placements: an earlier run of a job placed again, its current
        run, or one it has not had (yet)."""
        rng = self.rng
        how = rng.choice(REPORT_KINDS)
        placements = self.world.executor.placements
        placed_again = [j for j in self.jobs if len(placements.get(j, ())) >= 2]
        job = rng.choice(placed_again or self.jobs)
        run = rng.randint(1, len(placements.get(job, ())) + 1)
        return self.act(report_step(how, job, run), self.gap())

    def lose_node(self) -> bool:
        name = self.rng.choice(sorted(set(self.nodes) - self.lost))
        self.lost.add(name)
        return self.act(Step(node_lost=name), self.gap())

    def register(self) -> bool:
        rng = self.rng
        name, change = rng.choice(NODES), rng.choice(NODE_CHANGES)
        old = self.nodes.get(name)
        if old is None or change == "new":
            entry = node_entry_of(rng, name)
        else:
            entry = node_entry(node_spec(old))  # the short form, with every default spelled out
            gpus = entry.gpus if isinstance(entry.gpus, int) else len(entry.gpus)
            replace = msgspec.structs.replace
            if change == "fewer":
                entry = replace(entry, gpus=max(1, gpus // 2))
            elif change == "mig":
                entry = replace(entry, mig=not entry.mig)
            elif change == "model":
                entry = replace(entry, model=rng.choice([m for m in MODELS if m != entry.model]), gpu_memory_mib=None)
        self.nodes[name] = entry
        self.lost.discard(name)
        return self.act(Step(register=entry), self.gap())

    def operate(self) -> bool:
        rng = self.rng
        name, what = rng.choice(sorted(self.nodes)), rng.choice(("cordon", "drain", "uncordon"))
        step = {"cordon": Step(cordon=name), "drain": Step(drain=name), "uncordon": Step(uncordon=name)}[what]
        return self.act(step, self.gap())

    def change_queue(self) -> bool:
        rng = self.rng
        name, change, model = rng.choice(QUEUES), rng.choice(QUEUE_CHANGES), rng.choice(MODELS)
        queue = changed_queue(self.queues[name], change, model)
        others = {q.name: q for q in self.queues.values() if q.name != name}
        if check_tree(others, queue) is not None:
            return False  # what the queue API would refuse never reaches the log
        self.queues[name] = queue
        return self.act(Step(queue=queue), self.gap())

    def only_ticks(self) -> bool:
        self.wait(self.rng.choice((5.0, 30.0, 120.0, 600.0)))
        return True


def run_sequence(seed: int) -> Log:
    return WorldSequence(seed).run()
