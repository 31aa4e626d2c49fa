"""The whole pipeline (admission, quota, placement, preemption and the simulated executor, in virtual time) as
a state machine driven by arbitrary world inputs, with the guarantee checker as its invariant.

Each step is one thing the world does, at the current virtual time, followed by a pause of a few seconds of
clock ticks: a submission of any shape the API accepts (whole GPUs, fractions with and without GPU memory,
valid and invalid MIG profiles and vNPU templates, gangs, every topology required or preferred, spread, one
model, several, any GPU or any NPU, requests that can never fit), a cancellation, a running job finishing,
failing or evicted by its executor, a node (GPUs or Ascend NPUs) lost or registered again (the same, fewer
devices, MIG or vNPU split switched, another model, of the other vendor too), a cordon, a
drain or an uncordon, a queue change (nominal raised, lowered below usage, flavors removed, limits, a
budget that runs out mid-run, least attained service switched on or off, its preemption and flavor settings
turned; each queue starts with settings drawn too), a queue moved to another cohort, out
of one or to another parent (the tree is flat, one cohort, or three levels: org, a middle queue, leaves), a
priority class's value, minimum runtime or preemptibility changed while its jobs run, a scheduling setting
turned, or only the clock. The safety guarantees are checked after every step; liveness once the clock has
run on quietly at the end.

A failing sequence shrinks to a minimal one, which is written as a scenario file (`gpusched sim scenario
FILE --check` runs it again) to a temporary path and printed with the failure. The examples are derandomised
(the same sequences on every run); GPUSCHED_SOAK_EXAMPLES=N explores N sequences instead of the default, and
GPUSCHED_SOAK_SEED=1 with pytest's --hypothesis-seed=S other sequences for each S (a soak in chunks).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec
from hypothesis import HealthCheck, assume, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from contracts import EventBase, FlavorQuota, QueueSpec
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.core.kernel.queue_limits import check_tree
from libs.core.kernel.queue_policies import CHOICES as POLICY_CHOICES
from libs.core.kernel.queue_policies import LOWER_PRIORITY
from libs.sim import world_steps as steps
from libs.sim.guarantee_check import ViolationLike, check_liveness, check_safety
from libs.sim.pipeline import VirtualWorld
from libs.sim.scenario import (
    POLICY_STEPS,
    StepIds,
    apply_input,
    header_inputs,
    node_spec,
    run_scenario,
    scenario_inputs,
    step_inputs,
)
from libs.sim.scenario_model import (
    Cluster,
    Expect,
    NodeEntry,
    Scenario,
    Step,
    Submit,
    parse_scenario,
)
from libs.sim.scenario_write import node_entry, write_scenario
from libs.sim.world_steps import (
    CLASS_CHANGES,
    CLASS_VALUES,
    CLASSES,
    GAPS,
    MIG_PROFILES,
    MIN_RUNTIMES,
    MODELS,
    MORE_QUEUE_CHANGES,
    MOVES,
    NODES,
    QUEUE_CHANGES,
    QUEUES,
    REPORT_KINDS,
    SETTINGS,
    SETTINGS_CHANGES,
    TREE_SHAPES,
    changed_class,
    changed_queue,
    changed_settings,
    moved_queue,
    report_step,
)

EXAMPLES = int(os.environ.get("GPUSCHED_SOAK_EXAMPLES", "0")) or 200
# A soak split in chunks explores other sequences in each: GPUSCHED_SOAK_SEED=any turns derandomisation off, and
# pytest's --hypothesis-seed picks the chunk's sequences.
DERANDOMIZE = not os.environ.get("GPUSCHED_SOAK_SEED")
T = TypeVar("T")
COUNTEREXAMPLE_DIR = Path(tempfile.mkdtemp(prefix="gpusched-stateful-"))


# --- world inputs ---------------------------------------------------------------------------------------------


@functools.cache
def node_entries(name: str) -> st.SearchStrategy[NodeEntry]:
    return st.builds(NodeEntry, name=st.just(name), gpus=st.integers(1, 8), model=st.sampled_from(DEVICE_MODELS),
                     nvlink=st.sampled_from([0, 2, 4, 8]), mig=st.sampled_from([False, False, True]),
                     labels=st.sampled_from([{}, {"rack": "r1", "block": "b1"}, {"rack": "r2", "block": "b1"}]))


def quota_fields() -> st.SearchStrategy[dict[str, object]]:
    """One flavor for any model, or one quota per model (the order is the order a job tries them in)."""
    limit = st.sampled_from([None, None, 0, 2, 4])
    nominal = st.sampled_from([None, 0, 2, 4, 8, 16])
    any_model = st.fixed_dictionaries({"nominal_gpus": nominal, "borrowing_limit_gpus": limit,
                                       "lending_limit_gpus": limit})
    flavor = st.builds(FlavorQuota, model=st.sampled_from(DEVICE_MODELS), nominal_gpus=st.sampled_from([0, 2, 4, 8]),
                       borrowing_limit_gpus=limit, lending_limit_gpus=limit)
    per_model = st.lists(flavor, min_size=1, max_size=3, unique_by=lambda f: f.model).map(
        lambda fs: {"flavors": tuple(fs)})
    return st.one_of(any_model, any_model, per_model)


def policy_fields() -> st.SearchStrategy[dict[str, object]]:
    """A queue's preemption and flavor settings (libs/core/kernel/queue_policies.py), the defaults most often;
    a borrowing preemptor's threshold only with borrow_within_cohort lower-priority."""
    fields = {name: st.sampled_from([choices[0], choices[0], *choices[1:]]) for name, choices in POLICY_CHOICES.items()}
    return st.fixed_dictionaries(fields).flatmap(lambda drawn: st.fixed_dictionaries({
        **{name: st.just(value) for name, value in drawn.items()},
        "borrow_within_cohort_max_priority": st.sampled_from([None, 300, 500])
        if drawn["borrow_within_cohort"] == LOWER_PRIORITY else st.just(None)}))


