"""Keyed submissions the API has published but the admission core has not folded yet.

The API answers a repeated idempotency key from the core's state; between publishing a `SubmitJob` and the
core folding its decision (milliseconds, more under load) that state does not know the job yet. Two requests
with one key in that window would both be accepted, and the log would refuse the second one's spec after the
caller was told 201. This book closes the window for the requests this API serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from contracts import JobSpec, SubmitJob

# Long enough for any fold to catch up; an entry never folded (its publish failed after all) goes after this.
KEEP_S = 120.0


@dataclass(slots=True)
class InFlight:
    decided: Container[str]  # the job ids the core has decided (its `jobs`)
    clock: Callable[[], float] = time.monotonic
    _specs: dict[str, tuple[SubmitJob, float]] = field(default_factory=dict)

    def add(self, command: SubmitJob) -> None:
        self._specs[command.job_id] = (command, self.clock())

    def discard(self, job_id: str) -> None:
        self._specs.pop(job_id, None)

    def get(self, job_id: str) -> JobSpec | None:
        """The spec published for `job_id` while the core has not decided it; None otherwise."""
        command = self.command(job_id)
        return None if command is None else command.spec

    def command(self, job_id: str) -> SubmitJob | None:
        """The command published (or being published) for `job_id` while the core has not decided it."""
        self._prune()
        entry = self._specs.get(job_id)
        return None if entry is None else entry[0]

    def _prune(self) -> None:
        oldest = self.clock() - KEEP_S
        for job_id in [j for j, (_, at) in self._specs.items() if j in self.decided or at < oldest]:
            del self._specs[job_id]
