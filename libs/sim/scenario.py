"""A declarative scenario run through the virtual-time pipeline of the real deciders and the simulated
executor (libs/sim/pipeline.py): its cluster, policy and timed events become the world's inputs; the run
ends `quiet_s` after the last event; the guarantee checker and the file's own expectations judge the log.

The file's shape is in libs/sim/scenario_model.py, the way back from inputs to a file in
libs/sim/scenario_write.py, the keys in docs/scenarios.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from contracts import (
    CancelJob,
    EventBase,
    GpuHealthChanged,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QueueSpec,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
    SubmitJob,
)
from libs.core.accounting.ledger import Ledger
from libs.core.kernel.decider import derived_id
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.queue_limits import ANY, check_tree
from libs.nodes.sim import (
    SYNTH_CPU_MILLI_PER_GPU,
    SYNTH_MEMORY_MIB_PER_GPU,
    device_specs,
    load_cluster_csv,
)
from libs.runtime.policy_file import PolicyFile, PolicyFileError, load_policy, policy_changes, tree_order
from libs.sim.guarantee_check import ViolationLike, check_all
from libs.sim.pipeline import SCRIPT, VirtualWorld, placement_ref
from libs.sim.scenario_model import NodeEntry, Report, Scenario, ScenarioError, Settings, Step

SOURCE = "scenario"


def node_spec(entry: NodeEntry) -> NodeSpec:
    """A node entry as the node's inventory: the short form means what the same row of a cluster CSV means."""
    if isinstance(entry.gpus, list):
        gpus = tuple(entry.gpus)
    else:
        gpus = device_specs(entry.name, entry.model, entry.gpus, entry.gpu_memory_mib or 0, entry.nvlink, entry.mig)
    cpu = entry.cpu_milli if entry.cpu_milli is not None else len(gpus) * SYNTH_CPU_MILLI_PER_GPU
    memory_mib = entry.memory_mib if entry.memory_mib is not None else len(gpus) * SYNTH_MEMORY_MIB_PER_GPU
    return NodeSpec(name=entry.name, gpus=gpus, cpu_milli=cpu, memory_mib=memory_mib, labels=dict(entry.labels),
                    rdma_nics=entry.rdma)


class StepIds:
    """The ids of the timed events' inputs, from what each says and when (and how many identical ones came
    before): taking one event out of a scenario leaves every other id, hence every tie-break, as it was."""

    def __init__(self) -> None:
        self.seen: Counter[bytes] = Counter()

    def __call__(self, step: Step) -> str:
        key = msgspec.json.encode(step)
        self.seen[key] += 1
        return derived_id(SOURCE, "event", key.decode(), self.seen[key])


def header_inputs(scenario: Scenario, base_dir: Path = Path(".")) -> list[EventBase]:
    """The cluster and the policy, at the scenario's start: every node, then the policy events a policy
    file would publish (classes and settings when not the defaults, then the queues, parents first)."""
    start = scenario.settings.start
    nodes = list(load_cluster_csv(base_dir / scenario.cluster.csv)) if scenario.cluster.csv else []
    nodes += [node_spec(n) for n in scenario.cluster.nodes]
    out: list[EventBase] = [NodeRegistered(id=derived_id(SOURCE, "node", n.name), ts=start, source=SOURCE,
                                           correlation_id=n.name, node=n) for n in nodes]
    return out + policy_changes(PolicyBook(), policy_of(scenario, base_dir), version=1, now=start)


def policy_of(scenario: Scenario, base_dir: Path) -> PolicyFile:
    try:
        if scenario.policy:
            if scenario.queues or scenario.settings.scheduling() != Settings().scheduling():
                raise ScenarioError("with a policy file, queues and scheduling settings come from it alone")
            return load_policy(base_dir / scenario.policy)
    except PolicyFileError as err:
        raise ScenarioError(str(err)) from err
    queues: dict[str, QueueSpec] = {}
    for q in tree_order(scenario.queues):  # the queue tree's checks, as for a policy file
        problem = "is defined twice" if q.name in queues else check_tree(queues, q)
        if problem is not None:
            raise ScenarioError(f"queue {q.name!r}: {problem}")
        queues[q.name] = q
    return PolicyFile(queues=list(scenario.queues), priority_classes=list(scenario.priority_classes),
                      settings=scenario.settings.scheduling())


