"""The scenario file (YAML): a cluster, a policy, timed world events and what the run should show.

Its shape is checked by msgspec (unknown keys are errors); docs/scenarios.md describes every key. Times are
seconds of virtual time from the scenario's start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from contracts import GpuSpec, JobSpec, PriorityClass, QueueSpec, SchedulingSettings
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES

# An instant of virtual time (2027-01-15 08:00 UTC): budgets per calendar period need a calendar.
START = 1_800_000_000.0


class ScenarioError(ValueError):
    pass


class Settings(SchedulingSettings, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The platform-wide scheduling settings (as a policy file's [settings]) and the run's own clock."""

    tick_s: float = 5.0
    # After the last event the clock runs on this long before the run ends: time for what was set going to
    # play out, then a quiet log, at the end of which liveness is judged.
    quiet_s: float = 600.0
    start: float = START

    def scheduling(self) -> SchedulingSettings:
        return SchedulingSettings(**{f: getattr(self, f) for f in SchedulingSettings.__struct_fields__})


class NodeEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A node in short form (`gpus: 8`, as a row of the openb CSV with its optional columns) or with every
    GPU spelled out (`gpus: [{index: 0, model: A100, ...}]`)."""

    name: str
    gpus: int | list[GpuSpec] = 8
    model: str = "A100"
    gpu_memory_mib: int | None = None  # None: the model's usual memory
    nvlink: int = 0  # size of each NVLink domain (8: one domain of eight GPUs); 0: PCIe only
    mig: bool = False
    cpu_milli: int | None = None  # None: 16 cores per GPU
    memory_mib: int | None = None  # None: 128 GiB per GPU
    rdma: int = 0
    labels: dict[str, str] = {}


class Cluster(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    csv: str = ""  # a node list in the openb format, relative to the scenario file
    nodes: list[NodeEntry] = []


class Submit(JobSpec, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Any JobSpec field, and the job's id."""

    job: str

    def spec(self) -> JobSpec:
        return JobSpec(**{f: getattr(self, f) for f in JobSpec.__struct_fields__})


class Report(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """An executor's report about a job's run. `run` names the run by the job's placements, counted from 1
    (1: its first run): a report naming a run that is over is a late one (a slow agent's, an executor's after
    its restart), which must change nothing. None: the job's current run."""

    job: str
    run: Annotated[int, msgspec.Meta(ge=1)] | None = None


class Ended(Report, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A running job's process exits (fail: with a non-zero code) or its executor stops it (evict)."""

    exit_code: int = 1
    reason: str = ""


class GpuHealth(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    node: str
    index: int
    healthy: bool = False
    reason: str = ""


class Step(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One timed event: `at` and exactly one action."""

    at: float = 0.0
    submit: Submit | None = None
    cancel: str | None = None
    node_lost: str | None = None
    node_removed: str | None = None  # the node leaves the inventory (an operator's removal, a source change)
    register: NodeEntry | None = None  # a node registers (again), maybe with another spec
    cordon: str | None = None
    drain: str | None = None
    uncordon: str | None = None
    gpu: GpuHealth | None = None
    queue: QueueSpec | None = None  # a queue created or changed: its whole new spec
    priority_classes: list[PriorityClass] | None = None
    settings: SchedulingSettings | None = None
    finish: str | Report | None = None  # a running job's process exits with 0 (the job's id, or a Report)
    fail: Ended | None = None
    evict: Ended | None = None
    tick: float | None = None  # nothing but clock ticks for this many seconds

    def action(self) -> tuple[str, Any]:
        chosen = [(name, getattr(self, name)) for name in ACTIONS if getattr(self, name) is not None]
        if len(chosen) != 1:
            names = ", ".join(n for n, _ in chosen) or "none"
            raise ScenarioError(f"event at {self.at:g} s: exactly one action per event, got {names}")
        return chosen[0]


ACTIONS = tuple(f for f in Step.__struct_fields__ if f != "at")


class JobExpectation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a job's record says at the end: state (pending, running, succeeded, failed, cancelled, rejected)
    and, for a rejection or a wait, its reason code; and the flavor its quota is held in at the end (the
    GPU model of its last QuotaReserved not given back since; "*" for the any-model flavor, "" for none)."""

    state: str | None = None
    code: str | None = None
    flavor: str | None = None
    # Where its last placement put it, replica by replica: "n1[0,1] n2[4]" (node and device indices).
    placed: str | None = None


class Expect(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    jobs: dict[str, JobExpectation] = {}
    # The guarantees the run breaks, by id ([]: none); None: not stated.
    violations: list[str] | None = None


class Scenario(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: str = ""
    description: str = ""
    settings: Settings = msgspec.field(default_factory=Settings)
    cluster: Cluster = msgspec.field(default_factory=Cluster)
    # A policy file (TOML, as infra/config/demo.toml) whose queues, classes and settings come first.
    policy: str = ""
    queues: list[QueueSpec] = []
    priority_classes: list[PriorityClass] = msgspec.field(default_factory=lambda: list(DEFAULT_PRIORITY_CLASSES))
    events: list[Step] = []
    expect: Expect = msgspec.field(default_factory=Expect)


def parse_scenario(text: str | bytes, origin: str = "scenario") -> Scenario:
    try:
        raw = yaml.safe_load(text)
        scenario = msgspec.convert(raw if raw is not None else {}, Scenario, strict=False)
    except yaml.YAMLError as err:
        raise ScenarioError(f"{origin}: not YAML: {err}") from err
    except msgspec.ValidationError as err:
        raise ScenarioError(f"{origin}: {err}") from err
    for step in scenario.events:
        step.action()
        if step.at < 0 or (step.tick is not None and step.tick < 0):
            raise ScenarioError(f"{origin}: event at {step.at:g} s: times are seconds from the start, never negative")
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        return parse_scenario(path.read_bytes(), str(path))
    except FileNotFoundError as err:
        raise ScenarioError(f"scenario file {path} not found") from err