@st.composite
def queues(draw: st.DrawFn) -> list[QueueSpec]:
    """The leaves a and b alone, in one cohort under org, or three levels deep: org, a middle queue m with
    quota of its own under it, a under m, and b under m or org."""
    shape = draw(st.sampled_from(TREE_SHAPES))
    out = [] if shape == "flat" else [QueueSpec(name="org", team="org")]
    if shape == "three_levels":
        out.append(QueueSpec(name="m", team="m", parent="org", **draw(quota_fields())))  # type: ignore[arg-type]
    for name in QUEUES:
        parent = "" if shape == "flat" else "org"
        if shape == "three_levels":
            parent = "m" if name == "a" else draw(st.sampled_from(["m", "org"]))
        leaf = QueueSpec(name=name, team=name, parent=parent,
                         reclaim_after_s=draw(st.sampled_from([0.0, 0.0, 10.0, 60.0])),
                         **draw(quota_fields()), **draw(policy_fields()))  # type: ignore[arg-type]
        out.append(governed_under_m(leaf))
    return out


def governed_under_m(queue: QueueSpec) -> QueueSpec:
    """A leaf under the middle queue has quota of its own: an ungoverned one is a known hole of quota (it is not
    bounded by its capped parent: KNOWN_HOLES in test_sim_scenario.py) the machine would find at once."""
    if queue.parent == "m" and queue.nominal_gpus is None and not queue.flavors:
        return msgspec.structs.replace(queue, nominal_gpus=0)
    return queue


def mostly(common: Sequence[T], rare: Sequence[T], odds: int) -> st.SearchStrategy[T]:
    """One of `common`, or one of `rare` about once in `odds` draws (libs/sim/world_steps.py's flat choice)."""
    return st.sampled_from(steps.mostly(common, rare, odds))


# Ascend servers beside the GPU models (an Ascend 910's NPUs in two HCCS rings of four, a 910B's in one mesh), their
# vNPU templates beside the MIG profiles, and jobs asking any NPU: the world steps' vocabulary (libs/sim/world_steps.py)
# stays as it is, since the frozen sequences draw from it.
DEVICE_MODELS = (*MODELS, "Ascend910", "Ascend910B")
VNPU_TEMPLATES = ("vir04", "vir16", "vir05_1c_16g", "vir03")

# Most submissions are ones the platform admits: bad queues, classes, models and sizes come rarely.
QUEUE_OF_JOB = st.sampled_from(steps.QUEUE_OF_JOB)
SHAPE = st.sampled_from(steps.SHAPES)
WHOLE_GPUS = st.sampled_from(steps.WHOLE_GPUS)
HUGE_GPUS = st.sampled_from(steps.HUGE_GPUS)
GPU_MILLI = st.sampled_from(steps.GPU_MILLI)
GPU_MEMORY = st.sampled_from(steps.GPU_MEMORY)
MIG_PROFILE = st.sampled_from((*MIG_PROFILES, *VNPU_TEMPLATES))
TOPOLOGY = st.sampled_from(steps.TOPOLOGY)
REPLICAS = st.sampled_from(steps.REPLICAS)
PRIORITY = st.sampled_from(steps.PRIORITY)
SPREAD = st.sampled_from(steps.SPREAD)
MODELS_ALLOWED = st.sampled_from((*steps.MODELS_ALLOWED, "any_npu"))
DURATION = st.sampled_from(steps.DURATION)
CHECKPOINT = st.sampled_from(steps.CHECKPOINT)
EXIT_PLAN = st.sampled_from(steps.EXIT_PLAN)


