"""`gpusched bench chaos`: the platform under faults loses nothing, duplicates nothing and over-allocates
nothing. Fresh NATS and Redis and the six services as processes; jobs from three teams submitted over a
window through the HTTP API and the bus, with duplicates and cancellations; meanwhile a random service is
SIGKILLed and restarted every few seconds, NATS is stopped and started again once (same store, same port)
and Redis is flushed once. When every job is final, the faults stop and the run is judged from the log and
the API alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import redis.asyncio as aioredis

from contracts import (
    COMMAND_TYPES,
    EventBase,
    JobEvicted,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PreemptionDecided,
    QueuePolicyChanged,
    SubmitJob,
)
from contracts.codec import decode
from libs.audit.invariants import overallocations
from libs.audit.log_reader import read_log
from libs.audit.quota_audit import quota_violations
from libs.audit.replay import replay
from libs.bench import chaos_scenario as scenario
from libs.bench.chaos_scenario import Submission
from libs.bench.guarantee_figures import guarantee_figures
from libs.bench.platform import bench_platform
from libs.bus.consumer import Consumer, stream_seq
from libs.bus.jetstream import Bus, BusConfig
from libs.core.accounting.ledger import Ledger
from libs.core.accounting.state import FINAL_STATES
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.settings import SERVICES
from libs.runtime.supervisor import Supervisor

SOURCE = "chaos-bench"
STREAM = "GPUSCHED"
# The figures that must be zero for the run to pass.
FAIL_KEYS = ("lost", "duplicated", "overallocations", "quota_violations", "replay_mismatches",
             "read_model_mismatches", "stuck")
log = logging.getLogger(__name__)

# A job may rightly wait for ever only when its queue's budget is spent (the scenario sets no budget).
RIGHTLY_PENDING = frozenset({"budget_spent", "over_budget_waits_for_idle_quota"})
RETRY_S = 0.25
# How often one valid submission may be refused (422) before the driver gives up on it: an API that answers
# while its service is still catching up with the log refuses what it does not know yet.
MAX_REFUSALS = 40
MAX_UNKNOWN_CANCELS = 200  # a cancel may precede admission's decision on the job: asked again until known
HTTP_CONCURRENCY = 32
SETTLE_S = 90.0  # after the faults stop: for every service to be ready and the views to catch up
STOP_WAIT_S = 5.0  # for the log follower to end when asked


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    jobs: int = 2000
    seed: int = 1
    kill_every_s: float = 3.0
    window_s: float | None = None  # submissions spread over this; None: jobs / 30 per second, 10 s at least
    # Declared durations (1-4 s) are divided by this in the simulated executor.
    time_scale: float = 4.0
    nats_restarts: int = 1
    redis_flushes: int = 1
    timeout_s: float = 600.0  # for every job to be final, from the first submission
    # Once everything is submitted, a run in which no job became final for this long has stuck jobs.
    stall_s: float = 30.0
    data: Path | None = None  # None: a temporary folder, removed afterwards


@dataclass(slots=True)
class ChaosProgress:
    phase: str = "starting"
    accepted: int = 0
    final: int = 0
    total: int = 0
    kills: int = 0
    nats_restarts: int = 0
    redis_flushes: int = 0


ProgressFn = Callable[[ChaosProgress], None]


def run_chaos(opts: ChaosOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    if opts.jobs < 1 or opts.kill_every_s <= 0 or opts.time_scale <= 0:
        raise ValueError("--jobs must be at least 1, --kill-every and the time scale above 0")
    started = time.monotonic()
    window = scenario.submission_window(opts.jobs, opts.window_s)
    plan = scenario.plan(opts.jobs, opts.seed, window, opts.time_scale)
    shown = ChaosProgress(total=len(plan))
    report = progress or (lambda _: None)
    env_extra = {"GPUSCHED_TICK_SECONDS": "1", "GPUSCHED_TIME_SCALE": f"{opts.time_scale:g}",
                 "GPUSCHED_STREAM": STREAM, "GPUSCHED_SUBJECT_PREFIX": "gs"}
    # Its own servers: the NATS server is restarted and Redis flushed, so they must be this run's alone.
    with bench_platform(opts.data, "chaos", scenario.POLICY_TOML, scenario.CLUSTER_CSV, env_extra) as run:
        nats = next(s for s in run.servers if s.name == "nats")
        drive = Drive(run.sup, nats, run.env["REDIS_URL"], f"http://127.0.0.1:{run.sup.ports['admission']}", plan,
                      opts, window, shown, report)
        with logged_to(run.data / "logs" / "chaos.log"):
            seen = asyncio.run(drive.run(BusConfig(url=run.env["NATS_URL"], stream=STREAM)))
    # Judged once the platform is stopped: the replay gets the CPUs, and forks no process with live threads.
    shown.phase = "checking the log"
    report(shown)
    result = judge(seen)
    return {**result, **drive.figures(), "wall_s": round(time.monotonic() - started, 1)}


@contextlib.contextmanager
def logged_to(path: Path) -> Iterator[None]:
    """This process's warnings (the NATS client's, on every fault) go to the run's log, not over the progress
    display."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


