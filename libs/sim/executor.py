"""What a simulated executor knows and reports, whatever its clock: placed jobs start at once and finish
after their actual runtime (the `sim/runtime-s` label, else their declared `duration_s`, else never), unless
their `max_runtime_s` stops them first (reported failed, reason RUNTIME_LIMIT); preempted and cancelled ones
are evicted. A job that checkpoints
(`checkpoint_interval_s`) saves its state when told to stop, so its next run resumes with that progress; one
that does not loses its run. The node-telemetry service drives
it with the wall clock; the virtual-time pipeline with its own. Report ids derive from the placement they
belong to, so a report made twice (after a restart) is one message."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from contracts import (
    RUNTIME_LIMIT,
    RUNTIME_LIMIT_EXIT_CODE,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobReady,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    PreemptionDecided,
    PriorityClassesChanged,
    QuotaReserved,
    ReplicaPlacement,
)
from libs.core.cluster.runs_after_reregistration import RunOnNode, runs_to_stop
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.nodes.reports import RunReports

SOURCE = "sim-executor"
# A job label that scripts the simulated runs' exit codes, run after run: "137,0" fails the first run as if
# OOM-killed and lets the second succeed. Without it every run succeeds.
SIM_EXIT_CODES = "sim/exit-codes"
# A job label: how long (seconds) the simulated job takes to write its checkpoint once told to stop.
SIM_CHECKPOINT_S = "sim/checkpoint-s"
# A job label: how long (seconds of the job's work) the simulated job really runs, whatever its user declared
# (`duration_s` is an estimate, `max_runtime_s` a limit). A property of the simulated world, like the two
# above: the executor reads it, no decider or view does (tests/unit/sim/test_sim_runtime.py checks). Without it
# the job runs its `duration_s`, and without that until it is stopped.
SIM_RUNTIME_S = "sim/runtime-s"
# Why a run stops when its node registers again without one of the run's GPUs.
GPU_REMOVED = "gpu_removed"
# Why a run stops when its node registers again with a spec it no longer fits (model, MIG mode, capacity).
NODE_CHANGED = "node_changed"
REPORTS = (JobStarted, JobReady, JobFinished, JobFailed, JobEvicted, JobCheckpointed)


@dataclass(slots=True)
class Run:
    job_id: str
    run_id: str  # the JobPlaced event id: one run per placement
    duration: float | None  # the job's actual runtime (seconds of work); None: until stopped
    started_at: float | None = None
    done_before: float = 0.0  # seconds of work saved by earlier runs (resumed from a checkpoint)
    checkpoint_every: float | None = None
    gpus: frozenset[tuple[str, int]] = frozenset()  # (node, GPU index) it runs on
    gpu_milli: int = 1000  # its share of each of those GPUs
    gpu_memory_mib: int = 0  # GPU memory it asked for on each (0: in proportion to its share)
    checkpoint_write_s: float = 0.0
    signalled_at: float | None = None  # told to stop, writing its checkpoint
    stop_armed: bool = False  # its delayed stop handed to the driver
    placed_at: float = 0.0
    placements: tuple[ReplicaPlacement, ...] = ()
    gpu_models: tuple[str, ...] = ()  # models its job allows; empty: any
    mig_profile: str = ""
    # The job's max_runtime_s: this run is stopped after that long. Per run, as Slurm's time limit: a run
    # resumed from a checkpoint gets the whole limit again, the progress it resumes with does not count.
    limit: float | None = None

    def ends_at(self, time_scale: float = 1.0) -> float | None:
        """When the run ends by itself or at its limit; None: it runs until cancelled or evicted."""
        if self.started_at is None:
            return None
        natural = None if self.duration is None else max(0.0, self.duration - self.done_before)
        runs = self.limit if self.at_limit() else natural
        return None if runs is None else self.started_at + runs / time_scale

    def at_limit(self) -> bool:
        """Does its runtime limit stop this run before its work is done?"""
        return self.limit is not None and (self.duration is None or self.duration - self.done_before > self.limit)

    def progress(self, now: float, time_scale: float = 1.0) -> float:
        """Seconds of the job's work done by `now`, this run included."""
        ran = 0.0 if self.started_at is None else max(0.0, now - self.started_at) * time_scale
        return self.done_before + ran


