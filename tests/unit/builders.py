"""Fluent builders for the unit tests of the pure decision core.

`node(...)`, `job(...)` and `queue(...)` build value objects; `EventFeed` stamps input events (id, ts, seq),
runs them through `run_decider` for every decider that consumes them, routes the decisions on to the
others (and to an optional Ledger), and returns every decision the input caused, in log order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from contracts import (
    EventBase,
    GpuSpec,
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    NodeSpec,
    QueuePolicyChanged,
    QueueSpec,
    QuotaReserved,
    SubmitJob,
)
from libs.core.accounting.ledger import Ledger
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import Decider, run_decider
from libs.core.kernel.policy import demand_milli
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider

GPU_MEMORY_MIB = 81_920
E = TypeVar("E", bound=EventBase)


def node(name: str, gpus: int = 8, model: str = "A100", *, extra: dict[str, int] | None = None,
         cpu_milli: int = 64_000, memory_mib: int = 512_000, gpu_memory_mib: int = GPU_MEMORY_MIB) -> NodeSpec:
    """`gpus` GPUs of `model` (indices 0..), then `extra` {model: count} GPUs after them."""
    models = [model] * gpus + [m for m, n in (extra or {}).items() for _ in range(n)]
    return NodeSpec(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib,
                    gpus=tuple(GpuSpec(index=i, model=m, memory_mib=gpu_memory_mib) for i, m in enumerate(models)))


def queue(name: str = "ml-train", team: str = "ml", nominal_gpus: int | None = None) -> QueueSpec:
    return QueueSpec(name=name, team=team, nominal_gpus=nominal_gpus)


@dataclass(frozen=True)
class Job:
    spec: JobSpec

    def _with(self, **fields: Any) -> Job:
        return Job(msgspec.structs.replace(self.spec, **fields))

    def gpus(self, n: int) -> Job:
        return self._with(gpus=n, gpu_milli=0)

    def fraction(self, milli: int) -> Job:
        return self._with(gpus=1, gpu_milli=milli)

    def replicas(self, n: int) -> Job:
        return self._with(replicas=n)

    def priority(self, name: str) -> Job:
        return self._with(priority=name)

    def models(self, *names: str) -> Job:
        return self._with(gpu_models=names)

    def host(self, cpu_milli: int = 0, memory_mib: int = 0) -> Job:
        return self._with(cpu_milli=cpu_milli, memory_mib=memory_mib)

    def having(self, **fields: Any) -> Job:
        return self._with(**fields)


def job(team: str = "ml", queue: str = "ml-train", **fields: Any) -> Job:
    return Job(JobSpec(team=team, queue=queue, **fields))


def spec_of(j: Job | JobSpec) -> JobSpec:
    return j.spec if isinstance(j, Job) else j


class EventFeed:
    def __init__(self, *deciders: Decider, ledger: Ledger | None = None, t0: float = 1_000.0) -> None:
        self.deciders = deciders
        self.ledger = ledger
        self.now = t0
        self.seq = 0
        self.log: list[EventBase] = []
        self._inputs = 0

    def at(self, ts: float) -> EventFeed:
        self.now = ts
        return self

    def send(self, event_type: type[EventBase], /, **fields: Any) -> list[EventBase]:
        self._inputs += 1
        return self.deliver(event_type(id=f"input-{self._inputs}", ts=self.now, source="test", **fields))

    def deliver(self, event: EventBase) -> list[EventBase]:
        todo, decisions = deque([event]), []
        while todo:
            ev = todo.popleft()
            self.seq += 1
            self.log.append(ev)
            if self.ledger is not None:
                self.ledger.fold(ev, self.seq)
            for d in self.deciders:
                if type(ev) in tuple(d.input_types()):
                    out = run_decider(d, ev, self.seq)
                    decisions.extend(out)
                    todo.extend(out)
        return decisions

    # --- the usual inputs ----------------------------------------------------------------------

    def nodes(self, *specs: NodeSpec) -> list[EventBase]:
        return [d for s in specs for d in self.send(NodeRegistered, node=s)]

    def queues(self, *specs: QueueSpec) -> list[EventBase]:
        return [d for i, s in enumerate(specs) for d in self.send(QueuePolicyChanged, queue=s, version=i + 1)]

    def submit(self, job_id: str, j: Job | JobSpec) -> list[EventBase]:
        """The producer's command (for admission, or a whole pipeline)."""
        return self.send(SubmitJob, job_id=job_id, spec=spec_of(j))

    def admit(self, job_id: str, j: Job | JobSpec) -> list[EventBase]:
        """What admission says about an accepted job (for quota alone)."""
        spec = spec_of(j)
        return self.send(JobSubmitted, job_id=job_id, spec=spec) + self.send(JobAdmitted, job_id=job_id,
                                                                             queue=spec.queue)

    def reserve(self, job_id: str, j: Job | JobSpec) -> list[EventBase]:
        """What admission and quota say about a job allowed to run (for placement alone)."""
        spec = spec_of(j)
        return self.send(JobSubmitted, job_id=job_id, spec=spec) + self.send(
            QuotaReserved, job_id=job_id, queue=spec.queue, gpu_milli=demand_milli(spec))


def pipeline(ledger: bool = False) -> EventFeed:
    """Admission, quota, placement and preemption wired as the bus wires them."""
    return EventFeed(AdmissionDecider(), QuotaDecider(), PlacementDecider(), PreemptionDecider(),
                     ledger=Ledger() if ledger else None)


def kinds(decisions: list[EventBase]) -> list[str]:
    return [type(d).__name__ for d in decisions]


def of(decisions: list[EventBase], event_type: type[E]) -> list[E]:
    return [d for d in decisions if isinstance(d, event_type)]


def brief(decisions: list[EventBase]) -> list[tuple[str, str]]:
    """(type, job id) per decision: the shape most assertions need."""
    return [(type(d).__name__, getattr(d, "job_id", None) or getattr(d, "preemptor_id", "")) for d in decisions]
