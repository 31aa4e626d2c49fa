"""Which nodes someone serves: each node's owner (the executor that announced it) and the runs on it.

A node is served by the executor that announced it: node-telemetry's own backend (the simulated cluster),
a node agent, or the Kubernetes bridge. Two things trap jobs on a node nobody serves, and this book undoes
both:
- The platform started with another cluster source than the one in its log (the simulated demo, then
  `up --agents 2` in the same folder): the nodes of the old source are nobody's now. `reconcile` removes
  them (`NodeLost(removed=True)`, audited with the reason), and a simulated node the cluster file no longer
  lists too.
- A node is lost or removed (heartbeat timeout, reconciliation, an operator's `node remove`) but no executor
  is left to report its jobs stopped. `orphans` reports each run still on a node lost for `grace_s` as
  evicted (`node_lost`), under the ids the executor itself would use (libs/nodes/reports.py), so that a
  late report of the executor, or one it made first (with its checkpoint), is the same message and the
  server keeps only one. The grace gives a live executor the first word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    NodeLost,
    NodeRegistered,
    NodeSpec,
)
from libs.core.kernel.decider import derived_id
from libs.nodes.reports import RunReports

SERVICE = "node-telemetry"
AGENT_SOURCE = "agent/"
BRIDGE_SOURCE = "kube-bridge"
# Owners: who announced a node, hence who runs its jobs.
OWN_BACKEND, AGENTS, KUBERNETES = "node-telemetry", "agents", "kubernetes"
# What each owner is called in an operator's words.
OWNER_NAMES = {OWN_BACKEND: "the simulated cluster", AGENTS: "node agents", KUBERNETES: "Kubernetes"}


def owner_of(source: str) -> str:
    if source.startswith(AGENT_SOURCE):
        return AGENTS
    return KUBERNETES if source == BRIDGE_SOURCE else OWN_BACKEND


def served_by(backend: str) -> str:
    """The owner whose nodes node-telemetry's backend setting serves (`sim` or `nvml`: its own)."""
    return backend if backend in (AGENTS, KUBERNETES) else OWN_BACKEND


@dataclass
class NodeRoster:
    grace_s: float = 2.0
    specs: dict[str, NodeSpec] = field(default_factory=dict)  # nodes present (lost or not), as last registered
    owners: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # registrations seen per name, removed ones too
    online: dict[str, bool] = field(default_factory=dict)
    lost_at: dict[str, float] = field(default_factory=dict)  # node -> when the log said it was lost
    runs: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # job -> (run id, its nodes)
    # job -> (progress, reference) of its current run's last checkpoint: an eviction on its behalf keeps it.
    saved: dict[str, tuple[float, str]] = field(default_factory=dict)
    # The owner whose runs an executor in this process reports itself (the simulated cluster's): not orphans.
    served_here: str = ""

    def input_types(self) -> tuple[type[EventBase], ...]:
        return (NodeRegistered, NodeLost, JobPlaced, JobCheckpointed, JobFinished, JobFailed, JobEvicted)

    def fold(self, event: EventBase) -> None:
        match event:
            case NodeRegistered():
                name = event.node.name
                self.versions[name] = self.versions.get(name, 0) + 1
                # node-telemetry registers a lost agent node again when it is heard again: still the agent's.
                owner = owner_of(event.source)
                if owner == OWN_BACKEND and name in self.owners:
                    owner = self.owners[name]
                self.specs[name], self.owners[name], self.online[name] = event.node, owner, True
                self.lost_at.pop(name, None)
            case NodeLost() if event.node in self.specs:
                self.online[event.node] = False
                self.lost_at.setdefault(event.node, event.ts)
                if event.removed:  # its owner stays known: a comeback registration in flight is still the owner's
                    del self.specs[event.node]
            case JobPlaced():
                self.runs[event.job_id] = (event.id, frozenset(p.node for p in event.placements))
                self.saved.pop(event.job_id, None)
            case JobCheckpointed() if event.run in ("", self.runs.get(event.job_id, ("",))[0]):
                self.saved[event.job_id] = (event.progress_s, event.checkpoint)
            case JobFinished() | JobFailed() | JobEvicted() if event.run in ("", self.runs.get(event.job_id, ("",))[0]):
                self.runs.pop(event.job_id, None)  # (a report about an earlier run leaves the current one)
                self.saved.pop(event.job_id, None)

    def nodes_of(self, owner: str) -> list[str]:
        """The owner's nodes in the inventory (lost or not; removed ones are not)."""
        return sorted(name for name, o in self.owners.items() if o == owner and name in self.specs)

    def removal(self, name: str, reason: str, now: float) -> NodeLost:
        """The node leaves the inventory; its id is derived, so a repeated removal is the same message."""
        return NodeLost(id=derived_id(SERVICE, "removed", name, self.versions.get(name, 0)), ts=now, source=SERVICE,
                        correlation_id=name, node=name, reason=reason, removed=True)

    def reconcile(self, backend: str, listed: set[str] | None, now: float) -> list[EventBase]:
        """Remove the nodes this cluster source does not serve: another owner's, and (`listed`: the nodes the
        simulated cluster file lists) the simulated nodes it no longer lists."""
        served = served_by(backend)
        out: list[EventBase] = []
        for name in sorted(self.specs):
            owner = self.owners[name]
            if owner != served:
                out.append(self.removal(name, f"absent_from_source: announced by {OWNER_NAMES[owner]}, and the "
                                              f"platform now runs {OWNER_NAMES[served]}", now))
            elif listed is not None and name not in listed:
                out.append(self.removal(name, "absent_from_source: the cluster file no longer lists it", now))
        return out

    def orphans(self, now: float, reported: set[str]) -> list[EventBase]:
        """Each run with a replica on a node lost `grace_s` ago or more, reported evicted once (`reported`: the
        runs this process reported; not state: a restarted process reports them again, under the same ids)."""
        lost = {name for name, at in self.lost_at.items() if now - at >= self.grace_s}
        if not lost:
            return []  # the common case, every half second: no run to look at
        out: list[EventBase] = []
        for job_id, (run_id, nodes) in self.runs.items():  # in the order they were placed
            if run_id in reported or not nodes & lost:
                continue
            if self.served_here and all(self.owners.get(n) == self.served_here for n in nodes):
                continue  # this process's own executor stops it on NodeLost, with its progress
            reported.add(run_id)
            progress, ref = self.saved.get(job_id, (0.0, ""))  # its last checkpoint survives the node
            out.append(RunReports(job_id, run_id, SERVICE).evicted(now, "node_lost", (progress, ref)))
        return out

