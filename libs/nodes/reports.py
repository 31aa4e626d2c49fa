"""The one model of an executor's reports about a run, shared by every executor: the node agents' process
executor, the Kubernetes bridge, node-telemetry when it reports for a lost node, and the simulated executor.

A run is named by its JobPlaced event id. Every report about it has an id derived from the run and what
happened, so the same report is the same message whoever makes it: when a node is lost, node-telemetry
reports its jobs evicted on the executor's behalf; if the executor reports too, or another replica of it
does, the server keeps only the first.

What every executor does the same way:
- a stop (preempted, drained, cancelled, lost) is reported as `evicted` with the reason and the last
  checkpoint the run is known to have, so that the next run resumes from it;
- checkpoint on stop (`stopped`): a checkpoint found as the run stops that is newer than the last one
  reported is reported first, and the eviction carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts import EventBase, JobCheckpointed, JobEvicted, JobFailed, JobFinished, JobReady, JobStarted
from libs.core.kernel.decider import derived_id

EXECUTOR = "executor"
Saved = tuple[float, str]  # (progress in seconds, checkpoint reference)
NOTHING_SAVED: Saved = (0.0, "")


@dataclass(frozen=True)
class RunReports:
    job_id: str
    run: str  # the JobPlaced id
    source: str
    executor: str = ""  # who runs it, as JobStarted says
    # The first part of the derived report ids. The simulated executor keeps its own (its reports are recorded
    # in the replayed logs, whose decisions name them as their cause).
    id_prefix: str = EXECUTOR

    def report_id(self, what: str) -> str:
        return derived_id(self.id_prefix, self.run, what)

    def _fields(self, what: str, now: float) -> dict[str, Any]:
        return {"id": self.report_id(what), "ts": now, "source": self.source, "correlation_id": self.job_id,
                "job_id": self.job_id, "run": self.run}

    def started(self, now: float) -> EventBase:
        return JobStarted(**self._fields("started", now), executor=self.executor or self.source)

    def ready(self, now: float) -> EventBase:
        return JobReady(**self._fields("ready", now))

    def finished(self, now: float) -> EventBase:
        return JobFinished(**self._fields("finished", now))

    def failed(self, now: float, code: int, reason: str) -> EventBase:
        return JobFailed(**self._fields("failed", now), exit_code=code, reason=reason)

    def evicted(self, now: float, reason: str, saved: Saved = NOTHING_SAVED) -> EventBase:
        return JobEvicted(**self._fields("evicted", now), reason=reason,
                          checkpoint=saved[1], progress_s=saved[0])

    def checkpointed(self, now: float, saved: Saved, what: str = "") -> EventBase:
        """`what` names the report; by default the progress, so that each new checkpoint is a report of its own."""
        return JobCheckpointed(**self._fields(what or f"checkpoint/{saved[0]:.3f}", now),
                               checkpoint=saved[1], progress_s=saved[0])

    def stopped(self, now: float, reason: str, saved: Saved, found: Saved | None = None) -> list[EventBase]:
        """The run stopped (`reason`): `saved` is the last checkpoint reported, `found` one the run left as it
        stopped. The newer is kept: reported first if it is new, and carried by the eviction."""
        if found is not None and found[0] > saved[0]:
            return [self.checkpointed(now, found), self.evicted(now, reason, found)]
        return [self.evicted(now, reason, saved)]
