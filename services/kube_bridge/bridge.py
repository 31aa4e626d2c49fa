"""The Kubernetes bridge's reactor handler: the executor and inventory source of a Kubernetes cluster.

From the log (in order, as every service reads it) it learns what the platform decided and carries it out on
the API server: a placement binds pods (a Job is unsuspended first), a preemption, a drain or a cancel evicts
them, a refusal or a deferral is written where `kubectl describe` shows it. From the API server (informers,
`WorkloadSync` and `NodeSync`) it reports back what happened: submissions, cancels, pods running and ending,
nodes registered, cordoned and lost. Decisions stay in the deciders; the bridge decides nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from contracts import (
    CancelJob,
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PreemptionDecided,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
)
from libs.core.kernel.accelerators import GPU
from libs.core.kernel.decider import derived_id
from libs.kube import bodies
from libs.kube.ascend import chosen_devices
from libs.kube.client import Obj
from libs.kube.nodes import node_spec
from libs.kube.run_reports import Run, batch_job_reports, pods_reports
from libs.kube.workloads import (
    RUN_ANNOTATION,
    completion_index,
    meta,
    notes_of,
)
from services.kube_bridge.actions import KubeActions
from services.kube_bridge.book import ENDED, JOB, PLACED, STOPPING, WAITING, KubeBook, Tracked
from services.kube_bridge.claims import WAIT as WAIT_FOR_CLAIMS
from services.kube_bridge.claims import ClaimAllocator
from services.kube_bridge.cluster_cache import ClusterCache, is_going, is_terminal, resume_point
from services.kube_bridge.metrics import ROLLBACKS
from services.kube_bridge.outbox import Outbox

log = logging.getLogger(__name__)
SOURCE = "kube-bridge"
UNUSABLE_WAIT_S = 1.0
# How long a placed pod may wait for the claim controller to make its DRA claims before its run is rolled back.
CLAIM_WAIT_S = 30.0


@dataclass
class KubeBridge:
    actions: KubeActions
    claims: ClaimAllocator
    book: KubeBook = field(default_factory=KubeBook)
    name: str = "kube-bridge"
    outbox: Outbox = field(default_factory=Outbox)
    cache: ClusterCache = field(init=False)
    live: bool = False  # the log's history is folded: act on what comes now
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    explain_due: set[str] = field(default_factory=set)  # waiting jobs whose explanation may have changed
    expected_gone: set[tuple[str, str]] = field(default_factory=set)  # pods the bridge itself deletes
    claim_wait_since: dict[str, float] = field(default_factory=dict)  # run -> when it began to wait for claims
    claim_timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.cache = ClusterCache(self.book)

    # --- the handler --------------------------------------------------------------------------------

    def input_types(self) -> Iterable[type[EventBase]]:
        return (QueuePolicyChanged, PriorityClassesChanged, JobSubmitted, JobRejected, JobAdmitted, QuotaDeferred,
                PlacementDeferred, JobPlaced, PreemptionDecided, JobCancelled, JobStarted, JobFinished, JobFailed,
                JobEvicted, JobCheckpointed, NodeRegistered, NodeLost, NodeCordoned, NodeUncordoned)

    def replay(self, seq: int, event: EventBase) -> None:
        self.book.fold(event)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        victims = self._victims_placed(event)
        job = self.book.fold(event)
        if not self.live:
            return []
        match event:
            case JobPlaced() if job is not None:
                self._run(job.job_id, self.place(job))
            case JobRejected() | QuotaDeferred() | PlacementDeferred() | JobAdmitted() if job is not None:
                self.explain_due.add(job.job_id)
            case JobCancelled() if job is not None and job.state == STOPPING:
                self._run(job.job_id, self.stop(job, "cancelled"))
            case JobEvicted() | JobFinished() | JobFailed() if job is not None:
                self._run(job.job_id, self.after_run(job))
            case PreemptionDecided():
                for job in victims:
                    self._run(job.job_id, self.stop(job, "preempted"))
            case NodeCordoned() if event.drain:
                for job in self._jobs_on(event.node):
                    job.state, job.stop_reason = STOPPING, "drained"
                    self._run(job.job_id, self.stop(job, "drained"))
        return []

    async def unusable_nodes(self, nodes: list[str]) -> list[str]:
        """Nodes the API server would not have a pod bound to, each with why, after giving the log a moment to
        catch up with what the informer saw (the cordon or the loss is on its way to the deciders): a placement
        is rolled back at most once a second for it, never in a tight loop."""
        found = [f"{n} {why}" for n in nodes if (why := self.cache.node_unusable(n))]
        if found:
            await asyncio.sleep(UNUSABLE_WAIT_S)
            found = [f"{n} {why}" for n in nodes if (why := self.cache.node_unusable(n))]
        return found

    def _victims_placed(self, event: EventBase) -> list[Tracked]:
        if not isinstance(event, PreemptionDecided):
            return []
        jobs = (self.book.jobs.get(v.job_id) for v in event.victims)
        return [j for j in jobs if j is not None and j.state == PLACED]

    def _jobs_on(self, node: str) -> list[Tracked]:
        return [j for j in self.book.jobs.values()
                if j.state == PLACED and any(p.node == node for p in j.placements)]

    async def after_batch(self) -> None:
        return None

    async def after_catch_up(self) -> None:
        self.live = True
        self.caught_up.set()

    # --- tasks, one at a time per job ------------------------------------------------------------------

    def _run(self, job_id: str, coro: Coroutine[Any, Any, None]) -> None:
        lock = self._locks.setdefault(job_id, asyncio.Lock())

        async def serially() -> None:
            async with lock:
                await coro

        task = asyncio.ensure_future(serially())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("bridge task failed", exc_info=task.exception())

    async def publish(self, events: list[EventBase]) -> None:
        await self.outbox.publish(events)

    # --- the pods of a job -----------------------------------------------------------------------------

    def cancel(self, job: Tracked, reason: str) -> EventBase:
        return CancelJob(id=derived_id(SOURCE, "cancel", job.job_id), ts=time.time(), source=SOURCE,
                         correlation_id=job.job_id, job_id=job.job_id, reason=reason)

    async def delete_pod(self, job: Tracked, name: str, grace_s: float) -> None:
        self.expected_gone.add((job.namespace, name))
        await self.actions.delete_pod(job.namespace, name, grace_s)

    # --- placing -----------------------------------------------------------------------------------

    async def place(self, job: Tracked) -> None:
        """Carry out the job's current placement (again after a restart: every step is idempotent)."""
        if job.state != PLACED:
            return
        if job.kind == JOB:
            notes = {"gpusched.io/run": job.run}
            await self.actions.suspend(job.namespace, job.name, False, notes)
            for pod in self.cache.pods_of(job):
                await self.bind_job_pod(job, pod)
            return
        pods = self.cache.pods_of(job)
        if any(is_terminal(p) and notes_of(p).get(RUN_ANNOTATION) == job.run for p in pods):
            await self.observe(job)  # this run ended (while no bridge watched, say): reported, never run again
            return
        # A member still bound under an earlier run is an old incarnation: the run's end (`after_run`) may not
        # have taken it back yet when the next placement comes straight after it in the log.
        earlier = [p for p in pods if p.get("spec", {}).get("nodeName")
                   and notes_of(p).get(RUN_ANNOTATION, job.run) != job.run]
        if earlier:
            await self.keep_templates(job)  # as `after_run` does before it deletes bare pods
        if len(pods) < len(job.pods) or earlier or any(is_terminal(p) or is_going(p) for p in pods):
            await self.remake(job, pods)  # a retry or a rerun: the members are made again, then bound
            return
        targets = [(name, job.node_of(i) or "") for i, name in enumerate(job.pods)]
        unusable = await self.unusable_nodes(sorted({n for _, n in targets}))
        if unusable:
            await self.roll_back(job, "the API server says node " + ", ".join(unusable))
            return
        todo = [(name, node) for name, node in targets
                if self.cache.pods[(job.namespace, name)].get("spec", {}).get("nodeName") != node]
        for name, node in todo:  # DRA claims first, to the GPUs placed: the whole gang's, before any bind
            state = await self.claims.allocate(self.cache.pods[(job.namespace, name)], node,
                                               job.indices_of(job.pods.index(name)))
            if state == WAIT_FOR_CLAIMS:
                await self.wait_for_claims(job)  # the pod's next change (its claims made) carries the placement on
                return
            if state:
                await self.roll_back(job, state)
                return
        self.claim_wait_since.pop(job.run, None)
        devices = {name: self.device_notes(self.cache.pods[(job.namespace, name)], node,
                                           job.indices_of(job.pods.index(name))) for name, node in todo}
        failed = await self.actions.bind_all(job.namespace, todo, job.run, devices)
        if failed:
            await self.roll_back(job, f"binding {', '.join(failed)} failed")
            return
        for name, node in todo:
            await self.actions.say_scheduled(self.cache.pods[(job.namespace, name)], node)

    async def bind_job_pod(self, job: Tracked, pod: Obj) -> None:
        """A pod of a placed Job: bound to the node of its completion index (a non-indexed Job: the first
        replica whose node has fewer of the Job's pods than placed there)."""
        if job.state != PLACED or pod.get("spec", {}).get("nodeName") or is_going(pod) or is_terminal(pod):
            return
        index = completion_index(pod)
        node = job.node_of(index) if index is not None else self._free_slot(job)
        if node is None:
            return
        unusable = await self.unusable_nodes([node])
        if unusable:
            await self.roll_back(job, f"the API server says node {unusable[0]}")
            return
        replica = index if index is not None else next(p.replica for p in job.placements if p.node == node)
        state = await self.claims.allocate(pod, node, job.indices_of(replica))
        if state == WAIT_FOR_CLAIMS:
            await self.wait_for_claims(job)
            return
        if state:
            await self.roll_back(job, state)
            return
        try:
            await self.actions.bind(job.namespace, meta(pod)["name"], node, job.run,
                                    self.device_notes(pod, node, job.indices_of(replica)))
            await self.actions.say_scheduled(pod, node)
        except Exception as err:
            await self.roll_back(job, f"binding {meta(pod)['name']} failed: {err}")

    def device_notes(self, pod: Obj, node: str, indices: tuple[int, ...]) -> dict[str, str]:
        """The annotation naming the NPUs placed for a pod of whole NPUs (read by Ascend's device plugin)."""
        node_obj = self.cache.nodes.get(node)
        gpus_before = 0 if node_obj is None else sum(1 for g in node_spec(node_obj).gpus if g.kind == GPU)
        return chosen_devices(pod.get("spec", {}) or {}, gpus_before, indices)

    async def wait_for_claims(self, job: Tracked) -> None:
        """A placed run waits for its pods' DRA claims to be made; past CLAIM_WAIT_S it is rolled back (a claim
        template that does not exist, a claim controller that does not run) and its pods say why."""
        run = job.run
        first = self.claim_wait_since.setdefault(run, time.monotonic())
        if time.monotonic() - first >= CLAIM_WAIT_S:
            self.claim_wait_since.pop(run, None)
            await self.roll_back(job, f"its pods' DRA claims were not made within {CLAIM_WAIT_S:g} s")
            return
        if run not in self.claim_timers:
            loop = asyncio.get_running_loop()
            self.claim_timers[run] = loop.call_later(CLAIM_WAIT_S, lambda: self._retry_placement(job, run))

    def _retry_placement(self, job: Tracked, run: str) -> None:
        self.claim_timers.pop(run, None)
        if job.run == run and job.state == PLACED:
            self._run(job.job_id, self.place(job) if job.kind != JOB else self._bind_job_pods(job))

    async def _bind_job_pods(self, job: Tracked) -> None:
        for pod in self.cache.pods_of(job):
            await self.bind_job_pod(job, pod)

    def _free_slot(self, job: Tracked) -> str | None:
        used: dict[str, int] = {}
        for pod in self.cache.pods_of(job):
            node = pod.get("spec", {}).get("nodeName")
            if node and not is_terminal(pod):
                used[node] = used.get(node, 0) + 1
        for placement in sorted(job.placements, key=lambda p: p.replica):
            if used.get(placement.node, 0) > 0:
                used[placement.node] -= 1
                continue
            return placement.node
        return None

    async def roll_back(self, job: Tracked, why: str) -> None:
        """A gang not bound whole is not bound at all: the members bound are taken back (deleted and, for
        bare pods, made again unbound), and the run is reported evicted so its capacity returns."""
        log.warning("%s: %s; rolling the run back", job.job_id, why)
        ROLLBACKS.labels("bind_failed").inc()
        self.explain_due.add(job.job_id)  # it waits again: its pods say why once the log has it
        run = job.run
        job.state, job.stop_reason = STOPPING, "bind_failed"
        if job.kind == JOB:
            await self.actions.suspend(job.namespace, job.name, True)
        else:
            for pod in self.cache.pods_of(job):
                if pod.get("spec", {}).get("nodeName"):
                    await self.delete_pod(job, meta(pod)["name"], 0)
        await self.publish([Run(job.job_id, run, SOURCE).evicted(time.time(), "bind_failed")])

    async def remake(self, job: Tracked, pods: list[Obj]) -> None:
        """Bare pods of a job to run again: the old incarnations go, new unbound ones come (WorkloadSync binds
        them as they appear), made from the last incarnation seen, with the checkpoint to resume from."""
        progress, ref = max(resume_point(pods + self.cache.last_seen_of(job)), job.saved)
        kept: dict[str, Obj] | None = None
        for name in job.pods:
            key = (job.namespace, name)
            current = self.cache.pods.get(key)
            if current is not None and self.cache.job_of_pod(current) is not job:
                await self.publish([self.cancel(job, "pod_deleted")])  # the user made another pod of that name
                return
            if current is not None and not (is_terminal(current) or is_going(current)
                                            or current.get("spec", {}).get("nodeName")):
                continue  # an unbound incarnation waits already
            old = current or self.cache.gone.get(key)
            if old is None:  # deleted before this bridge led: from the bodies kept before the deletion
                kept = kept if kept is not None else await self.actions.kept_templates(job.namespace, job.job_id)
                old = kept.get(name)
            if old is None:  # gone while no bridge watched, with nothing left to make it again from
                await self.publish([self.cancel(job, "pod_gone")])
                return
            if current is not None:
                await self.delete_pod(job, name, 0)
                self.cache.pods.pop(key, None)
            await self._create_when_gone(bodies.remade_pod(old, job.job_id, (progress, ref)))
        await self.actions.forget_templates(job.namespace, job.job_id)

    async def _create_when_gone(self, body: Obj) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for _ in range(100):
            try:
                await self.actions.create_pod(body)
                return
            except Exception as err:
                log.debug("remaking %s/%s: %s", ns, name, err)
                await asyncio.sleep(0.2)

    # --- stopping ----------------------------------------------------------------------------------

    async def stop(self, job: Tracked, reason: str) -> None:
        """Preempted, drained or cancelled: DisruptionTarget, then eviction with the class's grace (a Job is
        suspended, and its controller deletes its pods with theirs). The run's end is reported once its pods
        are gone (`WorkloadSync`)."""
        grace = self.book.grace_of(job)
        pods = [p for p in self.cache.pods_of(job) if not is_terminal(p)]
        if job.kind == JOB:
            for pod in pods:
                await self.actions.mark_disruption(pod, "PreemptionByScheduler", f"gpusched: {reason}")
            await self.actions.suspend(job.namespace, job.name, True)
        else:
            await self.keep_templates(job)
            self.expected_gone.update((job.namespace, meta(p)["name"]) for p in pods)
            await asyncio.gather(*(self.actions.evict(p, grace, reason) for p in pods if not is_going(p)))
        await self.check_stopped(job)

    async def keep_templates(self, job: Tracked) -> None:
        """Before the bridge deletes a job's bare pods: what it takes to make them again, kept on the API server, so
        that a bridge taking over after the deletion can."""
        pods = {meta(p)["name"]: bodies.remade_pod(p, job.job_id, (0.0, "")) for p in self.cache.pods_of(job)}
        if pods:
            await self.actions.keep_templates(job.namespace, job.job_id, pods)

    async def check_stopped(self, job: Tracked) -> None:
        """A stopping run whose pods are all gone or ended is over: report it evicted, with the best checkpoint
        its pods wrote; bare pods are then made again for the next run (unless cancelled)."""
        if job.state != STOPPING or not job.run:
            return
        pods = self.cache.pods_of(job)
        if any(not is_terminal(p) for p in pods):
            return
        saved = resume_point(pods + self.cache.last_seen_of(job))
        run, now = self.run_of(job), time.time()
        events = [run.checkpointed(now, saved)] if saved[1] else []
        await self.publish([*events, run.evicted(now, job.stop_reason or "preempted", saved)])

    async def after_run(self, job: Tracked) -> None:
        """A run ended in the log (evicted: its node lost, a rollback, a preemption): pods of it still bound are
        taken back, and a Job is suspended until it is placed again."""
        if job.kind == JOB:
            if job.state == WAITING:
                await self.actions.suspend(job.namespace, job.name, True)
            return
        if job.state == WAITING:
            leftovers = [p for p in self.cache.pods_of(job) if p.get("spec", {}).get("nodeName") and not is_terminal(p)]
            if leftovers and not job.cancelled:
                await self.keep_templates(job)
            for pod in leftovers:
                await self.delete_pod(job, meta(pod)["name"], 0)
            if not job.cancelled:
                await self.remake(job, self.cache.pods_of(job))
        elif job.state == ENDED:
            self.explain_due.discard(job.job_id)

    # --- reports from the pods ----------------------------------------------------------------------

    async def observe(self, job: Tracked) -> None:
        """A pod of the job changed: the reports its pods call for (`libs/kube/run_reports.py`); a stopping
        run's end once its pods are gone."""
        if job.state == STOPPING:
            await self.check_stopped(job)
            return
        if job.state != PLACED or not job.run:
            return
        saved = resume_point(self.cache.pods_of(job))
        if saved[1] and saved[0] > job.saved[0]:  # a checkpoint written while it runs is the job's at once
            await self.publish([self.run_of(job).checkpointed(time.time(), saved)])
        if job.kind == JOB:
            return  # a Job's start and end come from the Job's status
        events, failed = pods_reports(self.run_of(job), self.cache.pods_of(job), time.time())
        await self.publish(events)
        if failed:
            await self.stop_others(job, failed)

    def run_of(self, job: Tracked) -> Run:
        return Run(job.job_id, job.run, SOURCE, replicas=len(job.placements), started_reported=job.started_reported)

    async def stop_others(self, job: Tracked, failed: list[Obj]) -> None:
        """A gang cannot go on with a member gone: the others are stopped at once."""
        for pod in self.cache.pods_of(job):
            if pod not in failed and not is_terminal(pod) and not is_going(pod):
                await self.delete_pod(job, meta(pod)["name"], 0)

    async def observe_batch_job(self, job: Tracked, obj: Obj) -> None:
        """A placed Job's status changed: the reports it calls for."""
        if job.state == STOPPING:
            await self.check_stopped(job)
            return
        if job.state == PLACED and job.run:
            cache = self.cache
            await self.publish(batch_job_reports(self.run_of(job), obj, cache.pods_of(job), cache.last_seen_of(job),
                                                 time.time()))