def step_inputs(step: Step, eid: str, start: float, version: int = 1) -> list[EventBase]:
    """The world input one timed event makes, with id `eid` ([] for ticks only). `version`: the policy
    version a policy event carries."""
    name, value = step.action()
    ts = start + step.at

    def make(kind: type[EventBase], source: str = SOURCE, **fields: Any) -> list[EventBase]:
        return [kind(id=eid, ts=ts, source=source, **fields)]

    match name:
        case "submit":
            return make(SubmitJob, job_id=value.job, spec=value.spec())
        case "cancel":
            return make(CancelJob, job_id=value)
        case "node_lost" | "node_removed":
            return make(NodeLost, node=value, reason="scenario", removed=name == "node_removed")
        case "register":
            return make(NodeRegistered, correlation_id=value.name, node=node_spec(value))
        case "cordon" | "drain":
            return make(NodeCordoned, node=value, drain=name == "drain")
        case "uncordon":
            return make(NodeUncordoned, node=value)
        case "gpu":
            return make(GpuHealthChanged, node=value.node, index=value.index, healthy=value.healthy,
                        reason=value.reason or ("recovered" if value.healthy else "scenario"))
        case "queue":
            return make(QueuePolicyChanged, correlation_id=value.name, queue=value, version=version)
        case "priority_classes":
            return make(PriorityClassesChanged, classes=tuple(value), version=version)
        case "settings":
            return make(SchedulingSettingsChanged, settings=value, version=version)
        case "finish":
            if isinstance(value, str):
                return make(JobFinished, SCRIPT, job_id=value)
            return make(JobFinished, SCRIPT, job_id=value.job, run=run_of(value))
        case "fail":
            return make(JobFailed, SCRIPT, job_id=value.job, exit_code=value.exit_code,
                        reason=value.reason or "exit_code", run=run_of(value))
        case "evict":
            return make(JobEvicted, SCRIPT, job_id=value.job, reason=value.reason or "evicted", run=run_of(value))
    return []  # tick


def run_of(report: Report) -> str:
    """The `run` of a scripted report: the run the scenario names, by the job's placements ("": its current)."""
    return "" if report.run is None else placement_ref(report.run)


POLICY_STEPS = ("queue", "priority_classes", "settings")


def timed_inputs(scenario: Scenario) -> Iterator[EventBase]:
    """Every timed event's input, in time order (events at the same time in file order)."""
    version, ids = 1, StepIds()
    for step in sorted(scenario.events, key=lambda s: s.at):
        if step.action()[0] in POLICY_STEPS:
            version += 1
        yield from step_inputs(step, ids(step), scenario.settings.start, version)


def scenario_end(scenario: Scenario) -> float:
    """When the run ends: `quiet_s` after the last event (a tick event lasts its seconds)."""
    last = max((s.at + (s.tick or 0.0) for s in scenario.events), default=0.0)
    return scenario.settings.start + last + scenario.settings.quiet_s


def scenario_inputs(scenario: Scenario, base_dir: Path = Path(".")) -> list[EventBase]:
    return header_inputs(scenario, base_dir) + list(timed_inputs(scenario))


@dataclass
class JobOutcome:
    state: str
    code: str


@dataclass
class ScenarioRun:
    scenario: Scenario
    log: list[tuple[int, EventBase]]
    end: float
    violations: list[ViolationLike] = field(default_factory=list)
    unmet: list[str] = field(default_factory=list)  # expectations the run did not meet

    @property
    def passed(self) -> bool:
        return not self.violations and not self.unmet


