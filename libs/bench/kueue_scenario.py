"""Kueue's scheduler performance scenario (test/performance/scheduler, `generator.yaml`) as gpusched inputs:
the queues and priority classes of a policy file, a cluster that holds the nominal quotas, and the
submission schedule. Pure: text in, values out; the runner does the I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contracts import JobSpec
from libs.sim.declare import redeclared

# Where the job's Kueue workload class travels, so the metrics need nothing but the log.
CLASS_LABEL = "kueue-class"
GPU_MODEL = "H100"
GPUS_PER_NODE = 8
# Generous CPU and memory per node: the scenario asks for GPUs only.
NODE_CPU_MILLI = 192_000
NODE_MEMORY_MIB = 2_097_152


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    name: str
    runtime_ms: int
    priority: int
    request: int


@dataclass(frozen=True, slots=True)
class WorkloadsSet:
    count: int
    interval_ms: int
    workloads: tuple[WorkloadClass, ...]


@dataclass(frozen=True, slots=True)
class QueueDef:
    """One Kueue ClusterQueue."""

    name: str
    cohort: str
    nominal: int
    borrowing_limit: int | None
    workloads_sets: tuple[WorkloadsSet, ...]


@dataclass(frozen=True, slots=True)
class PlannedJob:
    at_ms: int  # after the start of the run
    job_id: str
    workload_class: str
    spec: JobSpec


def _field(node: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(node, dict) or key not in node:
        raise ScenarioError(f"{where}: missing {key!r}")
    return node[key]


def _count(node: dict[str, Any], where: str, scale: float = 1.0) -> int:
    count = int(_field(node, "count", where))
    return max(1, round(count * scale)) if count > 0 else 0


def parse_scenario(text: str, scale: float = 1.0) -> list[QueueDef]:
    """Every ClusterQueue of the generator, in order; `scale` multiplies each workloadsSet's count."""
    doc = yaml.safe_load(text)
    queues: list[QueueDef] = []
    cohort_index = 0
    for c_pos, cohort_set in enumerate(_field(doc, "cohorts", "generator")):
        where = f"cohorts[{c_pos}]"
        for _ in range(_count(cohort_set, where)):
            cohort = f"{_field(cohort_set, 'className', where)}-{cohort_index}"
            queue_index = 0
            for q_pos, queue_set in enumerate(_field(cohort_set, "queuesSets", where)):
                qwhere = f"{where}.queuesSets[{q_pos}]"
                sets = tuple(_workloads_set(ws, f"{qwhere}.workloadsSets[{i}]", scale)
                             for i, ws in enumerate(_field(queue_set, "workloadsSets", qwhere)))
                limit = queue_set.get("borrowingLimit")
                for _ in range(_count(queue_set, qwhere)):
                    queues.append(QueueDef(
                        name=f"{_field(queue_set, 'className', qwhere)}-{cohort_index}-{queue_index}", cohort=cohort,
                        nominal=int(_field(queue_set, "nominalQuota", qwhere)),
                        borrowing_limit=None if limit is None else int(limit), workloads_sets=sets))
                    queue_index += 1
            cohort_index += 1
    return queues


def _workloads_set(node: dict[str, Any], where: str, scale: float) -> WorkloadsSet:
    workloads = tuple(
        WorkloadClass(name=str(_field(w, "className", f"{where}.workloads[{i}]")),
                      runtime_ms=int(_field(w, "runtimeMs", where)), priority=int(_field(w, "priority", where)),
                      request=int(_field(w, "request", where)))
        for i, w in enumerate(_field(node, "workloads", where)))
    return WorkloadsSet(count=_count(node, where, scale), interval_ms=int(_field(node, "creationIntervalMs", where)),
                        workloads=workloads)


def load_scenario(path: Path, scale: float = 1.0) -> list[QueueDef]:
    try:
        return parse_scenario(path.read_text(), scale)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"generator {path} not found") from err
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: {err}") from err


