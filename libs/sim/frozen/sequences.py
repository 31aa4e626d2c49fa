"""Seeded world sequences through the whole pipeline: the kinds of steps tests/unit/sim/test_pipeline_stateful.py
takes (submissions of every shape, cancellations, executors' reports current and late, nodes lost and
registered again, cordons and drains, queue changes, clock ticks), drawn from `random.Random(seed)`.

Both draw from one vocabulary (libs/sim/world_steps.py): changing it moves these inputs and calls for a
re-record. Like the test, a step may depend on what the world did so far (a report names a running job), so
the inputs follow the decisions."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec

from contracts import EventBase, FlavorQuota, QueueSpec
from libs.core.kernel.queue_limits import check_tree
from libs.sim.frozen.digest import Log
from libs.sim.pipeline import VirtualWorld
from libs.sim.scenario import POLICY_STEPS, StepIds, apply_input, header_inputs, node_spec, step_inputs
from libs.sim.scenario_model import Cluster, NodeEntry, Scenario, Step, Submit
from libs.sim.scenario_write import node_entry
from libs.sim.world_steps import (
    CHECKPOINT,
    DURATION,
    EXIT_PLAN,
    GAPS,
    GPU_MEMORY,
    GPU_MILLI,
    HUGE_GPUS,
    LABELS,
    MIG_PROFILES,
    MODELS,
    MODELS_ALLOWED,
    NODE_CHANGES,
    NODES,
    PRIORITY,
    QUEUE_CHANGES,
    QUEUE_OF_JOB,
    QUEUES,
    REPLICAS,
    REPORT_KINDS,
    SETTINGS,
    SHAPES,
    SPREAD,
    TOPOLOGY,
    WHOLE_GPUS,
    changed_queue,
    report_step,
)

STEPS = 40


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
