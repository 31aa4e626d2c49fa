"""Whether a failed job runs again, and after how long: one pure rule every consumer of JobFailed applies
to the same facts (the job's spec, its class, how often it has failed), so all agree without a message.

A failure is retryable when its exit code says the job was killed rather than wrong (128 and above: a
signal, e.g. 137 for the OOM killer) or is one the job lists as retryable, or when the executor names an
infrastructure reason (a lost node, a failed GPU). A run its executor stopped at the job's `max_runtime_s`
(reason RUNTIME_LIMIT) is never retried, whatever its exit code: the job ran out of the time it declared (Slurm's
TIMEOUT), no fault of the infrastructure. Retries back off exponentially from the class's `retry_backoff_s`, up to its
`max_retries`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import RUNTIME_LIMIT, JobEvicted, JobFailed, JobFinished, JobSpec
from libs.core.kernel.policy import PolicyBook

INFRASTRUCTURE_REASONS = frozenset({"node_lost", "gpu_unhealthy", "gpu_xid", "executor_lost"})


def retryable(spec: JobSpec, exit_code: int, reason: str) -> bool:
    if reason == RUNTIME_LIMIT:
        return False
    return exit_code >= 128 or exit_code in spec.retry_exit_codes or reason in INFRASTRUCTURE_REASONS


@dataclass(slots=True)
class RetryBook:
    failures: dict[str, int] = field(default_factory=dict)

    def on_failed(self, event: JobFailed, spec: JobSpec | None, policy: PolicyBook) -> float | None:
        """Count the failure; the delay before the job runs again, or None when this failure is final."""
        count = self.failures.get(event.job_id, 0) + 1
        self.failures[event.job_id] = count
        cls = policy.classes.get(spec.priority) if spec is not None else None
        if spec is None or cls is None or count > cls.max_retries or not retryable(spec, event.exit_code,
                                                                                      event.reason):
            self.failures.pop(event.job_id, None)
            return None
        return cls.retry_backoff_s * 2 ** (count - 1)

    def runs_again(self, event: JobFinished | JobFailed | JobEvicted, spec: JobSpec | None,
                   policy: PolicyBook) -> bool:
        """Does the job whose run ended (as `event` reports) run again, or is it over? An evicted job goes back to
        its queue; a failed one runs again when its failure is retried (counted, as on_failed); a finished one
        never does. Every decider that forgets a job once it is over asks this, so none forgets it early."""
        if isinstance(event, JobEvicted):
            return True
        return isinstance(event, JobFailed) and self.on_failed(event, spec, policy) is not None

    def forget(self, job_id: str) -> None:
        self.failures.pop(job_id, None)