def seconds_label(text: str) -> float | None:
    """A label's number of seconds (finite, >= 0); None when it holds none."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class ExecutorBook:
    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self.durations: dict[str, float | None] = {}  # job -> its actual runtime (see SIM_RUNTIME_S)
        self.limits: dict[str, float | None] = {}  # job -> its max_runtime_s
        self.checkpoint_every: dict[str, float | None] = {}
        self.saved: dict[str, float] = {}  # job -> progress of its last checkpoint
        self.runs: dict[str, Run] = {}
        self.cancelled: dict[str, None] = {}
        self.exit_plan: dict[str, list[int]] = {}
        self.write_s: dict[str, float] = {}
        self.priority: dict[str, str] = {}
        self.grace: dict[str, float] = {c.name: c.checkpoint_grace_s for c in DEFAULT_PRIORITY_CLASSES}
        # Stops that complete later (a checkpoint being written): (when, run) for the driver to schedule.
        self.later: list[tuple[float, Run]] = []
        self.ended_runs: dict[str, int] = {}  # job -> runs that finished or failed
        self.replicas: dict[str, None] = {}  # inference service replicas: ready as soon as they run
        self.needs: dict[str, tuple[tuple[str, ...], str]] = {}  # job -> (GPU models allowed, MIG profile)
        self.flavors: dict[str, str] = {}  # job -> the flavor of its last QuotaReserved ("": any model)

    def reports(self, run: Run) -> RunReports:
        """The shared report model (libs/nodes/reports.py), with the ids this executor's logs were recorded with."""
        return RunReports(run.job_id, run.run_id, SOURCE, executor=SOURCE, id_prefix=SOURCE)

    def about_other_run(self, event: EventBase) -> bool:
        """A report naming a run that is not the job's running one: over already (ended, or replaced by a
        later placement), so it changes nothing here. A report naming no run is about the running one."""
        if not isinstance(event, REPORTS) or not event.run:
            return False
        run = self.runs.get(event.job_id)
        return run is None or run.run_id != event.run

    def fold(self, event: EventBase) -> None:
        """What the log says happened (its own reports included)."""
        if self.about_other_run(event):
            return
        match event:
            case JobSubmitted():
                actual = seconds_label(event.spec.labels.get(SIM_RUNTIME_S, ""))
                self.durations[event.job_id] = event.spec.duration_s if actual is None else actual
                self.limits[event.job_id] = event.spec.max_runtime_s
                self.checkpoint_every[event.job_id] = event.spec.checkpoint_interval_s
                self.priority[event.job_id] = event.spec.priority
                self.needs[event.job_id] = (event.spec.gpu_models, event.spec.mig_profile)
                write = event.spec.labels.get(SIM_CHECKPOINT_S, "")
                self.write_s[event.job_id] = float(write) if write.replace(".", "", 1).isdigit() else 0.0
                plan = event.spec.labels.get(SIM_EXIT_CODES, "")
                self.exit_plan[event.job_id] = [int(c) for c in plan.split(",") if c.strip().lstrip("-").isdigit()]
                if event.spec.service:
                    self.replicas[event.job_id] = None
            case JobPlaced():
                self.runs[event.job_id] = Run(event.job_id, event.id, self.durations.get(event.job_id),
                                              done_before=self.saved.get(event.job_id, 0.0),
                                              checkpoint_every=self.checkpoint_every.get(event.job_id),
                                              gpus=frozenset((p.node, i) for p in event.placements
                                                             for i in p.gpu_indices),
                                              gpu_milli=event.placements[0].gpu_milli if event.placements
                                              else 1000,
                                              gpu_memory_mib=event.placements[0].gpu_memory_mib
                                              if event.placements else 0,
                                              checkpoint_write_s=self.write_s.get(event.job_id, 0.0),
                                              placed_at=event.ts, placements=tuple(event.placements),
                                              limit=self.limits.get(event.job_id))
                models, profile = self.needs.get(event.job_id, ((), ""))
                self.runs[event.job_id].gpu_models, self.runs[event.job_id].mig_profile = models, profile
            case QuotaReserved():
                self.flavors[event.job_id] = event.flavor
            case PriorityClassesChanged():
                self.grace = {c.name: c.checkpoint_grace_s for c in event.classes}
            case PreemptionDecided():
                for v in event.victims:  # a victim that writes a checkpoint is signalled now, stopped later
                    run = self.runs.get(v.job_id)
                    if (run is not None and run.signalled_at is None and run.checkpoint_every is not None
                            and run.checkpoint_write_s > 0):
                        run.signalled_at = event.ts
            case JobCheckpointed():
                self.saved[event.job_id] = event.progress_s
            case JobStarted():
                run = self.runs.get(event.job_id)
                if run is not None and run.started_at is None:
                    run.started_at = event.ts
            case JobCancelled():
                self.cancelled[event.job_id] = None
            case JobFinished() | JobFailed() | JobEvicted():
                self.runs.pop(event.job_id, None)
                if isinstance(event, JobEvicted):
                    self.saved[event.job_id] = event.progress_s
                else:
                    self.ended_runs[event.job_id] = self.ended_runs.get(event.job_id, 0) + 1
                if not isinstance(event, JobEvicted) or event.job_id in self.cancelled:
                    self.durations.pop(event.job_id, None)
                    self.limits.pop(event.job_id, None)
                    self.checkpoint_every.pop(event.job_id, None)
                    self.saved.pop(event.job_id, None)
                    self.cancelled.pop(event.job_id, None)
                    self.replicas.pop(event.job_id, None)
                    self.needs.pop(event.job_id, None)

    def react(self, event: EventBase, now: float) -> list[EventBase]:
        """Fold an event and report what the executor does about it at `now`."""
        self.fold(event)
        return self.act(event, now)

    def act(self, event: EventBase, now: float, runs_then: Mapping[str, str] | None = None) -> list[EventBase]:
        """What the executor does about an event already folded, with the runs as they are now. `runs_then`
        (job -> run id when the event was read, for an event acted on later): only those runs, if still
        running, are stopped; a job placed again since then keeps its new run."""
        out: list[EventBase] = []
        runs = self.runs if runs_then is None else {
            job: run for job, run in self.runs.items() if runs_then.get(job) == run.run_id}
        match event:
            case JobPlaced():
                run = self.runs[event.job_id]
                if event.job_id in self.cancelled:
                    out += self.stop(run, "cancelled", now)
                else:
                    out += self.start(run, now)
            case PreemptionDecided():
                for v in event.victims:
                    victim = runs.get(v.job_id)
                    if victim is None:
                        continue
                    if victim.signalled_at is None:
                        out += self.stop(victim, "preempted", now)
                    else:
                        self.arm_stop(victim)  # it writes its checkpoint, or is killed when its grace ends
            case JobCancelled() if event.job_id in runs:
                out += self.stop(runs[event.job_id], "cancelled", now)
            case NodeLost():
                # Every job with a replica there stops as a whole (a gang cannot run with a piece missing).
                for run in [r for r in runs.values() if any(n == event.node for n, _ in r.gpus)]:
                    out += self.stop(run, "node_lost", now)
            case GpuHealthChanged() if not event.healthy:
                for run in [r for r in runs.values() if (event.node, event.index) in r.gpus]:
                    out += self.stop(run, "gpu_unhealthy", now)
            case NodeRegistered():
                # The node registered again without some GPU (removed, fallen off the bus): a run holding it
                # cannot go on there and stops as a whole, an infrastructure stop that puts the job back.
                name, listed = event.node.name, {g.index for g in event.node.gpus}
                for run in [r for r in runs.values() if any(n == name and i not in listed for n, i in r.gpus)]:
                    out += self.stop(run, GPU_REMOVED, now)
                # Registered with a spec the rest no longer fit (another model, MIG switched, less capacity):
                # the runs that must go for the others to fit stop the same way.
                here = [RunOnNode(r.job_id, r.placed_at, r.placements, r.gpu_models, r.mig_profile,
                                  self.flavors.get(r.job_id, ""))
                        for r in runs.values() if r.job_id in self.runs and any(n == name for n, _ in r.gpus)]
                for job_id in runs_to_stop(event.node, here):
                    out += self.stop(runs[job_id], NODE_CHANGED, now)
            case NodeCordoned() if event.drain:
                # Drained: told to stop like a preemption victim, so a job that checkpoints keeps its work.
                for run in [r for r in runs.values() if any(n == event.node for n, _ in r.gpus)]:
                    out += self.stop(run, "drained", now)
        return out

    def start(self, run: Run, now: float) -> list[EventBase]:
        """The run's start; a service replica is ready with it (the simulated model loads at once)."""
        run.started_at = now
        started = [self.reports(run).started(now)]
        if run.job_id in self.replicas:
            started.append(self.reports(run).ready(now))
        return started

    def stop(self, run: Run, reason: str, now: float, at: float | None = None) -> list[EventBase]:
        """Stop a run. Told to stop (preempted, drained), a job that checkpoints saves its state first; its next run
        resumes from there. Lost with its node or GPU, it keeps only its last periodic checkpoint. Cancelled,
        it simply ends."""
        self.runs.pop(run.job_id, None)
        if reason == "cancelled" or run.checkpoint_every is None:
            return [self.reports(run).evicted(now, reason, (run.done_before, ""))]
        if reason not in ("preempted", "drained"):  # told to stop: it saves its state first
            ran = run.progress(now, self.time_scale) - run.done_before
            progress = round(run.done_before + ran // run.checkpoint_every * run.checkpoint_every, 3)
            self.saved[run.job_id] = progress
            return [self.reports(run).evicted(now, reason, (progress, ""))]
        progress = round(run.progress(now, self.time_scale), 3)
        self.saved[run.job_id] = progress  # its own report is not folded back: apply it here
        ref = f"{run.job_id}/ckpt-{progress:.3f}"
        when = now if at is None else at  # the state saved is as of `now`; the reports come `at`
        reports = self.reports(run)
        saved = (progress, ref)
        return [reports.checkpointed(when, saved, what="checkpoint"), reports.evicted(when, reason, saved)]

    def arm_stop(self, run: Run) -> None:
        """Hand a signalled run's stop to the driver (once): due when its checkpoint is written, or when its
        class's grace runs out, whichever comes first."""
        if run.signalled_at is None or run.stop_armed:
            return
        run.stop_armed = True
        grace = self.grace.get(self.priority.get(run.job_id, ""), 30.0)
        self.later.append((run.signalled_at + min(run.checkpoint_write_s, grace), run))

    def expire(self, run: Run, now: float) -> list[EventBase]:
        """A signalled run's stop comes due: with its checkpoint written (saving its work as of the signal),
        or killed at the end of its grace (keeping its last periodic checkpoint). Nothing if it ended first."""
        if self.runs.get(run.job_id) is not run or run.signalled_at is None:
            return []
        grace = self.grace.get(self.priority.get(run.job_id, ""), 30.0)
        if run.checkpoint_write_s <= grace:
            return self.stop(run, "preempted", run.signalled_at, at=now)
        return self.stop(run, "grace_expired", now)

    def finish(self, run: Run, now: float) -> EventBase | None:
        """The run's time is up: its JobFinished (or, as scripted, JobFailed; or JobFailed for its runtime
        limit, if that came first), unless it was stopped (or replaced) meanwhile."""
        if self.runs.get(run.job_id) is not run:
            return None
        del self.runs[run.job_id]
        ended = self.ended_runs.get(run.job_id, 0)
        self.ended_runs[run.job_id] = ended + 1  # its own report is not folded back: count it here
        if run.at_limit():  # stopped at its max_runtime_s, as Slurm's TIMEOUT: final, never retried
            self.saved.pop(run.job_id, None)
            return self.reports(run).failed(now, RUNTIME_LIMIT_EXIT_CODE, RUNTIME_LIMIT)
        plan = self.exit_plan.get(run.job_id, [])
        code = plan[ended] if ended < len(plan) else 0
        if code != 0:
            self.saved.pop(run.job_id, None)  # a failed run keeps nothing
            return self.reports(run).failed(now, code, "exit_code")
        return self.reports(run).finished(now)
