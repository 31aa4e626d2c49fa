"""What the bridge does to the API server, each step idempotent so that a restart can do it again:

- place a run: bind each replica's pod to the node the platform chose; a gang is bound whole or not at all;
- stop a run: mark its pods DisruptionTarget, then evict them with the class's grace (a Job: suspend it);
- remake a bare pod for its next run, once the old one is gone;
- say why a job waits or was refused, on its pods (PodScheduled) and in Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field

from libs.kube import bodies
from libs.kube.client import ApiError, KubeClient, Obj
from libs.kube.workloads import meta
from services.kube_bridge.metrics import BIND_CONFLICTS, BINDS, EVICTIONS

log = logging.getLogger(__name__)


class BindConflict(Exception):
    """The pod is bound to another node than the one asked: never a second placement; the run rolls back."""


@dataclass
class KubeActions:
    client: KubeClient
    # How long an eviction refused by a PodDisruptionBudget (429) is tried again before the pod is deleted
    # anyway: the platform's preemption outranks a budget, as kube-scheduler's own preemption does.
    pdb_wait_s: float = 30.0
    said: dict[str, str] = field(default_factory=dict)  # object uid -> the last waiting message written
    binds: int = 0
    bind_conflicts: int = 0
    # Fault injection for the crash tests: SIGKILL this process after this many binds, binding one pod at a
    # time so that the crash cuts a gang exactly there.
    crash_after_binds: int | None = None

    @staticmethod
    def pod_path(namespace: str, name: str, sub: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")

    @staticmethod
    def job_path(namespace: str, name: str) -> str:
        return f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"

    async def bind(self, namespace: str, pod: str, node: str, run: str = "", notes: dict[str, str] | None = None
                   ) -> None:
        """Bind one pod (with `notes` as annotations besides the run's). Already bound to that node (a bind
        repeated after a restart, another bridge's): done. Bound elsewhere: BindConflict."""
        try:
            await self.client.post(self.pod_path(namespace, pod, "binding"),
                                   bodies.binding(namespace, pod, node, run, notes))
            self.binds += 1
            BINDS.inc()
            if self.crash_after_binds is not None and self.binds >= self.crash_after_binds:
                os.kill(os.getpid(), signal.SIGKILL)
        except ApiError as err:
            if err.status != 409:
                raise
            current = await self.client.get(self.pod_path(namespace, pod))
            bound = current.get("spec", {}).get("nodeName", "")
            if bound == node:
                return
            self.bind_conflicts += 1
            BIND_CONFLICTS.inc()
            raise BindConflict(f"pod {namespace}/{pod} is bound to {bound or 'nothing'}, not {node}") from err

    async def bind_all(self, namespace: str, targets: list[tuple[str, str]], run: str = "",
                       notes: dict[str, dict[str, str]] | None = None) -> list[str]:
        """Bind every (pod, node) at once; returns the pods that could not be bound (with the reasons logged).
        The caller decides what a partial gang means: the bound members are rolled back. `notes`: per pod, its
        annotations besides the run's."""
        extra = notes or {}
        results: list[BaseException | None]
        if self.crash_after_binds is None:
            results = await asyncio.gather(*(self.bind(namespace, pod, node, run, extra.get(pod))
                                             for pod, node in targets), return_exceptions=True)
        else:
            results = []
            for pod, node in targets:
                await self.bind(namespace, pod, node, run, extra.get(pod))
                results.append(None)
        failed = []
        for (pod, node), result in zip(targets, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("binding %s/%s to %s failed: %s", namespace, pod, node, result)
                failed.append(pod)
        return failed

    async def delete_pod(self, namespace: str, pod: str, grace_s: float) -> None:
        with contextlib.suppress(ApiError):
            await self.client.delete(self.pod_path(namespace, pod), bodies.delete_options(grace_s))

    async def mark_disruption(self, pod: Obj, reason: str, message: str) -> None:
        m = meta(pod)
        with contextlib.suppress(ApiError):
            await self.client.strategic_patch(self.pod_path(m["namespace"], m["name"], "status"), bodies.status_patch(
                bodies.disruption_condition(reason, message, time.time())))

    async def evict(self, pod: Obj, grace_s: float, reason: str) -> None:
        """DisruptionTarget, then the Eviction API. A budget that refuses (429) is asked again each second for
        `pdb_wait_s`; then the pod is deleted with the same grace, and an Event says so."""
        m = meta(pod)
        ns, name = m["namespace"], m["name"]
        await self.mark_disruption(pod, "PreemptionByScheduler", f"gpusched: {reason}")
        deadline = time.monotonic() + self.pdb_wait_s
        while True:
            try:
                await self.client.post(self.pod_path(ns, name, "eviction"), bodies.eviction(ns, name, grace_s))
                EVICTIONS.labels("evicted").inc()
                return
            except ApiError as err:
                if err.status == 404:
                    return
                if err.status != 429:
                    raise
                if time.monotonic() >= deadline:
                    await self.event(pod, "Warning", "DisruptionBudgetOverridden",
                                     f"gpusched: a PodDisruptionBudget refused the eviction for {self.pdb_wait_s:g}s; "
                                     f"deleting the pod ({reason}) with {grace_s:g}s of grace")
                    await self.delete_pod(ns, name, grace_s)
                    EVICTIONS.labels("budget_overridden").inc()
                    return
            await asyncio.sleep(1.0)

    async def suspend(self, namespace: str, job: str, suspend: bool, notes: dict[str, str] | None = None) -> None:
        with contextlib.suppress(ApiError):
            await self.client.merge_patch(self.job_path(namespace, job), bodies.suspend_patch(suspend, notes))

    async def create_pod(self, body: Obj) -> None:
        ns = body["metadata"]["namespace"]
        try:
            await self.client.post(f"/api/v1/namespaces/{ns}/pods", body)
        except ApiError as err:
            if err.status != 409:  # already made (a remake repeated after a restart)
                raise

    async def keep_templates(self, namespace: str, job_id: str, pods: dict[str, Obj]) -> None:
        """Keep what it takes to make the job's bare pods again (`bodies.remake_templates`), before deleting them."""
        body = bodies.remake_templates(namespace, job_id, pods)
        try:
            await self.client.post(f"/api/v1/namespaces/{namespace}/configmaps", body)
        except ApiError as err:
            if err.status != 409:
                raise
            await self.client.merge_patch(f"/api/v1/namespaces/{namespace}/configmaps/{body['metadata']['name']}",
                                          {"data": body["data"]})

    async def kept_templates(self, namespace: str, job_id: str) -> dict[str, Obj]:
        try:
            found = await self.client.get(f"/api/v1/namespaces/{namespace}/configmaps/"
                                          f"{bodies.remake_templates_name(job_id)}")
        except ApiError as err:
            if err.status == 404:
                return {}
            raise
        return {name: json.loads(text) for name, text in (found.get("data", {}) or {}).items()}

    async def forget_templates(self, namespace: str, job_id: str) -> None:
        with contextlib.suppress(ApiError):
            await self.client.delete(f"/api/v1/namespaces/{namespace}/configmaps/"
                                     f"{bodies.remake_templates_name(job_id)}")

    async def event(self, involved: Obj, kind: str, reason: str, message: str) -> None:
        ns = meta(involved).get("namespace", "default")
        with contextlib.suppress(ApiError):
            await self.client.post(f"/api/v1/namespaces/{ns}/events",
                                   bodies.event(involved, kind, reason, message, time.time()))

    async def say_waiting(self, involved: Obj, code: str, message: str, pod: bool) -> None:
        """PodScheduled=False with the platform's reason (pods), and one FailedScheduling Event per new news."""
        m = meta(involved)
        uid = str(m.get("uid", ""))
        text = f"{code}: {message}"
        if self.said.get(uid) == text:
            return
        self.said[uid] = text
        if pod:
            with contextlib.suppress(ApiError):
                await self.client.strategic_patch(self.pod_path(m["namespace"], m["name"], "status"),
                                                  bodies.status_patch(bodies.waiting_condition(code, message,
                                                                                               time.time())))
        await self.event(involved, "Warning", "FailedScheduling", f"gpusched: {text}")

    async def say_scheduled(self, pod: Obj, node: str) -> None:
        self.said.pop(str(meta(pod).get("uid", "")), None)
        await self.event(pod, "Normal", "Scheduled",
                         f"Successfully assigned {meta(pod).get('namespace')}/{meta(pod).get('name')} to {node}")
