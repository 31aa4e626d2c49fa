"""What happened to one job of a replayed trace, whichever scheduler ran it (the platform's deciders in
virtual time, or a textbook policy): the figures every trace metric is computed from."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace, as the simulated world knows it: the truth, never all of it told to a scheduler."""

    job_id: str
    team: str
    submit_s: float  # seconds from the trace window's start
    runtime_s: float  # how long it actually runs (on its GPUs, uninterrupted)
    gpus: int


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A trace job's fate. `first_start_s`/`end_s` are None for a job that never started/ended within the run;
    `rejected` for one its set-up could never hold (e.g. more GPUs than its team's partition)."""

    job: TraceJob
    first_start_s: float | None
    end_s: float | None
    rejected: bool = False
    # Times it was preempted, and the GPU-seconds of work those preemptions threw away (since the last
    # checkpoint or start of each run stopped).
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    # Stopped at its declared runtime limit before it was done.
    limit_stopped: bool = False
    # Its queueing delay split by why it waited (the reason the deciders last told it; see trace_run.outcomes):
    # reason code -> seconds. Empty where the scheduler tells no reasons (textbook policies).
    waited_for: dict[str, float] = field(default_factory=dict)
