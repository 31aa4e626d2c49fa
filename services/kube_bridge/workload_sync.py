"""Pods and Jobs, as the informers see them, into the log: a new pod (or a gang once whole, or a Job) is a
submission; a user's deletion is a cancel; an eviction from outside (`kubectl drain`) stops the run; pods
running and ending are the run's reports (`KubeBridge.observe`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import msgspec

from contracts import EventBase, JobSpec, SubmitJob
from libs.core.kernel.decider import derived_id
from libs.kube.client import ApiError, KubeClient, Obj
from libs.kube.dra import pod_claims, requested_gpus
from libs.kube.reflector import DELETED
from libs.kube.workloads import (
    QUEUE_LABELS,
    GangKey,
    Refusal,
    Resources,
    batch_job_id,
    gang_job_id,
    gang_of,
    is_ours,
    job_spec,
    meta,
    owning_job,
    pod_job_id,
    pod_resources,
)
from libs.kube.workloads import labels as labels_of
from services.kube_bridge.book import GANG, JOB, PLACED, POD, PODS_LABEL, STOPPING, UIDS_LABEL, WAITING, Tracked
from services.kube_bridge.bridge import SOURCE, KubeBridge
from services.kube_bridge.cluster_cache import is_going, is_terminal

log = logging.getLogger(__name__)


def _key(obj: Obj) -> tuple[str, str]:
    m = meta(obj)
    return str(m.get("namespace", "")), str(m.get("name", ""))


def evicted_from_outside(pod: Obj) -> bool:
    """Deleted through the Eviction API (kubectl drain, a node's pressure): Kubernetes marks such a pod with
    DisruptionTarget before it goes."""
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []) or [])


def with_claimed_gpus(spec: JobSpec, claimed: int | Refusal, classic: Resources | Refusal) -> JobSpec | Refusal:
    """The spec with the GPUs its DRA claims ask for: 1. a claim the platform cannot honour refuses it; 2. GPUs
    through both the device plugin and claims are refused; 3. a fraction is a share of exactly one claimed GPU;
    4. otherwise the claims' count is the replica's GPUs."""
    if isinstance(claimed, Refusal):
        return claimed
    if claimed and isinstance(classic, Resources) and (classic.gpus or classic.mig_profile):
        return Refusal("mixed_gpu_resources", "a replica asks for GPUs through the device plugin and DRA claims at "
                       "once")
    if spec.gpu_milli and claimed != 1:
        return Refusal("invalid_fraction", f"a GPU fraction is a share of one GPU a DRA claim asks for; its claims "
                       f"ask for {claimed}")
    return msgspec.structs.replace(spec, gpus=claimed) if claimed else spec


def members_differ(members: list[Obj]) -> str:
    """Why a gang's members cannot be one job's replicas ("" when they can): a job's replicas are alike, so the
    members must ask for the same resources in the same queue at the same priority."""
    def shape(pod: Obj) -> tuple[object, ...]:
        spec = pod.get("spec", {}) or {}
        queue = next((labels_of(pod)[k] for k in QUEUE_LABELS if labels_of(pod).get(k)), "")
        return pod_resources(spec), queue, spec.get("priorityClassName", ""), tuple(pod_claims(pod))

    first = shape(members[0])
    for member in members[1:]:
        if shape(member) != first:
            return (f"{meta(member).get('name')} asks for {shape(member)} but {meta(members[0]).get('name')} for "
                    f"{first} (resources, queue, priority class, DRA claims): a gang's members must be alike")
    return ""


@dataclass
class WorkloadSync:
    bridge: KubeBridge
    client: KubeClient
    submitted: set[str] = field(default_factory=set)  # job ids submitted, not yet back through the log
    refused: set[str] = field(default_factory=set)  # uids told they can never run
    min_members: dict[tuple[str, str], int | None] = field(default_factory=dict)  # PodGroup sizes looked up
    incomplete: dict[GangKey, int] = field(default_factory=dict)  # gangs waiting for members -> their size

    # --- pods ---------------------------------------------------------------------------------------

    async def on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        pod = new if new is not None else old
        assert pod is not None
        if not is_ours(pod.get("spec", {}) or {}):
            return
        key = _key(pod)
        b = self.bridge
        if kind == DELETED:
            b.cache.pods.pop(key, None)
            b.cache.gone[key] = pod
        else:
            b.cache.pods[key] = pod
        job = b.cache.job_of_pod(pod)
        if job is None:
            if kind != DELETED and not owning_job(pod):
                await self.consider(pod)
            return
        if kind == DELETED or is_going(pod):
            await self._pod_going(job, pod)
            if kind == DELETED:
                b.expected_gone.discard(key)  # a pod of that name made later is another incarnation
        elif job.state == PLACED and not pod.get("spec", {}).get("nodeName"):
            if job.kind == JOB:
                b._run(job.job_id, b.bind_job_pod(job, pod))
            elif all((job.namespace, name) in b.cache.pods for name in job.pods):
                b._run(job.job_id, b.place(job))
        b._run(job.job_id, b.observe(job))

    async def _pod_going(self, job: Tracked, pod: Obj) -> None:
        """A pod of an active job is going. Ours (stopping, rolled back, made again): expected. Evicted from
        outside: the run stops and the job waits again. Otherwise the user deleted it: the job is cancelled."""
        b = self.bridge
        key = _key(pod)
        if key in b.expected_gone or job.state in (STOPPING,) or job.cancelled:
            if job.state == STOPPING:
                b._run(job.job_id, b.check_stopped(job))
            return
        if job.state not in (WAITING, PLACED) or job.kind == JOB:
            return  # a Job's pods come and go with the Job; the Job's own deletion is the cancel
        if job.state == PLACED and evicted_from_outside(pod):
            job.state, job.stop_reason = STOPPING, "evicted"
            b._run(job.job_id, b.stop(job, "evicted"))
            return
        await self._cancel(job, "pod_deleted")

    async def _cancel(self, job: Tracked, reason: str) -> None:
        await self.bridge.publish([self.bridge.cancel(job, reason)])

    async def consider(self, pod: Obj) -> None:
        """An unbound pod of no known job: submit it, or its gang once every member exists."""
        if pod.get("spec", {}).get("nodeName") or is_terminal(pod) or is_going(pod):
            return
        gang = gang_of(pod)
        if gang is None:
            await self.submit(pod_job_id(pod), pod, [pod], POD)
            return
        size = gang.size if gang.size is not None else await self._pod_group_size(gang)
        members = self._members(gang)
        if size is None:
            await self.refuse(members, Refusal("gang_size_unknown", f"gang {gang.name}: give its size "
                                               "(gpusched.io/gang-size, or a PodGroup with minMember)"))
            return
        if size < 1:
            await self.refuse(members, Refusal("invalid_gang_size", f"gang {gang.name}: its size must be at least 1, "
                                               f"got {size}"))
            return
        if len(members) < size:
            self.incomplete[gang] = size  # said after a moment, if it still is (`say_incomplete_forever`)
            return
        self.incomplete.pop(gang, None)
        chosen = members[:size]
        differ = members_differ(chosen)
        if differ:
            await self.refuse(chosen, Refusal("gang_members_differ", f"gang {gang.name}: {differ}"))
            return
        uids = [str(meta(p).get("uid", "")) for p in chosen]
        await self.submit(gang_job_id(gang, uids), chosen[0], chosen, GANG, gang)

    def _members(self, gang: GangKey) -> list[Obj]:
        """The gang's members that wait for a job: unbound, alive, of no job yet, by name."""
        b = self.bridge
        return sorted((p for p in b.cache.pods.values() if gang_of(p) == gang and b.cache.job_of_pod(p) is None
                       and not p.get("spec", {}).get("nodeName") and not is_terminal(p) and not is_going(p)),
                      key=lambda p: str(meta(p).get("name")))

    async def say_incomplete_forever(self, every_s: float = 1.0) -> None:
        """A gang whose members do not all exist yet says so on each member, once it has stayed incomplete for
        a moment (members created one by one are not told it at every step)."""
        seen: dict[GangKey, int] = {}
        while True:
            for gang, size in list(self.incomplete.items()):
                members = self._members(gang)
                if not members or len(members) >= size:
                    self.incomplete.pop(gang, None)
                    continue
                if seen.get(gang) == len(members):
                    for member in members:
                        await self.bridge.actions.say_waiting(
                            member, "gang_incomplete", f"{len(members)} of {size} members of gang {gang.name} exist",
                            pod=True)
                seen[gang] = len(members)
            await asyncio.sleep(every_s)

    async def _pod_group_size(self, gang: GangKey) -> int | None:
        key = (gang.namespace, gang.name)
        if key not in self.min_members:
            try:
                group = await self.client.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{gang.namespace}"
                                              f"/podgroups/{gang.name}")
                self.min_members[key] = int(group.get("spec", {}).get("minMember", 0)) or None
            except ApiError:
                return None  # not there (yet): asked again for the next member
        return self.min_members[key]

    async def submit(self, job_id: str, obj: Obj, members: list[Obj], kind: str, gang: GangKey | None = None) -> None:
        if job_id in self.submitted or job_id in self.bridge.book.jobs:
            return
        pod_spec = obj.get("spec", {}) if kind != JOB else obj.get("spec", {}).get("template", {}).get("spec", {})
        replicas = len(members) if kind != JOB else int(obj.get("spec", {}).get("parallelism", 1) or 1)
        spec = job_spec(obj, pod_spec, replicas, self.bridge.book.team_of_queue, kind)
        claimed = await self._claimed_gpus(str(meta(obj).get("namespace", "default")), pod_spec)
        if not isinstance(spec, Refusal):
            spec = with_claimed_gpus(spec, claimed, pod_resources(pod_spec))
        if isinstance(spec, Refusal):
            await self.refuse(members or [obj], spec, pod=kind != JOB)
            return
        labels = dict(spec.labels)
        if gang is not None:
            labels["kubernetes.io/name"] = gang.name
            labels[PODS_LABEL] = ",".join(str(meta(m).get("name")) for m in members)
            labels[UIDS_LABEL] = ",".join(str(meta(m).get("uid")) for m in members)
        spec = msgspec.structs.replace(spec, labels=labels, idempotency_key=job_id)
        self.submitted.add(job_id)
        command: EventBase = SubmitJob(id=derived_id(SOURCE, "submit", job_id), ts=time.time(), source=SOURCE,
                                       correlation_id=job_id, job_id=job_id, spec=spec)
        await self.bridge.publish([command])

    async def _claimed_gpus(self, namespace: str, pod_spec: Obj) -> int | Refusal:
        """GPUs a replica asks for through DRA claims made from templates (0 without claims)."""
        total = 0
        for name, template in pod_claims({"spec": pod_spec}):
            if not template:
                return Refusal("dra_shared_claim_unsupported", f"claim {name!r} names a ResourceClaim several pods "
                               "may share; ask through a resourceClaimTemplateName, one claim per pod")
            try:
                found = await self.client.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}"
                                              f"/resourceclaimtemplates/{template}")
            except ApiError as err:
                return Refusal("dra_template_missing", f"ResourceClaimTemplate {template!r}: {err.message}")
            asked = requested_gpus((found.get("spec", {}) or {}).get("spec", {}) or {},
                                   self.bridge.claims.gpu_classes)
            if isinstance(asked, Refusal):
                return asked
            total += asked
        return total

    async def refuse(self, objects: list[Obj], refusal: Refusal, pod: bool = True) -> None:
        """A spec the platform can never run: said at once on each object, once."""
        for obj in objects:
            uid = str(meta(obj).get("uid", ""))
            if uid in self.refused:
                continue
            self.refused.add(uid)
            await self.bridge.actions.say_waiting(obj, refusal.code, refusal.message, pod=pod)

    # --- Jobs ---------------------------------------------------------------------------------------

    async def on_job(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        template = obj.get("spec", {}).get("template", {}).get("spec", {}) or {}
        if not is_ours(template):
            return
        key = _key(obj)
        b = self.bridge
        if kind == DELETED:
            b.cache.batch_jobs.pop(key, None)
        else:
            b.cache.batch_jobs[key] = obj
        job_id = batch_job_id(obj)
        job = b.book.jobs.get(job_id)
        if kind == DELETED or is_going(obj):
            if job is not None and not job.cancelled and job.state in (WAITING, PLACED):
                await self._cancel(job, "job_deleted")
            return
        if job is None:
            conditions = {c.get("type") for c in obj.get("status", {}).get("conditions", []) or []
                          if c.get("status") == "True"}
            if conditions & {"Complete", "Failed"}:
                return
            if not obj.get("spec", {}).get("suspend"):
                await b.actions.suspend(key[0], key[1], True)  # held until placed, as Kueue holds it
            await self.submit(job_id, obj, [], JOB)
            return
        b._run(job.job_id, b.observe_batch_job(job, obj))

