"""What the bridge knows from the log: its own jobs (which Kubernetes objects each one is), their current
run and placements, the queues' teams, the classes' grace periods and the nodes as registered. A fold, no
I/O: after a restart the bridge rebuilds it from the log before it looks at the API server, so that nothing
is submitted twice and a placement cut short by a crash is carried out."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    ReplicaPlacement,
)
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.core.kernel.runs import CurrentRuns

KIND_LABEL = "kubernetes.io/kind"
NAMESPACE_LABEL = "kubernetes.io/namespace"
NAME_LABEL = "kubernetes.io/name"
PODS_LABEL = "kubernetes.io/pods"  # a gang's members, in replica order
UIDS_LABEL = "kubernetes.io/uids"  # and their uids (a pod made again under a member's name is not the member)
POD, GANG, JOB = "Pod", "PodGroup", "Job"

WAITING, PLACED, STOPPING, ENDED = "waiting", "placed", "stopping", "ended"


@dataclass
class Tracked:
    """One platform job made of Kubernetes objects."""

    job_id: str
    kind: str  # POD, GANG or JOB
    namespace: str
    name: str  # the pod's, the gang's or the Job's name
    pods: tuple[str, ...]  # POD and GANG: member pod names, replica order; JOB: none (its pods come and go)
    priority: str
    uids: frozenset[str] = frozenset()  # GANG: the members' uids when submitted
    state: str = WAITING
    run: str = ""  # the current run: its JobPlaced id
    placements: tuple[ReplicaPlacement, ...] = ()
    stop_reason: str = ""
    cancelled: bool = False
    started_reported: bool = False
    saved: tuple[float, str] = (0.0, "")  # its best checkpoint in the log: (progress, reference)

    def node_of(self, replica: int) -> str | None:
        return next((p.node for p in self.placements if p.replica == replica), None)

    def indices_of(self, replica: int) -> tuple[int, ...]:
        """The GPUs the platform chose for a replica (DRA claims are allocated to exactly these)."""
        return next((p.gpu_indices for p in self.placements if p.replica == replica), ())


@dataclass
class KubeBook:
    jobs: dict[str, Tracked] = field(default_factory=dict)
    by_pod: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, pod) -> job, for POD and GANG
    team_of_queue: dict[str, str] = field(default_factory=dict)
    grace: dict[str, float] = field(default_factory=lambda: {c.name: c.checkpoint_grace_s
                                                             for c in DEFAULT_PRIORITY_CLASSES})
    nodes: dict[str, NodeSpec] = field(default_factory=dict)
    registrations: dict[str, int] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    cordoned: dict[str, str] = field(default_factory=dict)  # node -> who cordoned it (NodeCordoned.operator)
    runs: CurrentRuns = field(default_factory=CurrentRuns)
    rejected: dict[str, tuple[str, str]] = field(default_factory=dict)  # job -> (code, message)
    # Every job's current run and its nodes, whoever runs it: a node lost takes all of them with it.
    runs_on: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)

    def fold(self, event: EventBase) -> Tracked | None:
        """Apply one event; returns the tracked job it concerns, if it is one of ours."""
        if self.runs.is_stale(event):
            return None
        self.runs.fold(event)
        if isinstance(event, JobPlaced):
            self.runs_on[event.job_id] = (event.id, frozenset(p.node for p in event.placements))
        elif isinstance(event, JobFinished | JobFailed | JobEvicted):
            self.runs_on.pop(event.job_id, None)
        match event:
            case QueuePolicyChanged():
                self.team_of_queue[event.queue.name] = event.queue.team
            case PriorityClassesChanged():
                self.grace = {c.name: c.checkpoint_grace_s for c in event.classes}
            case NodeRegistered():
                name = event.node.name
                self.nodes[name] = event.node
                self.registrations[name] = self.registrations.get(name, 0) + 1
                self.lost.discard(name)
            case NodeLost():
                self.lost.add(event.node)
            case NodeCordoned():
                self.cordoned[event.node] = event.operator
            case NodeUncordoned():
                self.cordoned.pop(event.node, None)
            case JobSubmitted() if KIND_LABEL in event.spec.labels:
                return self._track(event.job_id, event.spec)
            case JobRejected() if (event.spec is not None and KIND_LABEL in event.spec.labels
                                   and event.job_id not in self.jobs):
                self._track(event.job_id, event.spec)  # refused at once: it never was submitted
        job = self.jobs.get(getattr(event, "job_id", ""))
        if job is None:
            return self._victims(event)
        match event:
            case JobRejected():
                job.state = ENDED
                self.rejected[job.job_id] = (event.code, event.message)
            case JobAdmitted():
                job.state = WAITING
            case JobPlaced():
                job.state, job.run, job.placements = PLACED, event.id, event.placements
                job.stop_reason, job.started_reported = "", False
            case JobStarted():
                job.started_reported = True
            case JobCheckpointed() if event.progress_s > job.saved[0]:
                job.saved = (event.progress_s, event.checkpoint)
            case JobEvicted():
                job.state, job.run, job.placements, job.stop_reason = WAITING, "", (), ""
                if event.progress_s > job.saved[0]:
                    job.saved = (event.progress_s, event.checkpoint)
            case JobFinished() | JobFailed():
                # A failure the platform retries puts the job back in line; it says so with a new placement.
                job.state, job.run, job.placements = ENDED, "", ()
            case JobCancelled():
                job.cancelled = True
                if job.state in (WAITING,):
                    job.state = ENDED
                elif job.state == PLACED:
                    job.state, job.stop_reason = STOPPING, "cancelled"
        return job

    def _victims(self, event: EventBase) -> Tracked | None:
        if isinstance(event, PreemptionDecided):
            for victim in event.victims:
                job = self.jobs.get(victim.job_id)
                if job is not None and job.state == PLACED:
                    job.state, job.stop_reason = STOPPING, "preempted"
        return None

    def _track(self, job_id: str, spec: JobSpec) -> Tracked:
        labels = spec.labels
        kind, ns, name = labels[KIND_LABEL], labels.get(NAMESPACE_LABEL, ""), labels.get(NAME_LABEL, "")
        pods = tuple(p for p in labels.get(PODS_LABEL, name if kind == POD else "").split(",") if p)
        uids = frozenset(u for u in labels.get(UIDS_LABEL, "").split(",") if u)
        job = Tracked(job_id, kind, ns, name, pods, spec.priority, uids)
        self.jobs[job_id] = job
        for pod in pods:
            self.by_pod[(ns, pod)] = job_id
        return job

    def grace_of(self, job: Tracked) -> float:
        return self.grace.get(job.priority, 30.0)

    def active(self) -> list[Tracked]:
        return [j for j in self.jobs.values() if j.state != ENDED]
