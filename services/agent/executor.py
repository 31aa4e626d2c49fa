"""The process executor of a node agent: runs each job placed on this node as real processes.

One process per replica placed here, in a session of its own (so a stop signal reaches its children),
with `CUDA_VISIBLE_DEVICES` set to its GPUs and the share and memory limit of a shared GPU in the
environment. Stopping sends SIGTERM, waits the job's priority-class grace (the job checkpoints meanwhile),
then SIGKILL. A job declaring `max_runtime_s` is stopped the same way once its processes have run that long
(per run, as Slurm's time limit) and reported failed with reason RUNTIME_LIMIT. The agent hosting replica 0
(the leader) reports the start and the end; any agent reports a failure or an eviction, under ids derived
from the run so that the server keeps one.

What runs here is a fold of the log (JobPlaced on this node, not yet ended); after a restart, runs the log
still holds but that have no process any more are reported evicted, so they run again elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeSpec,
    PreemptionDecided,
    PriorityClassesChanged,
    QuotaReserved,
    ReplicaPlacement,
)
from libs.bus.jetstream import Bus
from libs.core.cluster.runs_after_reregistration import RunOnNode, runs_to_stop
from libs.core.kernel.policy import DEFAULT_PRIORITY_CLASSES
from libs.core.kernel.runs import CurrentRuns
from libs.jobkit import CHECKPOINT_FILE, READY_FILE, RESUME_CHECKPOINT, RESUME_PROGRESS, read_checkpoint
from libs.nodes.reports import NOTHING_SAVED, RunReports

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
ENDS = (JobFinished, JobFailed, JobEvicted)
# Environment a job never inherits from the agent: the platform's own settings and anything secret.
_HIDDEN_ENV = ("GPUSCHED_", "NATS_", "REDIS_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


@dataclass(slots=True)
class Replica:
    index: int
    gpu_indices: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: int
    proc: asyncio.subprocess.Process | None = None
    exit_code: int | None = None


@dataclass(slots=True)
class LocalRun:
    job_id: str
    run_id: str  # the JobPlaced event id
    leader: bool
    replicas: list[Replica]
    spawned: bool = False
    stop_reason: str = ""
    checkpoint_mtime: float = 0.0
    reported_progress: float = -1.0
    ready_file: Path | None = None  # a replica that signals its readiness: the file it creates
    ready_reported: bool = False
    kill_timer: asyncio.TimerHandle | None = None
    limit_timer: asyncio.TimerHandle | None = None  # its max_runtime_s running out
    placed_at: float = 0.0  # its JobPlaced's time
    pieces: tuple[ReplicaPlacement, ...] = ()  # its placements on this node

    def alive(self) -> list[Replica]:
        return [r for r in self.replicas if r.proc is not None and r.exit_code is None]


def _die_with_agent() -> None:
    """In the child before exec: SIGKILL it when the agent dies (Linux). An agent that restarts cannot take
    its old processes back and reports their jobs evicted, so those must not keep running beside the new runs."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_status(returncode: int) -> int:
    """A process killed by signal N exits with 128 + N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def job_environment(spec: JobSpec, replica: Replica, node: NodeSpec | None, checkpoint_file: Path,
                    resume: tuple[float, str], job_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_HIDDEN_ENV) and not any(w in k.upper() for w in _SECRET_WORDS)}
    uuids = {g.index: g.uuid for g in node.gpus} if node is not None else {}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids.get(i) or str(i) for i in replica.gpu_indices)
    env.update({"GPUSCHED_JOB_ID": job_id, "GPUSCHED_REPLICA": str(replica.index),
                "GPUSCHED_REPLICAS": str(spec.replicas), CHECKPOINT_FILE: str(checkpoint_file),
                RESUME_PROGRESS: f"{resume[0]:g}", RESUME_CHECKPOINT: resume[1]})
    if replica.gpu_milli < 1000:
        # A share of one GPU: the fraction for the job's own limiter, and CUDA MPS's limits where MPS runs.
        env["GPUSCHED_GPU_FRACTION"] = f"{replica.gpu_milli / 1000:.3f}"
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, replica.gpu_milli // 10))
        if replica.gpu_memory_mib:
            env["GPUSCHED_GPU_MEMORY_MIB"] = str(replica.gpu_memory_mib)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={replica.gpu_memory_mib}M"
    return env


@dataclass
class ProcessExecutor:
    """The agent's reactor handler: the fold of what runs here, and the processes that run it."""

    node: str
    workdir: Path
    bus: Bus | None = None
    name: str = "agent"
    # Events before this stream sequence are history even on a first start (a new agent must not start
    # jobs that ran long ago): they are folded, never acted on.
    live_from: int = 0
    specs: dict[str, JobSpec] = field(default_factory=dict)
    flavors: dict[str, str] = field(default_factory=dict)  # job -> the flavor of its last QuotaReserved ("": any)
    grace: dict[str, float] = field(default_factory=lambda: {c.name: c.checkpoint_grace_s
                                                             for c in DEFAULT_PRIORITY_CLASSES})
    placed: dict[str, LocalRun] = field(default_factory=dict)  # job -> its run here, as the log says
    saved: dict[str, tuple[float, str]] = field(default_factory=dict)  # job -> its last checkpoint
    cancelled: set[str] = field(default_factory=set)
    # Each job's current run, wherever it runs: a report about a run that is over (a late one, from another
    # reporter) must not end the run that replaced it, nor touch its checkpoint or its spec.
    runs: CurrentRuns = field(default_factory=CurrentRuns)
    spec: NodeSpec | None = None
    registrations: int = 0  # NodeRegistered events of this node so far: the next one's version
    lost: bool = False  # the log says this node is lost (it re-registers when it is back)
    seen: int = 0  # stream sequence of the last event folded
    reconciled: bool = False
    history_done: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        for sub in ("logs", "checkpoints"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)

    # --- the fold ----------------------------------------------------------------------------------

    def input_types(self) -> Iterable[type[EventBase]]:
        return (JobSubmitted, QuotaReserved, JobPlaced, JobCancelled, PreemptionDecided, PriorityClassesChanged,
                JobStarted, JobCheckpointed, *ENDS, NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned)

    def replay(self, seq: int, event: EventBase) -> None:
        self.seen = seq
        self._fold(event)

    def _fold(self, event: EventBase) -> LocalRun | None:
        """Fold one event; returns the local run a JobPlaced created, or the one an end took away."""
        if self.runs.is_stale(event):
            return None
        self.runs.fold(event)
        match event:
            case JobSubmitted():
                self.specs[event.job_id] = event.spec
            case QuotaReserved():
                self.flavors[event.job_id] = event.flavor
            case PriorityClassesChanged():
                self.grace = {c.name: c.checkpoint_grace_s for c in event.classes}
            case NodeRegistered() if event.node.name == self.node:
                self.spec, self.lost = event.node, False
                self.registrations += 1
            case NodeLost() if event.node == self.node:
                self.lost = True
            case JobPlaced():
                mine = [p for p in event.placements if p.node == self.node]
                if mine:
                    leader = min(event.placements, key=lambda p: p.replica).node == self.node
                    run = LocalRun(event.job_id, event.id, leader,
                                   [Replica(p.replica, p.gpu_indices, p.gpu_milli, p.gpu_memory_mib) for p in mine],
                                   placed_at=event.ts, pieces=tuple(mine))
                    self.placed[event.job_id] = run
                    return run
            case JobCheckpointed():
                self.saved[event.job_id] = (event.progress_s, event.checkpoint)
            case JobFinished() | JobFailed() | JobEvicted():
                if isinstance(event, JobEvicted):
                    self.saved[event.job_id] = (event.progress_s, event.checkpoint)
                else:
                    self.saved.pop(event.job_id, None)
                    self.specs.pop(event.job_id, None)
                    self.flavors.pop(event.job_id, None)
                return self.placed.pop(event.job_id, None)
            case JobCancelled():
                self.cancelled.add(event.job_id)
        return None

    # --- reacting ----------------------------------------------------------------------------------

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        self.seen = seq
        run = self._fold(event)
        if seq < self.live_from:
            return []
        self.reconcile()
        match event:
            case JobPlaced() if run is not None:
                if event.job_id in self.cancelled:
                    self._report_end(run, "cancelled")
                else:
                    self._spawn(run)
            case JobFinished() | JobFailed() | JobEvicted() if run is not None and run.alive():
                self._kill(run, signal.SIGKILL)  # ended by another reporter (the leader, or node-telemetry)
            case PreemptionDecided():
                for v in event.victims:
                    self._stop(v.job_id, "preempted")
            case JobCancelled():
                self._stop(event.job_id, "cancelled")
            case GpuHealthChanged() if event.node == self.node and not event.healthy:
                for job_id, r in list(self.placed.items()):
                    if any(event.index in rep.gpu_indices for rep in r.replicas):
                        self._stop(job_id, "gpu_unhealthy")
            case NodeLost() if event.node == self.node:
                for job_id in list(self.placed):
                    self._stop(job_id, "node_lost", grace=0.0)  # fenced: its jobs already run elsewhere
            case NodeRegistered() if event.node.name == self.node:
                # Registered again without a GPU a job runs on (it fell off the bus, was removed): that job
                # cannot go on here and stops, an infrastructure stop that puts it back in line.
                listed = {g.index for g in event.node.gpus}
                for job_id, r in list(self.placed.items()):
                    if any(i not in listed for rep in r.replicas for i in rep.gpu_indices):
                        self._stop(job_id, "gpu_removed")
                # Registered with a spec the rest no longer fit (another model, MIG switched, less capacity):
                # the runs that must go for the others to fit stop the same way.
                for job_id in runs_to_stop(event.node, self._runs_here()):
                    self._stop(job_id, "node_changed")
            case NodeCordoned() if event.node == self.node and event.drain:
                for job_id in list(self.placed):
                    self._stop(job_id, "drained")
        return []

    def _runs_here(self) -> list[RunOnNode]:
        """The runs here not told to stop yet, as the fit of a re-registered node judges them."""
        out = []
        for job_id, r in self.placed.items():
            if r.stop_reason:
                continue
            spec = self.specs.get(job_id)
            out.append(RunOnNode(job_id, r.placed_at, r.pieces, spec.gpu_models if spec else (),
                                 spec.mig_profile if spec else "", self.flavors.get(job_id, "")))
        return out

    async def after_batch(self) -> None:
        self.reconcile()

    async def after_catch_up(self) -> None:
        self.reconcile()

    def reconcile(self) -> None:
        """Once the log's history is folded: runs it says are here but that have no process (the agent
        restarted) are reported evicted, so that they run again."""
        if self.reconciled or self.seen + 1 < self.live_from:
            return
        self.reconciled = True
        self.history_done.set()
        for run in list(self.placed.values()):
            if not run.spawned:
                self._report_end(run, "executor_restarted")

    # --- processes ---------------------------------------------------------------------------------

    def _spawn(self, run: LocalRun) -> None:
        run.spawned = True
        self._task(self._start(run))

    async def _start(self, run: LocalRun) -> None:
        spec = self.specs.get(run.job_id)
        if spec is None or not spec.command:
            self._forget(run)
            await self._publish([self.reports(run).failed(time.time(), 127, "no_command")])
            return
        resume = self.saved.get(run.job_id, (0.0, ""))
        ckpt = self.workdir / "checkpoints" / f"{run.job_id}.json"
        with contextlib.suppress(FileNotFoundError):
            ckpt.unlink()  # a new run reports its own checkpoints
        if spec.service and spec.ready_signal:
            run.ready_file = self.workdir / "ready" / run.job_id
            run.ready_file.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                run.ready_file.unlink()  # and signals its own readiness
        try:
            for rep in run.replicas:
                env = job_environment(spec, rep, self.spec, ckpt, resume, run.job_id)
                if run.ready_file is not None:
                    env[READY_FILE] = str(run.ready_file)
                with open(self.log_path(run.job_id), "ab") as out:
                    out.write(f"== run {run.run_id} replica {rep.index} on {self.node} GPUs "
                              f"{env['CUDA_VISIBLE_DEVICES']} ==\n".encode())
                    out.flush()
                    rep.proc = await asyncio.create_subprocess_exec(
                        *spec.command, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT,
                        stdin=asyncio.subprocess.DEVNULL, start_new_session=True, cwd=str(self.workdir),
                        preexec_fn=_die_with_agent if sys.platform == "linux" else None)
        except OSError as err:
            log.warning("%s: cannot start %s: %s", self.node, run.job_id, err)
            self._kill(run, signal.SIGKILL)
            self._forget(run)
            await self._publish([self.reports(run).failed(time.time(), 127, f"spawn_failed: {err.strerror or err}")])
            return
        if spec.max_runtime_s is not None:  # wall time of this run, from its processes' start
            run.limit_timer = asyncio.get_running_loop().call_later(spec.max_runtime_s, self._time_out, run)
        if run.leader:
            started: list[EventBase] = [self.reports(run).started(time.time())]
            if spec.service and run.ready_file is None:  # a replica without a readiness signal serves once it runs
                run.ready_reported = True
                started.append(self._ready(run))
            await self._publish(started)
        if run.stop_reason:  # told to stop while it was starting
            self._signal(run, self.grace_of(run), run.stop_reason)
        for rep in run.replicas:
            self._task(self._wait(run, rep))

    async def _wait(self, run: LocalRun, rep: Replica) -> None:
        assert rep.proc is not None
        rep.exit_code = exit_status(await rep.proc.wait())
        if run.alive():
            if rep.exit_code != 0 and not run.stop_reason:
                self._kill(run, signal.SIGKILL)  # a gang cannot go on with a replica gone
            return
        for timer in (run.kill_timer, run.limit_timer):
            if timer is not None:
                timer.cancel()
        if self.placed.get(run.job_id) is not run:
            return  # the log ended it already (another reporter): nothing to say
        if run.stop_reason == RUNTIME_LIMIT:  # stopped at its limit: a final failure, not an eviction
            self._forget(run)
            await self._publish([self.reports(run).failed(time.time(), RUNTIME_LIMIT_EXIT_CODE, RUNTIME_LIMIT)])
            return
        if run.stop_reason:
            self._report_end(run, run.stop_reason)
            return
        self._forget(run)
        failed = next((r for r in run.replicas if r.exit_code), None)
        if failed is not None:
            assert failed.exit_code is not None
            reason = "killed_by_signal" if failed.exit_code > 128 else "exit_code"
            await self._publish([self.reports(run).failed(time.time(), failed.exit_code, reason)])
        elif run.leader:
            await self._publish([self.reports(run).finished(time.time())])

    def _stop(self, job_id: str, reason: str, grace: float | None = None) -> None:
        run = self.placed.get(job_id)
        if run is None or run.stop_reason:
            return
        run.stop_reason = reason
        if not run.spawned:
            self._report_end(run, reason)
        elif run.alive():
            self._signal(run, self.grace_of(run) if grace is None else grace, reason)

    def _time_out(self, run: LocalRun) -> None:
        """The run's max_runtime_s is up: stopped as a preemption victim is (SIGTERM, SIGKILL after its
        class's grace), unless it ended or was told to stop meanwhile; `_wait` reports it."""
        run.limit_timer = None
        if self.placed.get(run.job_id) is not run or run.stop_reason or not run.alive():
            return
        run.stop_reason = RUNTIME_LIMIT
        self._signal(run, self.grace_of(run), RUNTIME_LIMIT)

    def _signal(self, run: LocalRun, grace: float, reason: str) -> None:
        log.info("%s: stopping %s (%s), SIGKILL in %gs", self.node, run.job_id, reason, grace)
        if grace <= 0:
            self._kill(run, signal.SIGKILL)
            return
        self._kill(run, signal.SIGTERM)
        run.kill_timer = asyncio.get_running_loop().call_later(grace, self._kill, run, signal.SIGKILL)

    def _kill(self, run: LocalRun, sig: signal.Signals) -> None:
        for rep in run.alive():
            assert rep.proc is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rep.proc.pid, sig)

    def grace_of(self, run: LocalRun) -> float:
        spec = self.specs.get(run.job_id)
        return self.grace.get(spec.priority if spec else "", 30.0)

    def _report_end(self, run: LocalRun, reason: str) -> None:
        """The run is over here (stopped, or never started): report it evicted with its last checkpoint."""
        self._forget(run)
        found = read_checkpoint(self.workdir / "checkpoints" / f"{run.job_id}.json") if run.spawned else None
        saved = self.saved.get(run.job_id, NOTHING_SAVED)
        self._task(self._publish(self.reports(run).stopped(time.time(), reason, saved, found)))

    def reports(self, run: LocalRun) -> RunReports:
        return RunReports(run.job_id, run.run_id, self.source)

    def _forget(self, run: LocalRun) -> None:
        if self.placed.get(run.job_id) is run:
            del self.placed[run.job_id]

    # --- checkpoints the jobs write ------------------------------------------------------------------

    def _ready(self, run: LocalRun) -> EventBase:
        return self.reports(run).ready(time.time())

    def checkpoints(self) -> list[EventBase]:
        """Checkpoints running jobs wrote, and readiness service replicas signalled, since the last look (the
        agent polls this)."""
        out: list[EventBase] = []
        for run in self.placed.values():
            if not run.spawned or run.stop_reason:
                continue
            if run.ready_file is not None and not run.ready_reported and run.leader and run.ready_file.exists():
                run.ready_reported = True
                out.append(self._ready(run))
            path = self.workdir / "checkpoints" / f"{run.job_id}.json"
            try:
                mtime = path.stat().st_mtime
            except FileNotFoundError:
                continue
            if mtime == run.checkpoint_mtime:
                continue
            run.checkpoint_mtime = mtime
            found = read_checkpoint(path)
            if found is not None and found[0] > run.reported_progress:
                run.reported_progress = found[0]
                out.append(self.reports(run).checkpointed(time.time(), found))
        return out

    # --- plumbing ------------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        return f"agent/{self.node}"

    def log_path(self, job_id: str) -> Path:
        return self.workdir / "logs" / f"{job_id}.log"

    def running(self) -> int:
        return sum(1 for r in self.placed.values() if r.alive())

    async def _publish(self, reports: list[EventBase]) -> None:
        if self.bus is not None and reports:
            await self.bus.publish_until_stored(reports)

    def _task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: executor task failed", self.node, exc_info=task.exception())

    async def shutdown(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a short wait): the agent is going away."""
        for run in list(self.placed.values()):
            self._kill(run, signal.SIGTERM)
        await asyncio.sleep(0.5)
        for run in list(self.placed.values()):
            self._kill(run, signal.SIGKILL)
        for task in list(self._tasks):
            task.cancel()