@st.composite
def submissions(draw: st.DrawFn, job: str, models: list[str]) -> Submit:
    """A submission of any shape the API accepts; `models`: those the cluster has."""
    queue = draw(QUEUE_OF_JOB)
    shape = draw(SHAPE)
    fields: dict[str, object] = {}
    if shape == "whole":
        fields["gpus"] = draw(WHOLE_GPUS)
    elif shape == "fraction":
        fields["gpu_milli"] = draw(GPU_MILLI)
        fields["gpu_memory_mib"] = draw(GPU_MEMORY)
    elif shape == "mig":
        fields["mig_profile"] = draw(MIG_PROFILE)
    else:
        fields["gpus"] = draw(HUGE_GPUS)
    allowed = draw(MODELS_ALLOWED)
    gpu_models: tuple[str, ...] = ()
    if allowed == "one" or (allowed == "several" and len(models) < 2):
        gpu_models = (draw(st.sampled_from(models)),)
    elif allowed == "several":
        gpu_models = tuple(draw(st.lists(st.sampled_from(models), min_size=2, max_size=3, unique=True)))
    elif allowed == "unknown":
        gpu_models = ("V100",)
    elif allowed == "any_npu":
        gpu_models = ("npu:*",)
    topology = draw(TOPOLOGY)
    return Submit(
        job=job, team=queue, queue=queue, replicas=draw(REPLICAS), priority=draw(PRIORITY), topology=topology,
        topology_required=bool(topology) and draw(st.booleans()), spread=draw(SPREAD), gpu_models=gpu_models,
        duration_s=draw(DURATION), checkpoint_interval_s=draw(CHECKPOINT), labels=draw(EXIT_PLAN),
        **fields)  # type: ignore[arg-type]


# --- the machine ----------------------------------------------------------------------------------------------


class PipelineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = VirtualWorld(SETTINGS.tick_s, start=SETTINGS.start)
        self.now = SETTINGS.start
        self.inputs: list[EventBase] = []
        self.steps = 0  # timed events so far
        self.ids = StepIds()
        self.version = 1
        self.nodes: dict[str, NodeEntry] = {}
        self.lost: set[str] = set()
        self.queues: dict[str, QueueSpec] = {}
        self.classes = {c.name: c for c in DEFAULT_PRIORITY_CLASSES}
        self.settings = SETTINGS.scheduling()
        self.jobs: list[str] = []
        self.failed = False

    # --- driving --------------------------------------------------------------------------------------

    def act(self, step: Step, gap: float) -> None:
        if step.action()[0] in POLICY_STEPS:
            self.version += 1
        step = msgspec.structs.replace(step, at=round(self.now - SETTINGS.start, 6))
        for event in step_inputs(step, self.ids(step), SETTINGS.start, self.version):
            self.inputs.append(event)
            self.guarded(lambda e=event: apply_input(self.world, e))
        self.steps += 1
        self.wait(gap)

    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.guarded(lambda: self.world.advance(self.now))

    def guarded(self, run: Callable[[], None]) -> None:
        """A decider that raises is a failure too: the sequence that made it raise is written out first."""
        try:
            run()
        except Exception as err:
            self.failed = True
            self.write("crash", f"{type(err).__name__}: {err}")
            raise

    def running(self) -> list[str]:
        return sorted(self.world.executor.running)

    def fail(self, violations: list[ViolationLike], when: str) -> None:
        """Write the sequence as a scenario file, then fail with the first violation."""
        self.failed = True
        first = violations[0]
        message = f"{when}: {first.guarantee} at seq {first.seq} (jobs {', '.join(first.jobs)}): {first.detail}"
        self.write(first.guarantee, message)
        raise AssertionError(message)

    def write(self, name: str, why: str) -> None:
        path = COUNTEREXAMPLE_DIR / f"{name}.yaml"
        note(f"scenario written to {path}:\n{self.scenario(path, name, why)}")

    def scenario(self, path: Path, name: str, why: str) -> str:
        """The sequence so far as a scenario file at `path` (its clock runs on to now); its text."""
        return write_scenario(self.inputs, path, settings=SETTINGS, until=self.now, name=name,
                              description=f"found by tests/unit/sim/test_pipeline_stateful.py: {why}",
                              expect=Expect(violations=[]))

    # --- the world ------------------------------------------------------------------------------------

    @initialize(data=st.data(), n_nodes=st.integers(1, 3), queue_specs=queues())
    def start(self, data: st.DataObject, n_nodes: int, queue_specs: list[QueueSpec]) -> None:
        self.begin([data.draw(node_entries(name)) for name in NODES[:n_nodes]], queue_specs)

    def begin(self, entries: list[NodeEntry], queue_specs: list[QueueSpec]) -> None:
        self.nodes = {e.name: e for e in entries}
        self.queues = {q.name: q for q in queue_specs}
        header = Scenario(settings=SETTINGS, cluster=Cluster(nodes=entries), queues=queue_specs)
        for event in header_inputs(header):
            self.inputs.append(event)
            apply_input(self.world, event)

    @rule(data=st.data(), count=st.sampled_from([1, 1, 2, 4]), gap=st.sampled_from(GAPS))
    def submit(self, data: st.DataObject, count: int, gap: float) -> None:
        models = sorted({node_spec(e).gpus[0].model for e in self.nodes.values()}) or list(DEVICE_MODELS)
        for i in range(count):
            job = f"j{len(self.jobs):02d}"
            self.jobs.append(job)
            self.act(Step(submit=data.draw(submissions(job, models))), gap if i == count - 1 else 0.0)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), gap=st.sampled_from(GAPS))
    def cancel(self, data: st.DataObject, gap: float) -> None:
        self.act(Step(cancel=data.draw(st.sampled_from(self.jobs))), gap)

    @precondition(lambda self: bool(self.world.executor.running))
    @rule(data=st.data(), how=st.sampled_from(REPORT_KINDS), gap=st.sampled_from(GAPS))
    def end_run(self, data: st.DataObject, how: str, gap: float) -> None:
        self.act(report_step(how, data.draw(st.sampled_from(self.running()))), gap)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data(), how=st.sampled_from(REPORT_KINDS), gap=st.sampled_from(GAPS))
    def late_report(self, data: st.DataObject, how: str, gap: float) -> None:
        """An executor's report read late (a slow agent's, an executor's after its restart), naming a run by
        the job's placements: an earlier run of a job placed again, which must change nothing of its current
        run; its current run; or one it has not had (yet), which does nothing."""
        placements = self.world.executor.placements
        placed_again = [j for j in self.jobs if len(placements.get(j, ())) >= 2]
        job = data.draw(st.sampled_from(placed_again or self.jobs))
        run = data.draw(st.integers(1, len(placements.get(job, ())) + 1))  # shrinks towards the first run
        self.act(report_step(how, job, run), gap)

    @precondition(lambda self: bool(set(self.nodes) - self.lost))
    @rule(data=st.data(), gap=st.sampled_from(GAPS))
    def lose_node(self, data: st.DataObject, gap: float) -> None:
        name = data.draw(st.sampled_from(sorted(set(self.nodes) - self.lost)))
        self.lost.add(name)
        self.act(Step(node_lost=name), gap)

    @rule(name=st.sampled_from(NODES), change=st.sampled_from(["same", "fewer", "mig", "model", "new"]),
          data=st.data(), gap=st.sampled_from(GAPS))
    def register(self, name: str, change: str, data: st.DataObject, gap: float) -> None:
        old = self.nodes.get(name)
        if old is None or change == "new":
            entry = data.draw(node_entries(name))
        else:
            entry = node_entry(node_spec(old))  # the short form, with every default spelled out
            gpus = entry.gpus if isinstance(entry.gpus, int) else len(entry.gpus)
            replace = msgspec.structs.replace
            entry = {"same": entry, "fewer": replace(entry, gpus=max(1, gpus // 2)),
                     "mig": replace(entry, mig=not entry.mig),
                     "model": replace(entry, gpu_memory_mib=None, model=data.draw(
                         st.sampled_from([m for m in DEVICE_MODELS if m != entry.model])))}[change]
        self.nodes[name] = entry
        self.lost.discard(name)
        self.act(Step(register=entry), gap)

    @precondition(lambda self: bool(self.nodes))
    @rule(data=st.data(), what=st.sampled_from(["cordon", "drain", "uncordon"]), gap=st.sampled_from(GAPS))
    def operate(self, data: st.DataObject, what: str, gap: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        self.act(Step(**{what: name}), gap)  # type: ignore[arg-type]

    @rule(name=st.sampled_from(QUEUES), model=st.sampled_from(DEVICE_MODELS), gap=st.sampled_from(GAPS),
          change=st.sampled_from([*QUEUE_CHANGES, *MORE_QUEUE_CHANGES]))
    def change_queue(self, name: str, change: str, model: str, gap: float) -> None:
        queue = changed_queue(self.queues[name], change, model)
        others = {q.name: q for q in self.queues.values() if q.name != name}
        assume(check_tree(others, queue) is None)  # what the queue API would refuse never reaches the log
        self.queues[name] = queue
        self.act(Step(queue=queue), gap)

    @rule(name=st.sampled_from(CLASSES), change=st.sampled_from(CLASS_CHANGES), value=st.sampled_from(CLASS_VALUES),
          min_runtime_s=st.sampled_from(MIN_RUNTIMES), gap=st.sampled_from(GAPS))
    def change_class(self, name: str, change: str, value: int, min_runtime_s: float, gap: float) -> None:
        """A priority class's value, minimum runtime or preemptibility changes while its jobs run and wait."""
        self.classes[name] = changed_class(self.classes[name], change, value, min_runtime_s)
        self.act(Step(priority_classes=list(self.classes.values())), gap)

    @rule(change=st.sampled_from(SETTINGS_CHANGES), gap=st.sampled_from(GAPS))
    def change_settings(self, change: str, gap: float) -> None:
        self.settings = changed_settings(self.settings, change)
        self.act(Step(settings=self.settings), gap)

    @precondition(lambda self: "org" in self.queues)
    @rule(name=st.sampled_from(QUEUES), move=st.sampled_from(MOVES), gap=st.sampled_from(GAPS))
    def move_queue(self, name: str, move: str, gap: float) -> None:
        """A queue moves to another cohort, out of any, or to another parent, with jobs running and waiting."""
        queue = governed_under_m(moved_queue(self.queues[name], move))
        others = {q.name: q for q in self.queues.values() if q.name != name}
        assume(queue != self.queues[name] and check_tree(others, queue) is None)
        self.queues[name] = queue
        self.act(Step(queue=queue), gap)

    @rule(seconds=st.sampled_from([5.0, 30.0, 120.0, 600.0]))
    def only_ticks(self, seconds: float) -> None:
        self.wait(seconds)

    # --- the guarantees -------------------------------------------------------------------------------

    @invariant()
    def safe(self) -> None:
        if not self.failed:
            violations = check_safety(self.world.log)
            if violations:
                self.fail(violations, "safety")

    def teardown(self) -> None:
        if self.failed or not self.inputs:
            return
        self.guarded(lambda: self.world.advance(self.now + SETTINGS.quiet_s))  # as the written scenario ends
        violations = check_liveness(self.world.log)
        if violations:
            self.fail(violations, "liveness after a quiet period")


PipelineMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None, derandomize=DERANDOMIZE, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
TestPipelineStateful = PipelineMachine.TestCase


def test_a_late_report_writes_out_as_the_same_run(tmp_path: Path) -> None:
    """A sequence with late reports (as a shrunk counterexample has them) is written as a scenario file that
    names each report's run, and the file runs again as the machine ran, event for event."""
    machine = PipelineMachine()
    machine.begin([NodeEntry(name="n0", gpus=1), NodeEntry(name="n1", gpus=1)],
                  [QueueSpec(name="a", team="a", nominal_gpus=2)])
    machine.act(Step(submit=Submit(job="j00", team="a", queue="a", gpus=1)), 5.0)
    machine.act(report_step("evict", "j00"), 5.0)  # back to its queue, and placed again
    assert len(machine.world.executor.placements["j00"]) == 2
    for how, run in [("finish", 1), ("fail_retryable", 1), ("evict", 1), ("fail", 3)]:  # 3: no such run yet
        machine.act(report_step(how, "j00", run), 5.0)
    assert machine.running() == ["j00"]
    text = machine.scenario(tmp_path / "late.yaml", "late", "late reports")
    again = parse_scenario((tmp_path / "late.yaml").read_text())
    assert text.count("run: 1") == 3 and "run: 3" in text
    assert scenario_inputs(again) == machine.inputs
    machine.teardown()  # the quiet period the written file ends with, and liveness
    replay = run_scenario(again)
    assert [e for _, e in replay.log] == [e for _, e in machine.world.log] and replay.passed
