"""Which run of each job is current, so that an executor's late word on an earlier run changes nothing.

A job may be placed, evicted (preempted, its node lost, a GPU removed), requeued and placed again. Each run is
named by the JobPlaced event that started it, and every executor report names its run (`run`). A report read
after its run is over (a slow agent's, an executor's after its restart, a finish racing an eviction) is stale:
applied, it would end the job's current run, release its quota and GPUs, or end a job that waits to run again.
The one rule, `CurrentRuns.is_stale`, is applied to every decider that keeps a book (`runs`) in `run_decider`,
and by the ledger to its whole fold.

A report whose `run` is "" (logs written before reports named their run) is about whatever run is current, as
it always was; so is one about a job the book knows nothing of (a job already over, folded from a log that
began after its placement).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from contracts import (
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobStarted,
)

RUN_REPORTS: Final = (JobStarted, JobReady, JobFinished, JobFailed, JobEvicted, JobCheckpointed)
# What the book looks at: placements and reports (a set lookup per event, on the hot path of every decider).
_REPORT_TYPES: Final[frozenset[type[EventBase]]] = frozenset(RUN_REPORTS)
_TRACKED: Final[frozenset[type[EventBase]]] = frozenset({JobPlaced, *RUN_REPORTS})
NO_RUN: Final = ""  # the job's last run is over; it may be placed again


@dataclass(slots=True)
class CurrentRuns:
    """job -> the JobPlaced id of its current run, or NO_RUN once that run ended, folded from the log."""

    current: dict[str, str] = field(default_factory=dict)

    def is_stale(self, event: EventBase) -> bool:
        """Is it a report about a run that is not the job's current one (over, or replaced by a later one)?"""
        if type(event) not in _REPORT_TYPES or not isinstance(event, RUN_REPORTS) or not event.run:
            return False
        current = self.current.get(event.job_id)
        return current is not None and current != event.run

    def fold(self, event: EventBase) -> None:
        """Fold a placement, or a report `is_stale` found current."""
        if type(event) not in _TRACKED:
            return
        if isinstance(event, JobPlaced):
            self.current[event.job_id] = event.id
        elif isinstance(event, JobFinished) or (isinstance(event, JobEvicted) and event.reason == "cancelled"):
            # Over for good: nothing of the job is kept (a late report of it is then taken as it always was,
            # about a job its consumers have forgotten).
            self.current.pop(event.job_id, None)
        elif isinstance(event, JobFailed | JobEvicted) and event.job_id in self.current:
            # A failure may run again, an eviction requeues: until the next placement, a report of the run that
            # just ended (its finish, racing the eviction) is stale.
            self.current[event.job_id] = NO_RUN

    def fold_all(self, events: Iterable[EventBase]) -> None:
        for event in events:
            if type(event) in _TRACKED:
                self.fold(event)

    def run_of(self, job_id: str) -> str | None:
        """The job's current run (NO_RUN between runs; None when the book does not know the job)."""
        return self.current.get(job_id)