# --- following the log ------------------------------------------------------------------------------------


class LogFollower:
    """Folds the live log into a Ledger as it grows, for the progress display and the end condition.

    Its reader is an ephemeral consumer that the server keeps in memory only, so it vanishes when NATS
    restarts: the reader is made again from the next sequence whenever it fails, stays quiet while the log
    grows, or skips a delivery."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.ledger = Ledger()
        self.seq = 0
        self.reopened = 0
        self._reader: Consumer | None = None
        self._delivered = 0
        self._quiet = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # NATS restarting, the consumer gone: read again from where we are
                await self._reopen()
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """End the follower and close its reader. A fetch caught inside the NATS client while the server
        went away has been seen to outlive its task's cancellation (its wait never returned, and the run
        with it): the wait is bounded, and then the connection is closed, which ends every fetch in flight."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            _, pending = await asyncio.wait({task}, timeout=STOP_WAIT_S)
            if pending:
                log.warning("the log follower did not stop within %.0fs; closing its connection", STOP_WAIT_S)
                await self.bus.close()
                await asyncio.wait(pending, timeout=STOP_WAIT_S)
        await self._reopen()

    async def _reopen(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader.close()
            self._reader = None
            self.reopened += 1

    async def _step(self) -> None:
        if self._reader is None:
            self._reader = await self.bus.reader(self.bus.log_subjects(), start_seq=self.seq + 1)
            self._delivered = self._quiet = 0
        msgs = await self._reader.fetch(2000, timeout=1.0)
        if not msgs:
            self._quiet += 1
            if self._quiet >= 3 and await self.bus.last_seq() > self.seq:
                await self._reopen()
            return
        self._quiet = 0
        for m in msgs:
            delivered = int(m.metadata.sequence.consumer)
            if delivered != self._delivered + 1:  # a delivery went missing: never fold past it
                await self._reopen()
                return
            self._delivered = delivered
            self._fold(stream_seq(m), m.data)

    def _fold(self, seq: int, data: bytes) -> None:
        if seq <= self.seq:
            return
        self.seq = seq
        try:
            event = decode(data)
        except Exception:  # dead-lettered by the services too
            return
        if type(event) not in COMMAND_TYPES:  # as the accounting projector folds it
            self.ledger.fold(event, seq)

    def settled(self, job_id: str) -> bool:
        return settled(self.ledger, job_id)


def settled(ledger: Ledger, job_id: str) -> bool:
    """Final, or pending for a reason that only time (a new budget period) removes."""
    view = ledger.state.jobs.get(job_id)
    return view is not None and (view.state in FINAL_STATES
                                 or (view.state == "pending" and view.reason in RIGHTLY_PENDING))


# --- the producers ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Submissions:
    """What the producers were told: the jobs accepted, the ids every answer named, what was refused."""

    accepted: dict[str, Submission] = field(default_factory=dict)
    answered: dict[str, list[str]] = field(default_factory=dict)  # planned job id -> ids the API answered
    refused: Counter[str] = field(default_factory=Counter)  # code -> 422 answers to a (valid) submission
    errors: Counter[str] = field(default_factory=Counter)  # code -> other 4xx answers: requests made wrong
    gave_up: list[str] = field(default_factory=list)
    again: int = 0  # duplicate submissions made
    cancels: Counter[str] = field(default_factory=Counter)  # outcome -> count
    retries: int = 0
    by_via: Counter[str] = field(default_factory=Counter)


class Producer:
    """Submits the plan on schedule, through the HTTP API (idempotency keys) and the bus (the producer's job
    ids), retrying through every fault with the same key or id, so that a retry can never make a second job."""

    def __init__(self, bus: Bus, session: aiohttp.ClientSession, api: str, plan: list[Submission],
                 deadline: float) -> None:
        self.bus, self.session, self.api, self.plan, self.deadline = bus, session, api, plan, deadline
        self.out = Submissions()
        self._done: dict[str, asyncio.Event] = {s.job_id: asyncio.Event() for s in plan}
        self._http = asyncio.Semaphore(HTTP_CONCURRENCY)

    async def run(self) -> None:
        actions: list[tuple[float, int, Submission]] = []
        for s in self.plan:
            actions.append((s.at_s, 0, s))
            if s.again_at_s is not None:
                actions.append((s.again_at_s, 1, s))
            if s.cancel_at_s is not None:
                actions.append((s.cancel_at_s, 2, s))
        actions.sort(key=lambda a: (a[0], a[1], a[2].index))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for at, kind, sub in actions:
            delay = t0 + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            step = self._submit(sub) if kind == 0 else self._again(sub) if kind == 1 else self._cancel(sub)
            tasks.append(asyncio.create_task(step))
        await asyncio.gather(*tasks)

    def _expired(self) -> bool:
        return time.monotonic() > self.deadline

    async def _submit(self, sub: Submission) -> None:
        job_id = await (self._post(sub) if sub.via == "http" else self._publish(sub, "submit"))
        if job_id is None:
            self.out.gave_up.append(sub.job_id)
            return
        self.out.accepted[sub.job_id] = sub
        self.out.answered.setdefault(sub.job_id, []).append(job_id)
        self.out.by_via[sub.via] += 1
        self._done[sub.job_id].set()

    async def _again(self, sub: Submission) -> None:
        """The same submission once more after it was accepted: same key (HTTP), or same job id under another
        command id (bus), as a producer that retries without knowing the first attempt succeeded."""
        if not await self._accepted(sub.job_id):
            return
        self.out.again += 1
        job_id = await (self._post(sub) if sub.via == "http" else self._publish(sub, "submit-again"))
        if job_id is not None:
            self.out.answered[sub.job_id].append(job_id)

    async def _accepted(self, job_id: str) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done[job_id].wait(), timeout=max(0.0, self.deadline - time.monotonic()))
        return self._done[job_id].is_set()

    async def _post(self, sub: Submission) -> str | None:
        refusals = 0
        while not self._expired():
            try:
                async with self._http, self.session.post(f"{self.api}/v1/jobs", json=sub.spec) as r:
                    body = await r.json(content_type=None)
                if r.status in (200, 201):
                    return str(body["id"])
                code = str(body.get("code", r.status)) if isinstance(body, dict) else str(r.status)
                if r.status == 422:  # every planned job is valid: the API does not know enough yet
                    self.out.refused[code] += 1
                    refusals += 1
                    if refusals >= MAX_REFUSALS:
                        return None
                elif r.status < 500 and r.status != 429:
                    self.out.errors[code] += 1  # a request we made wrong: asking again cannot help
                    return None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass  # the API is down or restarting: the same key again
            self.out.retries += 1
            await asyncio.sleep(RETRY_S)
        return None

    async def _publish(self, sub: Submission, what: str) -> str | None:
        command = SubmitJob(id=derived_id(SOURCE, what, sub.job_id), ts=time.time(), source=SOURCE,
                            correlation_id=sub.job_id, job_id=sub.job_id, spec=sub.job_spec())
        while not self._expired():
            try:
                await self.bus.publish([command])
                return sub.job_id
            except Exception:  # NATS restarting: the same message id again, de-duplicated if it was stored
                self.out.retries += 1
                await asyncio.sleep(RETRY_S)
        return None

    async def _cancel(self, sub: Submission) -> None:
        if not await self._accepted(sub.job_id):
            return
        unknown = 0
        while not self._expired():
            try:
                async with self._http, self.session.delete(f"{self.api}/v1/jobs/{sub.job_id}") as r:
                    body = await r.json(content_type=None)
                code = str(body.get("code", "")) if isinstance(body, dict) else ""
                if r.status == 202 or (r.status == 409 and code == "job_final"):
                    self.out.cancels["requested" if r.status == 202 else "already_final"] += 1
                    return
                if r.status == 404:  # admission has not decided the submission yet
                    unknown += 1
                    if unknown >= MAX_UNKNOWN_CANCELS:
                        break
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            self.out.retries += 1
            await asyncio.sleep(RETRY_S)
        self.out.cancels["gave_up"] += 1


