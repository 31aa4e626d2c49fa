"""The platform as the log last described it, for the liveness questions: each job's phase and the reason it
was last given for waiting, the cluster's free capacity (with node health and cordons), the quota decider's
own state (folded by its own fold, so "room" and "pending" mean what they mean to it), and the
preemptors' nominations."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import (
    RECLAIM,
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobSpec,
    JobSubmitted,
    PlacementDeferred,
    PreemptionDecided,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    SubmitJob,
)
from libs.audit.guarantees.capacity import Capacity
from libs.core.kernel.attained_service import least_served
from libs.core.kernel.quota_figures import PLACEMENT_TIMEOUT
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.runs import CurrentRuns
from libs.core.quota.fold import FOLDED as QUOTA_FOLDED
from libs.core.quota.fold import fold as quota_fold
from libs.core.quota.state import QuotaState

# Phases of a job as the log tells them.
SUBMITTED = "submitted"  # no admission decision yet
QUOTA = "quota"  # admitted, waiting for quota
PLACEMENT = "placement"  # quota reserved, waiting for a place
RUNNING = "running"
LEAVING = "leaving"  # evicted, or failed: its quota not given back yet
ENDED = "ended"  # finished, failed for good, cancelled or rejected


@dataclass(slots=True)
class JobState:
    spec: JobSpec
    phase: str = SUBMITTED
    reason: str = ""  # the code of the last deferral in this phase ("" when none was given)
    since: float = 0.0  # when the phase began
    # When it began to wait for a place, kept over placement timeouts until it is placed, as placement keeps it
    # for its starvation limit (None: not waiting for a place).
    place_wait_since: float | None = None
    flavor: str = ANY  # of its quota reservation
    over_budget: bool = False
    cancelled: bool = False
    # The minimum runtime its current run started with (its class's then): a run keeps it whatever the class
    # says later, as preemption keeps it.
    min_runtime_s: float = 0.0
    ended_as: str = ""


@dataclass(slots=True)
class World:
    capacity: Capacity = field(default_factory=Capacity)
    quota: QuotaState = field(default_factory=QuotaState)
    jobs: dict[str, JobState] = field(default_factory=dict)
    # preemptor -> when its victims were chosen
    nominated: dict[str, float] = field(default_factory=dict)
    # nominated preemptors whose victims include another queue's (a reclaim): they hold their room against
    # every other queue's jobs, not only against lower priorities
    reclaiming: dict[str, None] = field(default_factory=dict)
    # nominated preemptors with a victim of least attained service: they hold their room against the jobs of
    # their own queue and priority too
    least_served: dict[str, None] = field(default_factory=dict)
    # Jobs whose quota is reserved and which wait for a place (an index of `jobs`: there are few of them).
    placing: dict[str, None] = field(default_factory=dict)
    now: float = 0.0
    # Each job's current run: an executor's report about a run that is over changes nothing (libs/core/kernel/runs.py,
    # the rule every decider is run with), neither the job's phase nor the capacity of its current run.
    runs: CurrentRuns = field(default_factory=CurrentRuns)

    def apply(self, event: EventBase) -> None:
        self.now = max(self.now, event.ts)
        if self.runs.is_stale(event):
            return
        self.runs.fold(event)
        if isinstance(event, QUOTA_FOLDED):
            quota_fold(self.quota, event)
        self._lifecycle(event)
        self._cluster(event)

    def _lifecycle(self, event: EventBase) -> None:
        match event:
            case SubmitJob() | JobSubmitted():
                held = self.jobs.get(event.job_id)
                if held is None or held.phase == SUBMITTED:
                    self.jobs[event.job_id] = JobState(spec=event.spec, since=event.ts)
            case QuotaDeferred():
                self._reason(event.job_id, QUOTA, event.code)
            case PlacementDeferred():
                self._reason(event.job_id, PLACEMENT, event.code)
            case JobAdmitted():
                self._enter(event.job_id, QUOTA, event.ts, only_from=(SUBMITTED,))
            case QuotaReserved():
                job = self._enter(event.job_id, PLACEMENT, event.ts, only_from=(QUOTA, SUBMITTED))
                if job is not None:
                    job.flavor, job.over_budget = event.flavor or ANY, event.over_budget
                    if job.place_wait_since is None:
                        job.place_wait_since = event.ts
            case JobPlaced():
                placed = self._enter(event.job_id, RUNNING, event.ts)
                if placed is not None:
                    placed.place_wait_since = None
                    placed.min_runtime_s = self.quota.policy.min_runtime_s(placed.spec)
                self.nominated.pop(event.job_id, None)
                self.reclaiming.pop(event.job_id, None)
                self.least_served.pop(event.job_id, None)
            case JobFinished():
                self._end(event.job_id, "finished", event.ts)
            case JobFailed() | JobEvicted():
                job = self.jobs.get(event.job_id)
                if job is not None and job.cancelled:
                    self._end(event.job_id, "cancelled", event.ts)
                else:
                    # Failed for good, or back to its queue: its QuotaReleased says which.
                    self._enter(event.job_id, LEAVING, event.ts)
            case QuotaReleased():
                job = self.jobs.get(event.job_id)
                if job is not None and job.phase == LEAVING:
                    if event.reason in ("evicted", "retry"):
                        self._enter(event.job_id, QUOTA, event.ts)
                    else:
                        self._end(event.job_id, event.reason, event.ts)
                elif job is not None and job.phase == PLACEMENT and event.reason == PLACEMENT_TIMEOUT:
                    # No node held it in time: it waits for quota again, and what placement said of it
                    # before is no reason for this wait (quota tells the new one).
                    self._enter(event.job_id, QUOTA, event.ts)
            case JobCancelled():
                job = self.jobs.get(event.job_id)
                self.nominated.pop(event.job_id, None)
                self.reclaiming.pop(event.job_id, None)
                self.least_served.pop(event.job_id, None)
                if job is not None:
                    job.cancelled = True
                    if job.phase != RUNNING:
                        self._end(event.job_id, "cancelled", event.ts)
            case JobRejected():
                if event.job_id not in self.jobs and event.spec is not None:
                    self.jobs[event.job_id] = JobState(spec=event.spec)
                self._end(event.job_id, f"rejected ({event.code})", event.ts)
            case PreemptionDecided():
                self.nominated[event.preemptor_id] = event.ts
                if any(v.reason == RECLAIM for v in event.victims):
                    self.reclaiming[event.preemptor_id] = None
                else:
                    self.reclaiming.pop(event.preemptor_id, None)
                if least_served(event):
                    self.least_served[event.preemptor_id] = None
                else:
                    self.least_served.pop(event.preemptor_id, None)
            case QueuePolicyChanged():
                # The queue's reservations follow its current flavors, as the quota decider moved them.
                for job_id in self.quota.reserved.get(event.queue.name, {}):
                    job = self.jobs.get(job_id)
                    if job is not None:
                        job.flavor = self.quota.jobs[job_id].flavor

    def _cluster(self, event: EventBase) -> None:
        cluster = self.capacity.cluster
        match event:
            case JobPlaced():
                job = self.jobs.get(event.job_id)
                self.capacity.place(0, event, job.spec if job is not None else None)
            case JobFinished() | JobFailed() | JobEvicted():
                self.capacity.release(event.job_id)
            case _:
                cluster.apply_node_event(event)

    def _enter(self, job_id: str, phase: str, ts: float, only_from: tuple[str, ...] = ()) -> JobState | None:
        job = self.jobs.get(job_id)
        if job is None or job.phase == ENDED or (only_from and job.phase not in only_from):
            return None
        self._phase(job_id, job, phase)
        job.reason, job.since = "", ts
        return job

    def _reason(self, job_id: str, phase: str, code: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.phase == phase:
            job.reason = code

    def _end(self, job_id: str, how: str, ts: float) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.phase != ENDED:
            self._phase(job_id, job, ENDED)
            job.ended_as, job.reason, job.since, job.place_wait_since = how, "", ts, None

    def _phase(self, job_id: str, job: JobState, phase: str) -> None:
        job.phase = phase
        if phase == PLACEMENT:
            self.placing[job_id] = None
        else:
            self.placing.pop(job_id, None)
