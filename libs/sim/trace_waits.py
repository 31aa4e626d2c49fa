"""Why each job of a replayed trace waited before it first started: its queueing delay split by the reason the
deciders last told it, read from the log. The answer to "what is the mean wait made of", per set-up.

A job's wait starts at its submission (`admission` until a decider says more), and each telling starts a new
stretch: quota's reason (`quota:<code>`, e.g. cohort_quota_exhausted, quota_lent_out: a lender waiting for
its reclaim grace and for borrowers to leave), quota given and placement not yet done (`placing`), placement's
reason (`placement:<code>`, e.g. too few free GPUs on any node: fragmentation), victims chosen and leaving
(`preempting`). The stretch in progress at its first start ends there; later waits of a preempted job are in
its completion time, not its queueing delay.
"""

from __future__ import annotations

from contracts import EventBase, JobStarted, PlacementDeferred, PreemptionDecided, QuotaDeferred, QuotaReserved

ADMISSION = "admission"
PLACING = "placing"
PREEMPTING = "preempting"


class WaitReasons:
    """Folds a log, in order, into each job's seconds waited per reason until its first start."""

    def __init__(self, submitted: dict[str, float]) -> None:
        # job -> (reason now, since when); a job leaves it at its first start
        self._now: dict[str, tuple[str, float]] = {j: (ADMISSION, t) for j, t in submitted.items()}
        self.waited: dict[str, dict[str, float]] = {j: {} for j in submitted}

    def fold(self, e: EventBase) -> None:
        if isinstance(e, QuotaDeferred):
            self._tell(e.job_id, f"quota:{e.code}", e.ts)
        elif isinstance(e, PlacementDeferred):
            self._tell(e.job_id, f"placement:{e.code}", e.ts)
        elif isinstance(e, QuotaReserved):
            self._tell(e.job_id, PLACING, e.ts)
        elif isinstance(e, PreemptionDecided):
            self._tell(e.preemptor_id, PREEMPTING, e.ts)
        elif isinstance(e, JobStarted) and e.job_id in self._now:
            self._tell(e.job_id, "", e.ts)
            del self._now[e.job_id]

    def _tell(self, job_id: str, reason: str, ts: float) -> None:
        current = self._now.get(job_id)
        if current is None:
            return  # started already (or not one of the trace's jobs)
        before, since = current
        if ts > since:
            spent = self.waited[job_id]
            spent[before] = spent.get(before, 0.0) + ts - since
        self._now[job_id] = (reason, max(ts, since))
