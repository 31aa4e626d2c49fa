"""How long each job of a recorded log ran, from the executors' reports in it.

A replay in virtual time must know how long every job really runs. A job that declared nothing of it (a real
user's job, an inference replica) gives the simulated executor nothing to go by; the log it ran in is then
the only witness: its runs, from JobStarted to their end, or to the log's end for one still going.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from contracts import RUNTIME_LIMIT, EventBase, JobCheckpointed, JobEvicted, JobFailed, JobFinished, JobStarted


@dataclass(frozen=True, slots=True)
class Observed:
    # Seconds of work the log shows the job did: its longest run, counting the progress that run resumed from
    # (a checkpoint), so a job preempted and run again is not charged twice for the same work.
    work_s: float
    running_at_end: bool  # its last run was still going at the log's end: work_s counts up to then
    at_limit: bool  # its last run was stopped at its max_runtime_s (then the limit says how long it runs)


@dataclass(slots=True)
class _Going:
    run: str  # the placement it runs (empty: a report that names none)
    since: float
    resumed_s: float  # progress it resumed from


def _same_run(a: str, b: str) -> bool:
    """A report that names no run is about the job's current one."""
    return not a or not b or a == b


def observed_runs(log: Iterable[EventBase], end: float) -> dict[str, Observed]:
    """Per job that started in the log (jobs that never started are absent): the work it did, to `end` for
    a run still going then."""
    going: dict[str, _Going] = {}
    saved: dict[str, float] = {}  # job -> progress its last checkpoint holds
    work: dict[str, float] = {}
    limited: dict[str, bool] = {}
    for e in log:
        if isinstance(e, JobStarted):
            now = going.get(e.job_id)
            if now is None or not _same_run(now.run, e.run):  # a start reported twice is one start
                going[e.job_id] = _Going(e.run, e.ts, saved.get(e.job_id, 0.0))
                work.setdefault(e.job_id, 0.0)
        elif isinstance(e, JobCheckpointed):
            saved[e.job_id] = e.progress_s
        elif isinstance(e, JobFinished | JobFailed | JobEvicted):
            run = going.get(e.job_id)
            if run is None or not _same_run(run.run, e.run):
                continue  # a late report about a run that is over
            del going[e.job_id]
            work[e.job_id] = max(work[e.job_id], run.resumed_s + max(0.0, e.ts - run.since))
            limited[e.job_id] = isinstance(e, JobFailed) and e.reason == RUNTIME_LIMIT
            if isinstance(e, JobEvicted):
                saved[e.job_id] = e.progress_s
            elif isinstance(e, JobFailed):
                saved.pop(e.job_id, None)  # a failed run keeps nothing: the next starts over
    for job, run in going.items():
        work[job] = max(work[job], run.resumed_s + max(0.0, end - run.since))
    return {job: Observed(round(w, 3), job in going, limited.get(job, False)) for job, w in work.items()}