def gang_shape(request: int, gpus_per_node: int = GPUS_PER_NODE, replica_gpus: int = 1) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a request of `request` GPUs.

    Kueue's scenario counts quota units, not nodes: any free unit serves any workload. The faithful
    equivalent is a gang of `replica_gpus`-GPU replicas (default 1), so that any free GPU can hold a piece,
    as in Kueue's test. With `replica_gpus` 0, requests are shaped as on real nodes instead: one replica when
    it fits a node, else replicas tiling nodes (the largest size dividing both request and node: 20 on 8 is
    5 x 4), which adds placement fragmentation to the test."""
    if replica_gpus >= 1 and request % replica_gpus == 0 and replica_gpus <= gpus_per_node:
        return request // replica_gpus, replica_gpus
    if request <= gpus_per_node:
        return 1, request
    per_replica = max(d for d in range(1, gpus_per_node + 1) if request % d == 0 and gpus_per_node % d == 0)
    return request // per_replica, per_replica


def priority_class(priority: int) -> str:
    return f"p{priority}"


def plan_jobs(queues: list[QueueDef], gpus_per_node: int = GPUS_PER_NODE, replica_gpus: int = 1,
              declare: str = "oracle") -> list[PlannedJob]:
    """Workload k of each class of a workloadsSet is created k * creationIntervalMs after the start, in
    every queue; sorted by time (then queue order, as created). Each runs its class's runtime; it declares it
    exactly (`oracle`, as Kueue's scenario does) or as `declare` says (libs/sim/declare.py)."""
    jobs: list[PlannedJob] = []
    for q in queues:
        for s_index, ws in enumerate(q.workloads_sets):
            for k in range(ws.count):
                for w in ws.workloads:
                    replicas, gpus = gang_shape(w.request, gpus_per_node, replica_gpus)
                    job_id = f"{q.name}-{s_index}-{w.name}-{k}"
                    spec = JobSpec(team=q.name, queue=q.name, name=job_id, priority=priority_class(w.priority),
                                   replicas=replicas, gpus=gpus, duration_s=w.runtime_ms / 1000,
                                   labels={CLASS_LABEL: w.name})
                    spec = redeclared(spec, declare, seed=1, key=job_id)
                    jobs.append(PlannedJob(at_ms=k * ws.interval_ms, job_id=job_id, workload_class=w.name, spec=spec))
    jobs.sort(key=lambda j: j.at_ms)  # stable: queue order within an instant
    return jobs


def policy_toml(queues: list[QueueDef]) -> str:
    """The policy file: one queue per ClusterQueue, one preemptible priority class per priority value."""
    lines: list[str] = []
    for q in queues:
        lines += ["[[queues]]", f'name = "{q.name}"', f'team = "{q.name}"', f'cohort = "{q.cohort}"',
                  f"nominal_gpus = {q.nominal}"]
        if q.borrowing_limit is not None:
            lines.append(f"borrowing_limit_gpus = {q.borrowing_limit}")
        lines.append("")
    priorities = sorted({w.priority for q in queues for ws in q.workloads_sets for w in ws.workloads}, reverse=True)
    for p in priorities:
        lines += ["[[priority_classes]]", f'name = "{priority_class(p)}"', f"value = {p}", "preemptible = true", ""]
    return "\n".join(lines)


def node_count(queues: list[QueueDef], gpus_per_node: int = GPUS_PER_NODE) -> int:
    """Enough nodes to hold the sum of the nominal quotas (600 GPUs: 75 nodes of 8)."""
    return max(1, math.ceil(sum(q.nominal for q in queues) / gpus_per_node))


def cluster_csv(queues: list[QueueDef], gpus_per_node: int = GPUS_PER_NODE, model: str = GPU_MODEL) -> str:
    nodes = node_count(queues, gpus_per_node)
    rows = ["sn,cpu_milli,memory_mib,gpu,model,nvlink"]
    rows += [f"bench-{model.lower()}-{i:03d},{NODE_CPU_MILLI},{NODE_MEMORY_MIB},{gpus_per_node},{model},{gpus_per_node}"
             for i in range(nodes)]
    return "\n".join(rows) + "\n"