# --- the faults -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Faults:
    sup: Supervisor
    nats: EmbeddedServer
    redis_url: str
    rng: random.Random
    kills: Counter[str] = field(default_factory=Counter)
    crash_restarts: Counter[str] = field(default_factory=Counter)  # services that died of themselves
    nats_restarts: int = 0
    redis_flushes: int = 0

    def kill_one(self) -> None:
        """SIGKILL a service and start it again at once: it must resume from the log."""
        victim = self.rng.choice(SERVICES)
        self.sup.kill(victim)
        self.kills[victim] += 1
        self.crash_restarts.update(n for n in self.sup.restart_dead() if n != victim)

    def restart_crashed(self) -> None:
        """Crash-only: a service that exited (e.g. it could not reach NATS) is started again."""
        self.crash_restarts.update(self.sup.restart_dead())

    async def restart_nats(self) -> None:
        await asyncio.to_thread(self.nats.restart)  # the producers and services go on meanwhile
        self.nats_restarts += 1

    async def flush_redis(self) -> None:
        client = aioredis.from_url(self.redis_url)
        try:
            await client.flushall()
        finally:
            await client.aclose()
        self.redis_flushes += 1


@dataclass(slots=True)
class FaultPlan:
    next_kill: float
    nats_at: list[float]  # loop times of the NATS restarts still to come
    redis_at: list[float]  # and of the Redis flushes
    restarting: asyncio.Task[None] | None = None  # a NATS restart under way

    @property
    def pending(self) -> bool:
        return bool(self.nats_at or self.redis_at or self.restarting)


