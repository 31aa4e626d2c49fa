"""How long a replayed history's jobs run when their specs do not say: as long as the log shows they ran.

The simulated executor runs a job for its actual runtime (the label `sim/runtime-s`), else its declared
`duration_s`, else until it is stopped: a job that declares nothing (or only a limit, `max_runtime_s`) would
run for ever, or to its limit, however briefly it really ran, and a replay would charge it for all of that.
So a replay of a recorded log gives each such job the runtime the log witnessed (libs/sim/observed.py) in its
`sim/runtime-s` label, which only the executor reads: the deciders still see a job that declares nothing,
exactly as they did. What the log cannot tell is stopped at the log's end: a job that never started there,
and an inference service still deployed then (its replicas run while it lives). Every replay says how many
jobs it treated so and how (`RuntimeTreatment.note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import msgspec

from contracts import CancelJob, DeleteService, DeployService, EventBase, SubmitJob
from libs.core.kernel.decider import derived_id
from libs.core.kernel.policy import declared_runtime
from libs.sim.executor import SIM_RUNTIME_S, seconds_label
from libs.sim.observed import observed_runs

SOURCE = "whatif"
# Why a job or service the replay stops at the log's end stops: the history recorded goes no further.
END_OF_LOG = "end_of_log"


@dataclass
class RuntimeTreatment:
    undeclared: int = 0  # jobs declaring neither duration_s nor max_runtime_s
    limit_only: int = 0  # jobs declaring only max_runtime_s
    simulated: int = 0  # of those, jobs of a simulated world whose label gives their runtime: left as they are
    observed: int = 0  # run as long as the log shows they ran ...
    running_at_end: int = 0  # ... of which still running at the log's end: as long as they had run by then
    at_limit: int = 0  # stopped at their limit in the log: run to it again
    never_started: int = 0  # no run in the log to go by: stopped at the log's end at the latest
    services: int = 0  # inference services still deployed at the log's end: deleted there

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "note": self.note()}

    def note(self) -> str:
        """What was done, in words; "" when every job's spec says how long it runs."""
        lines = []
        if self.undeclared or self.limit_only:
            what = [f"{_jobs(self.undeclared, 'declares', 'declare')} no runtime (neither duration_s nor "
                    "max_runtime_s)"] if self.undeclared else []
            what += [f"{_jobs(self.limit_only, 'declares', 'declare')} only a limit (max_runtime_s)"
                     ] if self.limit_only else []
            lines.append("; ".join(what) + ". In the replays:")
        if self.observed:
            still = (f" ({self.running_at_end:,} still running at the end of the log: for as long as it had run by "
                     "then)" if self.running_at_end else "")
            lines.append(f"  {_each(self.observed)} as long as the log shows it ran{still}")
        if self.at_limit:
            lines.append(f"  {_each(self.at_limit)} to its limit, where the log shows it stopped")
        if self.never_started:
            lines.append(f"  {_jobs(self.never_started)}: never started in the log, which cannot say how long it "
                         "runs: stopped at the log's end at the latest")
        if self.simulated:
            lines.append(f"  {_each(self.simulated)} the simulated runtime its label {SIM_RUNTIME_S} gives")
        if self.services:
            lines.append(f"{self.services:,} inference service{'' if self.services == 1 else 's'} still deployed "
                         "at the end of the log: deleted there in the replays, the replicas running until then")
        return "\n".join(lines)


def _jobs(n: int, verb_one: str = "", verb_many: str = "") -> str:
    """"1 job declares", "3 jobs declare"."""
    return f"{n:,} job{'' if n == 1 else 's'}" + (f" {verb_one if n == 1 else verb_many}" if verb_one else "")


def _each(n: int) -> str:
    """"1 job: runs", "3 jobs: each runs"."""
    return f"{_jobs(n)}: {'runs' if n == 1 else 'each runs'}"


def with_log_runtimes(inputs: Sequence[EventBase], recorded: Sequence[EventBase] | None = None
                      ) -> tuple[list[EventBase], RuntimeTreatment]:
    """The world inputs of a replay, each job that declares no runtime given the one `recorded` shows (the
    whole recorded log; None: the inputs are all there is), plus the stops at the log's end; and what was done."""
    log = inputs if recorded is None else recorded
    end = max((e.ts for e in log), default=0.0)
    seen = observed_runs(log, end)
    treated = RuntimeTreatment()
    out: list[EventBase] = []
    stop_at_end: dict[str, str] = {}  # job -> its team, to stop at the log's end
    deployed: dict[str, bool] = {}  # service -> still deployed, as of the last command about it
    counted: set[str] = set()  # a job submitted twice (a retried request) is one job
    for e in inputs:
        if isinstance(e, DeployService | DeleteService):
            deployed[e.service.name if isinstance(e, DeployService) else e.name] = isinstance(e, DeployService)
        if not isinstance(e, SubmitJob) or e.spec.duration_s is not None:
            out.append(e)
            continue
        first = e.job_id not in counted
        counted.add(e.job_id)
        if first:
            treated.undeclared += declared_runtime(e.spec) is None
            treated.limit_only += declared_runtime(e.spec) is not None
        if seconds_label(e.spec.labels.get(SIM_RUNTIME_S, "")) is not None:
            treated.simulated += first
            out.append(e)
            continue
        observed = seen.get(e.job_id)
        if observed is None:
            stop_at_end[e.job_id] = e.spec.team
            treated.never_started += first
        elif observed.at_limit and e.spec.max_runtime_s is not None:
            treated.at_limit += first
        else:
            if first:
                treated.observed += 1
                treated.running_at_end += observed.running_at_end
            labels = {**e.spec.labels, SIM_RUNTIME_S: repr(observed.work_s)}
            e = msgspec.structs.replace(e, spec=msgspec.structs.replace(e.spec, labels=labels))
        out.append(e)
    # After every recorded input (the heap orders by time, then by order fed): a cancellation in the log wins.
    out += [CancelJob(id=derived_id(SOURCE, END_OF_LOG, job), ts=end, source=SOURCE, correlation_id=job,
                      job_id=job, team=team, reason=END_OF_LOG) for job, team in stop_at_end.items()]
    live = [name for name, up in deployed.items() if up]
    treated.services = len(live)
    out += [DeleteService(id=derived_id(SOURCE, END_OF_LOG, "service", name), ts=end, source=SOURCE,
                          correlation_id=name, name=name, reason=END_OF_LOG) for name in live]
    return out, treated
