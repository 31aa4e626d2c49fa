"""World inputs written out as a scenario file: a counterexample found by a property test, or the inputs of
a recorded log (`libs.sim.pipeline.world_inputs`), becomes a file that `gpusched sim scenario` runs again.

Inputs made by a scenario (libs/sim/scenario.py) come back as the same file: the run of the written file
is the run that made them, event for event."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from contracts import (
    CancelJob,
    EventBase,
    GpuHealthChanged,
    JobEvicted,
    JobFailed,
    JobFinished,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    PriorityClassesChanged,
    QueuePolicyChanged,
    SchedulingSettings,
    SchedulingSettingsChanged,
    SubmitJob,
)
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.sim.pipeline import placement_number
from libs.sim.scenario import node_spec
from libs.sim.scenario_model import (
    Cluster,
    Ended,
    Expect,
    GpuHealth,
    NodeEntry,
    Report,
    Scenario,
    ScenarioError,
    Settings,
    Step,
    Submit,
)

POLICY_EVENTS = (PriorityClassesChanged, SchedulingSettingsChanged, QueuePolicyChanged)


def node_entry(spec: NodeSpec) -> NodeEntry:
    """The short form when it says exactly this node, else every GPU spelled out."""
    gpus = sorted(spec.gpus, key=lambda g: g.index)
    if gpus:
        groups = [g.nvlink_group for g in gpus]
        nvlink = 0 if groups[0] < 0 else groups.count(groups[0])
        short = NodeEntry(name=spec.name, gpus=len(gpus), model=gpus[0].model, gpu_memory_mib=gpus[0].memory_mib,
                          nvlink=nvlink, mig=gpus[0].mig_enabled, cpu_milli=spec.cpu_milli,
                          memory_mib=spec.memory_mib, rdma=spec.rdma_nics, labels=dict(spec.labels))
        if node_spec(short) == spec:
            defaults = node_spec(msgspec.structs.replace(short, gpu_memory_mib=None, cpu_milli=None, memory_mib=None))
            usual_memory = defaults.gpus[0].memory_mib == gpus[0].memory_mib
            return msgspec.structs.replace(
                short, gpu_memory_mib=None if usual_memory else short.gpu_memory_mib,
                cpu_milli=None if defaults.cpu_milli == spec.cpu_milli else spec.cpu_milli,
                memory_mib=None if defaults.memory_mib == spec.memory_mib else spec.memory_mib)
    return NodeEntry(name=spec.name, gpus=list(spec.gpus), cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib,
                     rdma=spec.rdma_nics, labels=dict(spec.labels))


def step_of(event: EventBase, at: float) -> Step:
    """The timed event that makes this input."""
    match event:
        case SubmitJob():
            return Step(at=at, submit=Submit(job=event.job_id, **msgspec.structs.asdict(event.spec)))
        case CancelJob():
            return Step(at=at, cancel=event.job_id)
        case NodeLost():
            return Step(at=at, node_removed=event.node) if event.removed else Step(at=at, node_lost=event.node)
        case NodeRegistered():
            return Step(at=at, register=node_entry(event.node))
        case NodeCordoned():
            return Step(at=at, drain=event.node) if event.drain else Step(at=at, cordon=event.node)
        case NodeUncordoned():
            return Step(at=at, uncordon=event.node)
        case GpuHealthChanged():
            return Step(at=at, gpu=GpuHealth(node=event.node, index=event.index, healthy=event.healthy,
                                             reason=event.reason))
        case QueuePolicyChanged():
            return Step(at=at, queue=event.queue)
        case PriorityClassesChanged():
            return Step(at=at, priority_classes=list(event.classes))
        case SchedulingSettingsChanged():
            return Step(at=at, settings=event.settings)
        case JobFinished():
            run = run_number(event)
            return Step(at=at, finish=event.job_id if run is None else Report(job=event.job_id, run=run))
        case JobFailed():
            return Step(at=at, fail=Ended(job=event.job_id, exit_code=event.exit_code, run=run_number(event),
                                          reason="" if event.reason == "exit_code" else event.reason))
        case JobEvicted():
            return Step(at=at, evict=Ended(job=event.job_id, run=run_number(event),
                                           reason="" if event.reason == "evicted" else event.reason))
    raise ScenarioError(f"a scenario cannot say {type(event).__name__} ({event.id})")


def run_number(event: JobFinished | JobFailed | JobEvicted) -> int | None:
    """The run a scripted report names, counted by the job's placements; None: its current run. A report
    naming a placement by its id belongs to a recorded log's executor, not to the world's inputs."""
    if not event.run:
        return None
    number = placement_number(event.run)
    if number is None:
        raise ScenarioError(f"a scenario names a run by the job's placements, not by id ({event.id}: {event.run})")
    return number


def scenario_of(inputs: Sequence[EventBase], settings: Settings | None = None, until: float | None = None,
                name: str = "", description: str = "", expect: Expect | None = None) -> Scenario:
    """The scenario whose inputs these are. The nodes and the policy at the start (before anything else)
    become its cluster and policy; `until` (virtual time): the clock runs to there before the quiet period."""
    settings = settings or Settings(start=inputs[0].ts if inputs else Settings().start)
    start = settings.start
    rest = list(inputs)
    nodes: list[NodeEntry] = []
    while rest and isinstance(rest[0], NodeRegistered) and rest[0].ts == start:
        nodes.append(node_entry(rest[0].node))
        rest.pop(0)
    classes, scheduling, queues = list(DEFAULT_PRIORITY_CLASSES), SchedulingSettings(), []
    seen: set[object] = set()
    while rest and isinstance(rest[0], POLICY_EVENTS) and rest[0].ts == start:
        event = rest[0]
        key = event.queue.name if isinstance(event, QueuePolicyChanged) else type(event)
        if key in seen:
            break  # a second change of the same thing: a timed event
        seen.add(key)
        rest.pop(0)
        if isinstance(event, PriorityClassesChanged):
            classes = list(event.classes)
        elif isinstance(event, SchedulingSettingsChanged):
            scheduling = event.settings
        elif isinstance(event, QueuePolicyChanged):
            queues.append(event.queue)
    settings = Settings(**{**msgspec.structs.asdict(settings), **msgspec.structs.asdict(scheduling)})
    steps = [step_of(e, round(e.ts - start, 6)) for e in rest]
    last = max((s.at for s in steps), default=0.0)
    if until is not None and until - start > last:
        steps.append(Step(at=last, tick=round(until - start - last, 6)))
    return Scenario(name=name, description=description, settings=settings, cluster=Cluster(nodes=nodes),
                    queues=queues, priority_classes=classes, events=steps, expect=expect or Expect())


def dump_scenario(scenario: Scenario) -> str:
    """YAML: sections in block style, each node and each event on one line."""
    raw: dict[str, Any] = msgspec.to_builtins(scenario)
    if scenario.priority_classes == list(DEFAULT_PRIORITY_CLASSES):
        raw.pop("priority_classes", None)
    events = raw.pop("events", [])
    nodes = raw.get("cluster", {}).pop("nodes", [])
    if not raw.get("cluster"):
        raw.pop("cluster", None)
    expect = raw.pop("expect", None)
    text = yaml.safe_dump(raw, sort_keys=False, width=120)
    if nodes:
        text += "cluster:\n  nodes:\n" + "".join(f"    - {_line(n)}\n" for n in nodes)
    if events:
        text += "events:\n" + "".join(f"  - {_line(_job_first(e))}\n" for e in events)
    if expect:
        text += yaml.safe_dump({"expect": expect}, sort_keys=False, width=120)
    return text


def _job_first(step: dict[str, Any]) -> dict[str, Any]:
    if "submit" in step:
        submit = dict(step["submit"])
        step = {**step, "submit": {"job": submit.pop("job"), **submit}}
    return step


def _line(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()


def write_scenario(inputs: Sequence[EventBase], path: str | Path | None = None, *, settings: Settings | None = None,
                   until: float | None = None, name: str = "", description: str = "",
                   expect: Expect | None = None) -> str:
    """The scenario file of these world inputs (see scenario_of), written to `path` when given; its text."""
    text = dump_scenario(scenario_of(inputs, settings, until, name, description, expect))
    if path is not None:
        Path(path).write_text(text)
    return text