def spread(n: int, start: float, end: float) -> list[float]:
    """`n` fractions evenly inside [start, end] (one: the middle)."""
    return [start + (end - start) * (k + 1) / (n + 1) for k in range(n)]


# --- the run ----------------------------------------------------------------------------------------------


class Drive:
    def __init__(self, sup: Supervisor, nats: EmbeddedServer, redis_url: str, api: str, plan: list[Submission],
                 opts: ChaosOptions, window_s: float, shown: ChaosProgress, progress: ProgressFn) -> None:
        self.sup, self.api, self.plan, self.opts, self.window_s = sup, api, plan, opts, window_s
        self.faults = Faults(sup, nats, redis_url, random.Random(f"{opts.seed}-faults"))
        self.shown, self.progress = shown, progress
        self.run_s, self.timed_out = 0.0, False

    async def run(self, config: BusConfig) -> Seen:
        bus = await Bus.connect(config, name="gpusched-chaos")
        follower = LogFollower(bus)
        follower.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
                await wait_for_platform(bus)
                producer = Producer(bus, session, self.api, self.plan, time.monotonic() + self.opts.timeout_s)
                self.run_s, self.timed_out = await self._under_faults(producer, follower)
                self._show("letting the platform settle")
                await self._all_ready()
                return await self._settle(bus, session, producer.out)
        finally:
            await follower.stop()
            await bus.close()

    def figures(self) -> dict[str, Any]:
        f = self.faults
        return {"kills": sum(f.kills.values()), "nats_restarts": f.nats_restarts, "redis_flushes": f.redis_flushes,
                "run_s": round(self.run_s, 1), "timed_out": self.timed_out, "killed": dict(sorted(f.kills.items())),
                "crash_restarts": dict(sorted(f.crash_restarts.items())), "seed": self.opts.seed,
                "kill_every_s": self.opts.kill_every_s, "window_s": round(self.window_s, 1),
                "time_scale": self.opts.time_scale}

    def _show(self, phase: str, follower: LogFollower | None = None, producer: Producer | None = None) -> None:
        s = self.shown
        s.phase = phase
        if producer is not None and follower is not None:
            s.accepted = len(producer.out.accepted)
            s.final = sum(1 for j in producer.out.accepted if follower.settled(j))
        s.kills, s.nats_restarts = sum(self.faults.kills.values()), self.faults.nats_restarts
        s.redis_flushes = self.faults.redis_flushes
        self.progress(s)

    async def _under_faults(self, producer: Producer, follower: LogFollower) -> tuple[float, bool]:
        """Submit the plan while the faults go on, until every accepted job is settled in the log (or nothing
        has settled for `stall_s` once everything is submitted: the jobs left are stuck)."""
        loop = asyncio.get_running_loop()
        submitting = asyncio.create_task(producer.run())
        t0 = progressed_at = loop.time()
        plan = FaultPlan(t0 + self.opts.kill_every_s,
                         [t0 + self.window_s * f for f in spread(self.opts.nats_restarts, 0.3, 0.6)],
                         [t0 + self.window_s * f for f in spread(self.opts.redis_flushes, 0.6, 0.9)])
        settled_before, timed_out = -1, False
        try:
            while True:
                now = loop.time()
                await self._inject(now, plan)
                self.faults.restart_crashed()
                self._show("under faults", follower, producer)
                if self.shown.final > settled_before:
                    settled_before, progressed_at = self.shown.final, now
                if submitting.done():
                    submitting.result()  # a bug in the producer is raised, not waited out
                    if not plan.pending and self.shown.final == len(producer.out.accepted):
                        break
                    if now - progressed_at > self.opts.stall_s:
                        timed_out = True
                        break
                if time.monotonic() > producer.deadline:
                    timed_out = True
                    break
                await asyncio.sleep(0.25)
        finally:
            if plan.restarting is not None:
                await plan.restarting
            submitting.cancel()
            await asyncio.gather(submitting, return_exceptions=True)
        return loop.time() - t0, timed_out

    async def _inject(self, now: float, plan: FaultPlan) -> None:
        """The faults that are due: a kill every `kill_every_s`, the NATS restarts and Redis flushes at their
        times (a NATS restart runs in the background: the run goes on while NATS is down)."""
        if now >= plan.next_kill:
            self.faults.kill_one()
            plan.next_kill = now + self.opts.kill_every_s
        if plan.restarting is not None and plan.restarting.done():
            plan.restarting.result()
            plan.restarting = None
        if plan.nats_at and now >= plan.nats_at[0] and plan.restarting is None:
            plan.nats_at.pop(0)
            plan.restarting = asyncio.create_task(self.faults.restart_nats())
        if plan.redis_at and now >= plan.redis_at[0]:
            plan.redis_at.pop(0)
            await self.faults.flush_redis()

    async def _all_ready(self, timeout_s: float = 60.0) -> None:
        """Every service alive and caught up with the log (a service is ready only after its catch-up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.faults.restart_crashed()
            ready = await asyncio.to_thread(lambda: [c.ready() for c in self.sup.children.values()])
            if all(ready):
                return
            await asyncio.sleep(0.5)

    async def _settle(self, bus: Bus, session: aiohttp.ClientSession, out: Submissions) -> Seen:
        """The whole log and everything the API serves, once the read models agree with the log; while they
        do not (accounting catching up after its last restart), look again, up to SETTLE_S."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            raw = await read_whole_log(bus)
            events = decode_log(raw)
            views = await api_views(session, self.api)
            mismatches = read_model_mismatches(events, views)
            if not mismatches or time.monotonic() > deadline:
                return Seen(raw, events, views, mismatches, out)
            await asyncio.sleep(1.0)


