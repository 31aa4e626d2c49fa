"""Quota: which admitted job may consume its queue's GPU quota, in fair order.

Inside a queue the order is priority (high first), then arrival, then job id. A job that does not fit
yet does not block smaller ones behind it (best-effort FIFO); it gets one QuotaDeferred per reason, which
the preemption service uses to reclaim quota from lower-priority jobs of the same queue.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobSubmitted,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.decider import Chain, Decisions, Trigger
from libs.core.policy import PolicyBook, demand_milli

SERVICE = "quota"
QUEUE_QUOTA_EXHAUSTED = "queue_quota_exhausted"
BEHIND_HIGHER_PRIORITY = "behind_higher_priority"

PendingKey = tuple[int, int, str]  # (-priority, arrival, job id)


@dataclass(slots=True)
class QuotaJob:
    queue: str
    key: PendingKey
    demand: int
    state: str = "pending"  # pending | reserved | ended


class QuotaDecider:
    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.policy = PolicyBook()
        self.jobs: dict[str, QuotaJob] = {}
        self.pending: dict[str, list[PendingKey]] = {}
        self.used: dict[str, int] = {}
        self.deferred: dict[str, str] = {}
        self.behind: dict[str, dict[str, None]] = {}  # queue -> jobs told they wait behind a higher priority
        self._arrivals = 0
        self._specs: dict[str, JobSubmitted] = {}

    def input_types(self) -> Iterable[type[EventBase]]:
        return (QueuePolicyChanged, PriorityClassesChanged, JobSubmitted, JobAdmitted, JobCancelled,
                JobFinished, JobFailed, JobEvicted)

    # --- state -----------------------------------------------------------------------------------

    def _enqueue(self, job_id: str) -> None:
        job = self.jobs[job_id]
        job.state = "pending"
        bisect.insort(self.pending.setdefault(job.queue, []), job.key)

    def _dequeue(self, job: QuotaJob) -> None:
        keys = self.pending.get(job.queue, [])
        i = bisect.bisect_left(keys, job.key)
        if i < len(keys) and keys[i] == job.key:
            keys.pop(i)

    def evolve(self, event: EventBase) -> None:
        if self.policy.apply(event):
            return
        match event:
            case JobSubmitted():
                self._specs[event.job_id] = event
            case JobAdmitted():
                sub = self._specs.pop(event.job_id, None)
                if sub is None or event.job_id in self.jobs:
                    return
                self._arrivals += 1
                key = (-self.policy.priority_of(sub.spec), self._arrivals, event.job_id)
                self.jobs[event.job_id] = QuotaJob(queue=sub.spec.queue, key=key, demand=demand_milli(sub.spec))
                self._enqueue(event.job_id)
            case QuotaReserved():
                job = self.jobs[event.job_id]
                self._dequeue(job)
                job.state = "reserved"
                self.used[job.queue] = self.used.get(job.queue, 0) + job.demand
                self.deferred.pop(event.job_id, None)
                self.behind.get(job.queue, {}).pop(event.job_id, None)
            case QuotaReleased():
                job = self.jobs[event.job_id]
                job.state = "released"
                self.used[job.queue] -= job.demand
            case QuotaDeferred():
                self.deferred[event.job_id] = event.code
                behind = self.behind.setdefault(event.queue, {})
                if event.code == BEHIND_HIGHER_PRIORITY:
                    behind[event.job_id] = None
                else:
                    behind.pop(event.job_id, None)
            case JobCancelled() | JobFinished() | JobFailed():
                self._end(event.job_id)

    def _end(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        if job.state == "pending":
            self._dequeue(job)
            job.state = "ended"
        self.deferred.pop(job_id, None)
        self.behind.get(job.queue, {}).pop(job_id, None)

    # --- decisions -------------------------------------------------------------------------------

    def react(self, trigger: Trigger) -> list[EventBase]:
        out = Decisions(SERVICE, trigger, self.evolve, self.chain)
        event = trigger.event
        match event:
            case JobAdmitted():
                job = self.jobs.get(event.job_id)
                if job is not None and job.state == "pending":
                    self._admit_one(event.job_id, job, out)
            case JobFinished() | JobFailed() | JobCancelled() | JobEvicted():
                self._release(event, out)
            case QueuePolicyChanged():
                self._serve_queue(event.queue.name, out)
            case PriorityClassesChanged():
                for queue in sorted(self.pending):
                    self._serve_queue(queue, out)
        return out.out

    def _release(self, event: JobFinished | JobFailed | JobCancelled | JobEvicted, out: Decisions) -> None:
        job = self.jobs.get(event.job_id)
        if job is None or job.state != "reserved":
            return
        reason = type(event).__name__.removeprefix("Job").lower()
        out.emit(QuotaReleased, correlation_id=event.job_id, job_id=event.job_id, queue=job.queue,
                 gpu_milli=job.demand, reason=reason)
        if isinstance(event, JobEvicted):
            # An evicted job goes back to its queue with its original arrival; a cancelled one ends.
            self._enqueue(event.job_id)
        else:
            job.state = "ended"
        self._serve_queue(job.queue, out)

    def free_milli(self, queue: str) -> int | None:
        quota = self.policy.quota_milli(queue)
        return None if quota is None else quota - self.used.get(queue, 0)

    def _try_reserve(self, job_id: str, job: QuotaJob, out: Decisions) -> bool:
        free = self.free_milli(job.queue)
        if free is None or job.demand <= free:
            out.emit(QuotaReserved, correlation_id=job_id, job_id=job_id, queue=job.queue, gpu_milli=job.demand)
            return True
        self._defer(job_id, job, QUEUE_QUOTA_EXHAUSTED,
                    f"queue {job.queue} has {free / 1000:g} of its quota free, the job needs "
                    f"{job.demand / 1000:g} GPUs", job.demand - free, out)
        return False

    def _defer(self, job_id: str, job: QuotaJob, code: str, message: str, shortfall: int, out: Decisions) -> None:
        if self.deferred.get(job_id) != code:
            out.emit(QuotaDeferred, correlation_id=job_id, job_id=job_id, queue=job.queue, code=code,
                     message=message, shortfall_milli=shortfall)

    def _admit_one(self, job_id: str, job: QuotaJob, out: Decisions) -> None:
        """A newly admitted job may not overtake a waiting job of higher priority in its queue."""
        keys = self.pending.get(job.queue, [])
        head = keys[0] if keys else job.key
        if head != job.key and head[0] < job.key[0]:
            self._defer(job_id, job, BEHIND_HIGHER_PRIORITY,
                        f"a job of higher priority waits for queue {job.queue}'s quota first", 0, out)
            return
        self._try_reserve(job_id, job, out)

    def _serve_queue(self, queue: str, out: Decisions) -> None:
        """Pending jobs in fair order. A job that does not fit holds back every job of LOWER priority
        (so quota freed for it, e.g. by preemption, is not taken by the jobs it displaced); jobs of its
        own priority may still use what is left. An already deferred job emits nothing again."""
        blocked_from: int | None = None  # the (negated) priority of the first job that did not fit
        for key in list(self.pending.get(queue, [])):
            if blocked_from is not None and key[0] > blocked_from:
                break
            free = self.free_milli(queue)
            if free is not None and free <= 0 and self.deferred.get(key[2]) == QUEUE_QUOTA_EXHAUSTED:
                break  # nothing fits any more; the jobs after it were told why already
            if not self._try_reserve(key[2], self.jobs[key[2]], out) and blocked_from is None:
                blocked_from = key[0]
        self._unblock_behind(queue, out)

    def _unblock_behind(self, queue: str, out: Decisions) -> None:
        """Jobs told they wait behind a higher-priority job, whose blocker is gone now, learn the real
        reason (the queue's quota) or get their quota."""
        behind = [j for j in self.behind.get(queue, {}) if self.jobs[j].state == "pending"]
        keys = self.pending.get(queue, [])
        for job_id in behind:
            job = self.jobs[job_id]
            if keys and keys[0] != job.key and keys[0][0] < job.key[0]:
                continue  # still behind someone of higher priority
            self._try_reserve(job_id, job, out)

    def snapshot(self) -> bytes:
        return msgspec.json.encode({
            "used": self.used,
            "pending": self.pending,
            "jobs": {k: (j.queue, j.state, j.demand) for k, j in self.jobs.items()},
        })