def apply_input(world: VirtualWorld, event: EventBase) -> None:
    """One world input at its time, after the clock tick and the executor reports due then: what a scenario
    says happens at t happens once everything else at t has."""
    world.advance(event.ts)
    world.feed([event])
    world.advance(event.ts)


def run_inputs(inputs: list[EventBase], settings: Settings, end: float) -> list[tuple[int, EventBase]]:
    """The world inputs (in time order) through the pipeline, and its clock on to `end`."""
    world = VirtualWorld(settings.tick_s, start=settings.start)
    for event in inputs:
        apply_input(world, event)
    world.advance(end)
    return world.log


def run_scenario(scenario: Scenario, base_dir: Path = Path("."), replay: bool = False) -> ScenarioRun:
    """The scenario through the deciders and judged by the guarantees; with `replay`, its own decision log also
    replayed through the deciders, each decision that replays otherwise a `determinism` violation."""
    end = scenario_end(scenario)
    log = run_inputs(scenario_inputs(scenario, base_dir), scenario.settings, end)
    violations = check_all(log, replay)
    return ScenarioRun(scenario, log, end, violations, unmet_expectations(scenario, log, violations))


def job_outcomes(log: list[tuple[int, EventBase]]) -> dict[str, JobOutcome]:
    """Each job's state and reason code at the end of the log, as accounting records them."""
    ledger = Ledger()
    for seq, event in log:
        ledger.fold(event, seq)
    return {job: JobOutcome(view.state, view.reason) for job, view in sorted(ledger.state.jobs.items())}


def held_flavors(log: list[tuple[int, EventBase]]) -> dict[str, str]:
    """The flavor each job holds quota in at the end of the log: its last QuotaReserved's ("*" for the
    any-model flavor), unless given back since."""
    held: dict[str, str] = {}
    for _, event in log:
        if isinstance(event, QuotaReserved):
            held[event.job_id] = event.flavor or ANY
        elif isinstance(event, QuotaReleased):
            held.pop(event.job_id, None)
    return held


def last_placements(log: list[tuple[int, EventBase]]) -> dict[str, str]:
    """Where each job's last placement put it, replica by replica: "n1[0,1] n2[4]"."""
    return {event.job_id: " ".join(f"{p.node}[{','.join(map(str, p.gpu_indices))}]" for p in event.placements)
            for _, event in log if isinstance(event, JobPlaced)}


def unmet_expectations(scenario: Scenario, log: list[tuple[int, EventBase]],
                       violations: list[ViolationLike]) -> list[str]:
    expect = scenario.expect
    out: list[str] = []
    outcomes = job_outcomes(log) if expect.jobs else {}
    flavors = held_flavors(log) if any(want.flavor is not None for want in expect.jobs.values()) else {}
    placed = last_placements(log) if any(want.placed is not None for want in expect.jobs.values()) else {}
    for job, want in sorted(expect.jobs.items()):
        got = outcomes.get(job)
        if got is None:
            out.append(f"job {job}: expected {want.state or 'a record'}, the log never mentions it")
            continue
        if want.state is not None and got.state != want.state:
            out.append(f"job {job}: expected {want.state}, got {got.state}" + (f" ({got.code})" if got.code else ""))
        if want.code is not None and got.code != want.code:
            out.append(f"job {job}: expected code {want.code}, got {got.code or 'none'}")
        if want.placed is not None and placed.get(job, "") != want.placed:
            out.append(f"job {job}: expected placed on {want.placed or 'nothing'}, got {placed.get(job) or 'nothing'}")
        if want.flavor is not None and flavors.get(job, "") != want.flavor:
            out.append(f"job {job}: expected its quota in flavor {want.flavor or 'none'}, "
                       f"got {flavors.get(job) or 'none'}")
    if expect.violations is not None:
        found = sorted({v.guarantee for v in violations})
        if found != sorted(set(expect.violations)):
            out.append(f"expected violations {sorted(set(expect.violations))}, got {found}")
    return out