async def wait_for_platform(bus: Bus, timeout_s: float = 90.0) -> None:
    """Until the queues and every node are in the log and admission has handled them: a submission made
    earlier would be refused for an unknown team or GPU model, which is right, but not this benchmark's
    subject."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = [(seq, decode(data)) for seq, data in await read_log(bus)]
        queues = {e.queue.name: seq for seq, e in events if isinstance(e, QueuePolicyChanged)}
        nodes = {e.node.name: seq for seq, e in events if isinstance(e, NodeRegistered)}
        if (len(queues) >= scenario.QUEUES and len(nodes) >= scenario.NODES
                and await bus.ack_floor("admission") >= max(*queues.values(), *nodes.values())):
            return
        await asyncio.sleep(0.3)
    raise TimeoutError("the policy or the cluster never reached the log, or admission never handled them")


# --- judging ----------------------------------------------------------------------------------------------


async def read_whole_log(bus: Bus, attempts: int = 5) -> list[tuple[int, bytes]]:
    """The log up to its last sequence when the read began. read_log stops at a fetch that brings nothing,
    which a busy server can cause; a short read would show as lost jobs, so it is read again."""
    raw: list[tuple[int, bytes]] = []
    for _ in range(attempts):
        last = await bus.last_seq()
        raw = await read_log(bus)
        if not raw or raw[-1][0] >= last:
            return raw
    raise RuntimeError(f"could not read the whole log (got up to {raw[-1][0] if raw else 0})")


def decode_log(raw: list[tuple[int, bytes]]) -> list[tuple[int, EventBase]]:
    out: list[tuple[int, EventBase]] = []
    for seq, data in raw:
        with contextlib.suppress(Exception):  # undecodable messages decide nothing
            out.append((seq, decode(data)))
    return out


@dataclass(slots=True)
class ApiViews:
    jobs: dict[str, dict[str, Any]]
    queues: dict[str, dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    usage: dict[str, dict[str, Any]]


async def api_views(session: aiohttp.ClientSession, api: str, attempts: int = 40) -> ApiViews:
    """Every job, queue, node and team usage the API serves (asked again while the API restarts)."""
    for _ in range(attempts):
        try:
            got = []
            for path in ("/v1/jobs?limit=100000", "/v1/queues", "/v1/nodes", "/v1/usage"):
                async with session.get(api + path) as r:
                    r.raise_for_status()
                    got.append(await r.json())
            jobs, queues, nodes, usage = got
            return ApiViews({j["id"]: j for j in jobs}, {q["name"]: q for q in queues},
                            {n["name"]: n for n in nodes}, {u["team"]: u for u in usage})
        except (aiohttp.ClientError, TimeoutError, ValueError):
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the API at {api} did not answer")


def fresh_fold(events: list[tuple[int, EventBase]]) -> Ledger:
    """What the accounting projector folds, rebuilt from the log: the views the API must serve."""
    ledger = Ledger()
    for seq, e in events:
        if type(e) not in COMMAND_TYPES:
            ledger.fold(e, seq)
    return ledger


def _plain(view: msgspec.Struct) -> dict[str, Any]:
    """A view as the API serves it (JSON, msgspec's encoding)."""
    out: dict[str, Any] = json.loads(msgspec.json.encode(view))
    return out


# Queue and node figures that a fold decides alone; the rest (fair share, `seq`) depend on when a view was
# written, not on what the log says.
QUEUE_FIELDS = ("pending", "running", "reserved_gpus")
NODE_FIELDS = ("online", "gpus", "healthy_gpus", "allocated_gpus", "gpu_free_milli", "cordon")


def read_model_mismatches(events: list[tuple[int, EventBase]], views: ApiViews) -> list[str]:
    """Every job, queue, node and team whose view in the API differs from a rebuild from the log."""
    ledger = fresh_fold(events)
    out = [f"job {j}" for j in sorted(set(ledger.state.jobs) | set(views.jobs))
           if j not in ledger.state.jobs or _plain(ledger.state.jobs[j]) != views.jobs.get(j)]
    for name in sorted(ledger.state.queues):
        want = _plain(ledger.queue_view(name))
        got = views.queues.get(name, {})
        if any(want[k] != got.get(k) for k in QUEUE_FIELDS):
            out.append(f"queue {name}")
    for name in sorted(ledger.state.cluster.nodes):
        want = _plain(ledger.node_view(name))
        got = views.nodes.get(name, {})
        if any(want[k] != got.get(k) for k in NODE_FIELDS):
            out.append(f"node {name}")
    out += [f"usage {t}" for t in sorted(ledger.state.teams) if _plain(ledger.state.teams[t]) != views.usage.get(t)]
    return out


@dataclass(slots=True)
class Seen:
    """What the run is judged on: the whole log, the API's views, and what the producers were told."""

    raw: list[tuple[int, bytes]]
    events: list[tuple[int, EventBase]]
    views: ApiViews
    mismatches: list[str]
    out: Submissions


def judge(seen: Seen) -> dict[str, Any]:
    raw, events, views, mismatches, out = seen.raw, seen.events, seen.views, seen.mismatches, seen.out
    ledger = fresh_fold(events)
    accepted = sorted(out.accepted)
    decided = Counter(e.job_id for _, e in events if isinstance(e, JobSubmitted | JobRejected))
    lost = [j for j in accepted if j not in decided or j not in views.jobs]
    ids = Counter(e.id for _, e in events)
    duplicated = ([f"event id {i} x{n}" for i, n in ids.items() if n > 1]
                  + [f"job {j} decided {n} times" for j, n in decided.items() if n > 1]
                  + [f"job {j} answered as {sorted(set(a))}" for j, a in out.answered.items() if set(a) != {j}]
                  + [f"job {j} in the log, never accepted" for j in sorted(set(decided) - set(out.accepted))])
    stuck = [j for j in accepted if j in ledger.state.jobs and not settled(ledger, j)]
    histories = job_histories(events, set(stuck[:10]))
    report = replay(raw)  # one process: a forked pool would inherit the CLI's SIGTERM handler
    states = Counter(ledger.state.jobs[j].state for j in accepted if j in ledger.state.jobs)
    checks = {"jobs": len(accepted), "lost": len(lost), "duplicated": len(duplicated),
              "overallocations": len(overallocations(events)),
              "quota_violations": len(quota_violations(e for _, e in events)),
              "replay_mismatches": len(report.mismatches), "read_model_mismatches": len(mismatches),
              "stuck": len(stuck)}
    return {**checks, **guarantee_figures(events), "states": dict(sorted(states.items())),
            "preemptions": sum(len(e.victims) for _, e in events if isinstance(e, PreemptionDecided)),
            "evictions": sum(1 for _, e in events if isinstance(e, JobEvicted)),
            "finished_before_started": len(finished_before_started(events)),
            # 422 answers to valid submissions (asked again until accepted): the API judged them on a state
            # that had not caught up with the log yet.
            "refused_valid": sum(out.refused.values()),
            "events": len(raw), "decisions_replayed": report.decisions_checked, "producer": producer_figures(out),
            "details": {"lost": lost[:10], "duplicated": duplicated[:10], "read_model_mismatches": mismatches[:10],
                        "stuck": [f"{j}: {histories[j]}" for j in stuck[:10]]}}


def job_histories(events: list[tuple[int, EventBase]], jobs: set[str]) -> dict[str, str]:
    """Each job's events in log order, as `seq Type` (what a stuck job's report needs to be understood)."""
    out: dict[str, list[str]] = {j: [] for j in jobs}
    for seq, e in events:
        job_id = getattr(e, "job_id", None)
        if job_id in out:
            out[job_id].append(f"{seq} {type(e).__name__}")
    return {j: ", ".join(h) for j, h in out.items()}


def finished_before_started(events: list[tuple[int, EventBase]]) -> list[str]:
    """Jobs whose JobFinished reached the log before the JobStarted of the same placement: an executor's
    report that overtook another (a finish timer armed before its start report was stored). A later start
    then shows the finished job as running again."""
    started: dict[str, bool] = {}  # job -> started since its last placement
    out = []
    for _, e in events:
        if isinstance(e, JobPlaced):
            started[e.job_id] = False
        elif isinstance(e, JobStarted):
            started[e.job_id] = True
        elif isinstance(e, JobFinished) and started.get(e.job_id) is False:
            out.append(e.job_id)
    return out


def producer_figures(out: Submissions) -> dict[str, Any]:
    return {"http": out.by_via["http"], "bus": out.by_via["bus"], "again": out.again,
            "cancels": dict(sorted(out.cancels.items())), "retries": out.retries,
            "refused": dict(sorted(out.refused.items())), "errors": dict(sorted(out.errors.items())),
            "gave_up": len(out.gave_up)}


def failed(result: dict[str, Any]) -> bool:
    return any(result.get(k) for k in FAIL_KEYS)
