"""A read-only book of quota's figures, folded from the log as the quota decider folds them: each queue's usage
(with its decayed usage), the quota book's reservations by flavor, budgets, and the policy. It keeps of each job
only what those figures need (its queue, demand, flavor, whether it holds quota), and decides nothing. Accounting
folds it for its queue views; the quota decider's own fold (libs/core/quota/fold.py) keeps the same figures by
the same rules (kernel/quota_figures.py), a job's life included: admitted from its submission, holding quota
from QuotaReserved to QuotaReleased, waiting again after the reasons in WAITS_AGAIN, forgotten when its run is
over."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts import (
    EventBase,
    JobAdmitted,
    JobCancelled,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.kernel.budgets import BudgetBook
from libs.core.kernel.fairness import DecayedUsage
from libs.core.kernel.flavors import reservation_model
from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.quota_figures import WAITS_AGAIN, budget_left_s, budget_period, charge_queue, fair_share
from libs.core.kernel.quota_math import ANY, QuotaBook


@dataclass(slots=True)
class Reservation:
    """An admitted job as quota's figures see it: pending, or reserved (holding `demand` of `flavor`)."""

    queue: str
    demand: int
    spec: JobSpec
    state: str = "pending"
    flavor: str = ANY
    over_budget: bool = False
    model: str = ""  # the GPU model placement placed it on ("" not placed)


@dataclass(slots=True)
class QuotaLedger:
    policy: PolicyBook = field(default_factory=PolicyBook)
    queue_used: dict[str, int] = field(default_factory=dict)
    decayed: dict[str, DecayedUsage] = field(default_factory=dict)
    budgets: BudgetBook = field(default_factory=BudgetBook)
    jobs: dict[str, Reservation] = field(default_factory=dict)
    submitted: dict[str, JobSpec] = field(default_factory=dict)  # submissions not admitted yet
    reserved: dict[str, dict[str, None]] = field(default_factory=dict)  # queue -> jobs holding quota, in order

    @property
    def book(self) -> QuotaBook:
        return self.policy.quotas

    def fold(self, event: EventBase) -> None:
        FOLDS.get(type(event), _nothing)(self, event)

    def fair_share(self, queue: str, now: float) -> float:
        return fair_share(self, queue, now)

    def budget_left_s(self, queue: str, now: float) -> float | None:
        return budget_left_s(self, queue, now)


def _nothing(ledger: QuotaLedger, event: EventBase) -> None:
    pass


def _submitted(ledger: QuotaLedger, event: JobSubmitted) -> None:
    ledger.submitted[event.job_id] = event.spec


def _admitted(ledger: QuotaLedger, event: JobAdmitted) -> None:
    spec = ledger.submitted.pop(event.job_id, None)
    if spec is None or event.job_id in ledger.jobs:
        return
    ledger.jobs[event.job_id] = Reservation(queue=spec.queue, demand=demand_milli(spec), spec=spec)


def _end(ledger: QuotaLedger, job_id: str) -> None:
    """The job is over: a waiting one is forgotten (one holding quota is, when its quota goes back)."""
    job = ledger.jobs.get(job_id)
    if job is not None and job.state == "pending":
        del ledger.jobs[job_id]
        ledger.budgets.forget(job_id)


def _cancelled(ledger: QuotaLedger, event: JobCancelled) -> None:
    _end(ledger, event.job_id)


def _reserved(ledger: QuotaLedger, event: QuotaReserved) -> None:
    # A decision can follow the input that ended its job in the log (decisions are published after later inputs).
    job = ledger.jobs.get(event.job_id)
    if job is None or job.state != "pending":
        return
    job.state, job.flavor, job.over_budget = "reserved", event.flavor or ANY, event.over_budget
    ledger.reserved.setdefault(job.queue, {})[event.job_id] = None
    charge_queue(ledger, job.queue, job.flavor, job.demand, job.over_budget, event.ts)


def _released(ledger: QuotaLedger, event: QuotaReleased) -> None:
    job = ledger.jobs.get(event.job_id)
    if job is None or job.state != "reserved":
        return
    ledger.reserved[job.queue].pop(event.job_id, None)
    charge_queue(ledger, job.queue, job.flavor, -job.demand, job.over_budget, event.ts)
    job.model = ""
    if event.reason in WAITS_AGAIN:
        job.state = "pending"
    else:
        del ledger.jobs[event.job_id]
        ledger.budgets.forget(event.job_id)


def _placed(ledger: QuotaLedger, event: JobPlaced) -> None:
    job = ledger.jobs.get(event.job_id)
    if job is None:
        return
    ledger.budgets.placed(event.job_id, event.placements)
    job.model = next((r.model for r in event.placements if r.model), "")
    if job.state == "reserved":  # now its model is known: charged to a flavor its queue no longer has, it moves
        job.flavor = ledger.book.recharge_placed(job.queue, job.flavor, job.model, job.demand, job.over_budget)


def _started(ledger: QuotaLedger, event: JobStarted) -> None:
    job = ledger.jobs.get(event.job_id)
    if job is not None:
        ledger.budgets.started(event.job_id, job.queue, job.demand / 1000, event.ts,
                               budget_period(ledger.policy, job.queue))


def _run_stopped(ledger: QuotaLedger, event: JobFinished | JobFailed | JobEvicted) -> None:
    job = ledger.jobs.get(event.job_id)
    if job is not None:
        ledger.budgets.stopped(event.job_id, event.ts, budget_period(ledger.policy, job.queue))


def _finished(ledger: QuotaLedger, event: JobFinished) -> None:
    _run_stopped(ledger, event)
    _end(ledger, event.job_id)


def _failed(ledger: QuotaLedger, event: JobFailed) -> None:
    _run_stopped(ledger, event)
    job = ledger.jobs.get(event.job_id)
    if job is None or job.state != "reserved":  # (a reserved one keeps its quota until it goes back)
        _end(ledger, event.job_id)


def _queue_policy(ledger: QuotaLedger, event: QueuePolicyChanged) -> None:
    """The queue's reservations follow its current flavors (QuotaBook.recharge)."""
    ledger.policy.apply(event)
    queue = event.queue.name
    for job_id in ledger.reserved.get(queue, {}):
        job = ledger.jobs[job_id]
        model = reservation_model(job.flavor, job.model, job.spec)
        job.flavor = ledger.book.recharge(queue, job.flavor, model, job.demand, job.over_budget)


def _policy(ledger: QuotaLedger, event: EventBase) -> None:
    ledger.policy.apply(event)


FOLDS: dict[type[EventBase], Callable[[QuotaLedger, Any], None]] = {
    JobSubmitted: _submitted,
    JobAdmitted: _admitted,
    JobCancelled: _cancelled,
    QuotaReserved: _reserved,
    QuotaReleased: _released,
    JobPlaced: _placed,
    JobStarted: _started,
    JobFinished: _finished,
    JobFailed: _failed,
    JobEvicted: _run_stopped,
    QueuePolicyChanged: _queue_policy,
    PriorityClassesChanged: _policy,
    SchedulingSettingsChanged: _policy,
}
