"""The API server's objects as the informers last saw them, and the questions the bridge asks of them: which
pods are a job's, whose job a pod is, whether a node can take a pod now, and the best checkpoint pods wrote."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.kube.client import Obj
from libs.kube.nodes import is_ready, is_unschedulable
from libs.kube.run_reports import TERMINAL
from libs.kube.workloads import (
    JOB_ID_ANNOTATION,
    checkpoint_of,
    job_id_of_batch_job,
    meta,
    notes_of,
    owning_job,
    pod_job_id,
)
from services.kube_bridge.book import JOB, KubeBook, Tracked


def is_terminal(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL


def is_going(pod: Obj) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def resume_point(pods: list[Obj]) -> tuple[float, str]:
    """The best checkpoint the pods wrote: (progress, reference)."""
    best = (0.0, "")
    for pod in pods:
        found = checkpoint_of(pod)
        if found[0] > best[0]:
            best = found
    return best


@dataclass
class ClusterCache:
    book: KubeBook
    pods: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (ns, name) -> the pod as last seen
    batch_jobs: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (ns, name) -> the Job as last seen
    nodes: dict[str, Obj] = field(default_factory=dict)  # name -> the Node as last seen
    gone: dict[tuple[str, str], Obj] = field(default_factory=dict)  # pods deleted, as last seen (checkpoints)

    def pods_of(self, job: Tracked) -> list[Obj]:
        """The job's pods as last seen: its members (POD, GANG) or the Job's pods (JOB)."""
        if job.kind == JOB:
            return [p for (ns, _), p in self.pods.items()
                    if ns == job.namespace and owning_job(p).get("name") == job.name]
        return [p for name in job.pods if (p := self.pods.get((job.namespace, name))) is not None
                and self.job_of_pod(p) is job]

    def job_of_pod(self, pod: Obj) -> Tracked | None:
        m = meta(pod)
        owner = owning_job(pod)
        if owner:
            return self.book.jobs.get(job_id_of_batch_job(str(owner.get("uid", ""))))
        # A pod is its job's by identity, never by name alone: a pod made again by the user under the same name
        # is another job. A pod the bridge made again carries its job's id; otherwise a pod on its own is named
        # by its uid, and a gang member must be one of the pods the gang was submitted with.
        remade = notes_of(pod).get(JOB_ID_ANNOTATION)
        if remade:
            return self.book.jobs.get(remade)
        own = self.book.jobs.get(pod_job_id(pod))
        if own is not None:
            return own
        job_id = self.book.by_pod.get((m.get("namespace", ""), m.get("name", "")))
        job = self.book.jobs.get(job_id) if job_id else None
        return job if job is not None and str(m.get("uid", "")) in job.uids else None

    def member_present(self, job: Tracked, name: str) -> bool:
        pod = self.pods.get((job.namespace, name))
        return pod is not None and self.job_of_pod(pod) is job

    def node_unusable(self, node: str) -> str:
        """Why the API server, as last seen, would not have a pod bound to `node` now ("" when it would): the
        log may not have caught up with a cordon or a loss the informer saw a moment ago."""
        obj = self.nodes.get(node)
        if obj is None:
            return "does not exist"
        if not is_ready(obj):
            return "is not ready"
        if is_unschedulable(obj):
            return "is cordoned"
        return ""

    def last_seen_of(self, job: Tracked) -> list[Obj]:
        return [p for (ns, _), p in self.gone.items() if ns == job.namespace
                and (owning_job(p).get("name") == job.name if job.kind == JOB else meta(p).get("name") in job.pods)]
