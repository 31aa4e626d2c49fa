"""A queue's preemption and flavor policies kept (libs/core/kernel/queue_policies.py, the rules the deciders
apply): every victim of a preemption decision is one its preemptor's queue allows, by the victim's reason (a
reclaim's by reclaim_within_cohort, a borrowing preemptor's by borrow_within_cohort, one of its own queue by
within_queue_preemption); and no reservation takes a flavor past one its queue's when_can_preempt makes the job
wait at (its nominal quota there would hold the job, lent out: a reclaim gives it back, one that may take a job
holding that quota).

Judged by the queue policy bound at the decision's trigger (the QuotaBook of quota_limits.py, with its
reservations), the priority classes as logged before the decision, and the jobs' submission times."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from contracts import (
    BORROW_WITHIN_COHORT,
    RECLAIM,
    WITHIN_QUEUE_PRIORITY,
    EventBase,
    JobSpec,
    JobSubmitted,
    PreemptionDecided,
    PriorityClassesChanged,
    QuotaReserved,
)
from libs.audit.guarantees.quota_limits import Held
from libs.audit.guarantees.violation import QUEUE_POLICY, Violation
from libs.audit.guarantees.world import World
from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.queue_policies import (
    borrowing_preemption_allows,
    flavors_in_turn,
    reclaim_allows,
    waits_to_preempt,
    within_queue_allows,
)
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.kernel.usable_flavors import MODEL_EVENTS, ModelCounts

T = TypeVar("T")
SETTING_OF = {RECLAIM: "reclaim_within_cohort", BORROW_WITHIN_COHORT: "borrow_within_cohort",
              WITHIN_QUEUE_PRIORITY: "within_queue_preemption"}


@dataclass(slots=True)
class QueuePolicies:
    classes: PolicyBook = field(default_factory=PolicyBook)  # its priority classes only
    submitted: dict[str, float] = field(default_factory=dict)
    models: ModelCounts = field(default_factory=ModelCounts)

    def fold(self, event: EventBase) -> None:
        if isinstance(event, JobSubmitted):
            self.submitted.setdefault(event.job_id, event.ts)
        elif isinstance(event, PriorityClassesChanged):
            self.classes.apply(event)
        elif isinstance(event, MODEL_EVENTS):
            self.models.fold(event)

    def preemption(self, seq: int, event: PreemptionDecided, spec: JobSpec | None, book: QuotaBook
                   ) -> list[Violation]:
        """Each victim allowed by the preemptor's queue's setting for its reason."""
        if spec is None:
            return []
        queue = book.queues.get(spec.queue)
        priority = self.classes.priority_of(spec)
        arrived = self.submitted.get(event.preemptor_id, event.ts)
        limits = book.limits.get(spec.queue)
        within_nominal = not limits or any(demand_milli(spec) <= lim.nominal for lim in limits.values())
        out = []
        for v in event.victims:
            if v.reason == RECLAIM:
                allowed = reclaim_allows(queue, priority, v.priority)
            elif v.reason == BORROW_WITHIN_COHORT:
                allowed = borrowing_preemption_allows(queue, priority, v.priority)
            elif v.reason == WITHIN_QUEUE_PRIORITY:
                newer = self.submitted.get(v.job_id, event.ts) > arrived
                allowed = within_queue_allows(queue, priority, v.priority, newer, within_nominal)
            else:
                continue  # least attained service: a rule of its own (las_threshold_gpu_hours)
            if not allowed:
                setting = SETTING_OF[v.reason]
                out.append(Violation(QUEUE_POLICY, seq, (event.preemptor_id, v.job_id),
                                     f"{event.preemptor_id} (priority {priority}, queue {spec.queue}) evicts "
                                     f"{v.job_id} (priority {v.priority}, queue {v.queue}) as {v.reason}, which "
                                     f"its queue's {setting} {getattr(queue, setting, '')!r} does not allow"))
        return out

    def reserved(self, seq: int, event: QuotaReserved, spec: JobSpec | None, book: QuotaBook,
                 held: Mapping[str, Held], specs: Mapping[str, JobSpec]) -> list[Violation]:
        """The reservation's flavor is one the queue's when_can_preempt lets the job take (judged on the book
        before it, and on the reservations `held` there)."""
        queue = book.queues.get(event.queue)
        if spec is None or event.over_budget or not waits_to_preempt(queue) or not book.governed(event.queue):
            return []
        demand = event.gpu_milli
        flavors = book.flavors_for(event.queue, spec)
        if len(flavors) > 1:
            flavors = list(self.models.servable(tuple(flavors), spec, demand))
        def lent_to(flavor: str) -> list[tuple[int, int]]:
            """The jobs holding what the queue lent of the flavor, each as its priority and its quota."""
            holders = set(book.holders_of_lent(event.queue))
            return [(self.classes.priority_of(specs[j]), h.milli) for j, h in held.items()
                    if j in specs and h.queue in holders and h.flavor == flavor
                    and book.holds_lent(event.queue, h.queue, flavor, h.over_budget)]

        in_turn = flavors_in_turn(queue, flavors, demand, lambda f: (book.nominal_left(event.queue, f),
                                                                     book.room(event.queue, f)),
                                  self.classes.priority_of(spec), lent_to)
        flavor = event.flavor or ANY
        if flavor not in flavors or flavor in in_turn:
            return []
        return [Violation(QUEUE_POLICY, seq, (event.job_id,),
                          f"job {event.job_id} reserved flavor {flavor} of queue {event.queue} past flavor "
                          f"{in_turn[-1]}, whose nominal quota would hold it once a reclaim it may make takes back "
                          "lent quota (when_can_preempt preempt waits there)")]


def reclaim_allowed(world: World, queue: str, first: str | None, running: list[tuple[str, T]]) -> list[tuple[str, T]]:
    """The borrower jobs (job id first) the queue's reclaim_within_cohort lets a reclaim for its first waiting
    job `first` take (all of them without one)."""
    spec = world.quota.policy.queues.get(queue)
    job = world.quota.jobs.get(first) if first is not None else None
    if job is None:
        return running
    priority = world.quota.policy.priority_of(job.spec)
    jobs = world.jobs
    return [(j, state) for j, state in running
            if j in jobs and reclaim_allows(spec, priority, world.quota.policy.priority_of(jobs[j].spec))]
