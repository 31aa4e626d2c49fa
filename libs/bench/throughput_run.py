"""`gpusched bench throughput`: how many jobs a second the six services place, and how fast, on a large
cluster. Fresh NATS and Redis, the six services as processes and the openb cluster (1,213 nodes, 6,212
GPUs) simulated; short jobs (one GPU or half of one, declaring 1-2 s, so the cluster never fills) arrive at
a steady rate as `SubmitJob` commands published on the bus in pipelined batches (and, if asked, some
through the HTTP API). Each step's figures come from the log alone, timed by when the server stored each
event (libs/bench/throughput_metrics.py).

`search` looks for the highest rate the platform sustains: steps of a few seconds on the same platform,
each measured on its own stretch of the log once the previous step's jobs have finished and every service
has caught up, the rate doubled while it holds and then bisected. `profile_dir` samples every service with
py-spy during the main step (libs/bench/throughput_profile.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from contracts import JobFailed, JobFinished, JobPlaced, JobRejected, JobSpec, SubmitJob
from contracts.codec import decode
from libs.bench.kueue_run import Backlog, cpu_seconds, wait_for_policy_and_nodes
from libs.bench.platform import bench_platform
from libs.bench.throughput_metrics import step_figures, sustained
from libs.bench.throughput_profile import Profiler
from libs.bench.throughput_watch import backlogs, deliveries, read_range, sample_backlog
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.idempotency_keys import job_id_for_key
from libs.core.kernel.decider import derived_id
from libs.runtime.embedded import EmbeddedServer
from libs.runtime.settings import OFF_PATH_NICE_ENV, REPO_ROOT, off_path_nice
from libs.runtime.supervisor import Supervisor

SOURCE = "throughput-bench"
# Read in place from the shared data next to the repository; never copied into it.
DEFAULT_CLUSTER = REPO_ROOT.parent / "shared" / "data" / "openb" / "openb_node_list_gpu_node.csv"
TEAMS = ("alpha", "beta", "gamma", "delta")
# Four team queues in one cohort, each with a nominal quota no step comes near: quota is decided (fair
# order, cohort arithmetic) but never the reason a job waits.
POLICY = '[[queues]]\nname = "org"\nteam = "org"\n' + "".join(
    f'\n[[queues]]\nname = "{t}"\nteam = "{t}"\nparent = "org"\nnominal_gpus = 1500\n' for t in TEAMS) + (
    '\n[[priority_classes]]\nname = "training"\nvalue = 500\n')
SERVICE_ENV = {"GPUSCHED_TICK_SECONDS": "1", "GPUSCHED_TIME_SCALE": "1"}
HTTP_CONCURRENCY = 32
FINAL = (JobFinished, JobFailed, JobRejected)
# After a step's jobs are final: for their last reactions (quota released, views) to reach the log.
SETTLE_S = 1.0
IDLE_S = 3.0


@dataclass(frozen=True, slots=True)
class ThroughputOptions:
    cluster: Path = DEFAULT_CLUSTER
    rate: float = 500.0  # jobs per second offered in the main step
    duration_s: float = 10.0  # seconds of arrivals in the main step
    search: bool = False
    search_step_s: float = 5.0  # seconds of arrivals in each search step
    search_max: float = 4000.0
    search_steps: int = 8  # search steps at most, the main step not counted
    p99_bound_ms: float = 1000.0  # a sustained rate keeps p99 submit-to-placed under this ...
    min_share: float = 0.95  # ... and places at least this share of the offered rate
    http_share: float = 0.0  # share of the jobs submitted through POST /v1/jobs instead of the bus
    batch_every_s: float = 0.02  # arrivals due are published together this often
    job_s: tuple[float, float] = (1.0, 2.0)  # declared durations, spread evenly over this range
    drain_timeout_s: float = 60.0  # for a step's jobs to be placed and finished after its arrivals
    profile_dir: Path | None = None  # py-spy profiles of every service during the main step's arrivals
    # The services off the path to a placement run this much lower in CPU priority, so that on a machine with
    # fewer cores than busy processes the path to a placement gets the CPU first and the others catch up
    # later. 0: all at one priority; None: the platform's setting (GPUSCHED_OFF_PATH_NICE, default 10).
    off_path_nice: int | None = None
    data: Path | None = None


@dataclass(slots=True)
class StepProgress:
    phase: str
    rate: float = 0.0
    submitted: int = 0
    placed: int = 0
    total: int = 0
    result: dict[str, Any] | None = None  # a step's figures, once it is measured


ProgressFn = Callable[[StepProgress], None]


@dataclass(frozen=True, slots=True)
class Planned:
    job_id: str
    spec: JobSpec
    key: str  # the idempotency key of a job submitted through the API; "" for one published on the bus


@dataclass(slots=True)
class Tracker:
    """The step's jobs placed and final, followed on the log (for the progress display and the end)."""

    jobs: set[str]
    placed: set[str] = field(default_factory=set)
    final: set[str] = field(default_factory=set)


def plan_step(step: int, n: int, opts: ThroughputOptions) -> list[Planned]:
    """`n` jobs across the four teams: three in four take one whole GPU, one in four half a GPU; declared
    runtimes spread over `opts.job_s`. Every `1 / http_share`-th goes through the API."""
    lo, hi = opts.job_s
    every = round(1 / opts.http_share) if opts.http_share > 0 else 0
    out = []
    for i in range(n):
        team = TEAMS[i % len(TEAMS)]
        spec = JobSpec(team=team, queue=team, user=f"u{i % 7}", gpus=1, gpu_milli=500 if i % 4 == 3 else 0,
                       duration_s=round(lo + (hi - lo) * (i % 11) / 10, 2))
        key = f"{SOURCE}-{step}-{i}" if every and i % every == every - 1 else ""
        job_id = job_id_for_key(team, key) if key else f"tp-{step}-{i:07d}"
        out.append(Planned(job_id, msgspec.structs.replace(spec, idempotency_key=key) if key else spec, key))
    return out


def run_throughput(opts: ThroughputOptions, progress: ProgressFn | None = None) -> dict[str, Any]:
    if opts.rate <= 0 or opts.duration_s <= 0 or opts.search_step_s <= 0 or not 0 <= opts.http_share <= 1:
        raise ValueError("--rate and --duration must be > 0 and --http-share between 0 and 1")
    if not opts.cluster.exists():
        raise FileNotFoundError(f"cluster {opts.cluster} not found (--cluster CSV)")
    csv = opts.cluster.read_text()
    nodes = len({line.split(",", 1)[0] for line in csv.splitlines()[1:] if line.strip()})
    nice = off_path_nice() if opts.off_path_nice is None else opts.off_path_nice
    opts = replace(opts, off_path_nice=nice)
    service_env = {**SERVICE_ENV, OFF_PATH_NICE_ENV: str(nice)}
    with bench_platform(opts.data, "throughput", POLICY, csv, service_env) as run:
        api = f"http://127.0.0.1:{run.sup.ports['admission']}"
        result = asyncio.run(_drive(BusConfig(url=run.env["NATS_URL"]), run.sup, run.servers, api, nodes, opts,
                                    progress or (lambda _: None)))
    result.update(cluster=str(opts.cluster), nodes=nodes, gpus=_gpus(csv))
    return result


def _gpus(csv: str) -> int:
    header, *rows = csv.splitlines()
    col = header.split(",").index("gpu")
    return sum(int(r.split(",")[col]) for r in rows if r.strip())


async def _drive(config: BusConfig, sup: Supervisor, servers: list[EmbeddedServer], api: str, nodes: int,
                 opts: ThroughputOptions, progress: ProgressFn) -> dict[str, Any]:
    bus = await Bus.connect(config, name="gpusched-bench")
    try:
        progress(StepProgress("waiting for the cluster to register"))
        await wait_for_policy_and_nodes(bus, len(TEAMS) + 1, nodes, timeout_s=120.0)
        progress(StepProgress("measuring the idle platform's CPU"))
        idle = await _idle_cpu(sup, servers)
        async with aiohttp.ClientSession() as http:
            stepper = Stepper(bus, sup, servers, http, api, opts, progress)
            main = await stepper.step(opts.rate, opts.duration_s, profile=opts.profile_dir)
            search = await _search(stepper, main) if opts.search else []
    finally:
        await bus.close()
    passed = [s["rate"] for s in search if s["sustained"]]
    return {**main, "max_sustained_jobs_per_s": max(passed) if passed else None, "search": search,
            "idle_cpu_pct": idle, "off_path_nice": opts.off_path_nice, "p99_bound_ms": opts.p99_bound_ms,
            "min_placed_share": opts.min_share,
            "service_restarts": stepper.restarts}


async def _idle_cpu(sup: Supervisor, servers: list[EmbeddedServer], seconds: float = IDLE_S) -> dict[str, float]:
    """Per process, % of one core used with no job in the system (clock ticks, metrics, the cluster's
    simulated GPU samples): the part of the per-job CPU figures that does not depend on the jobs."""
    await asyncio.sleep(1.0)  # the registration's last reactions
    before = cpu_seconds(sup, servers)
    await asyncio.sleep(seconds)
    after = cpu_seconds(sup, servers)
    return {k: round(100 * (after.get(k, 0.0) - v) / seconds, 1) for k, v in sorted(before.items())}


async def _search(stepper: Stepper, main: dict[str, Any]) -> list[dict[str, Any]]:
    """Double the rate while it holds, halve it while it does not, then bisect between the best rate that
    held and the lowest that did not, until they are within 10 %. The main step is the first point."""
    opts = stepper.opts
    steps: list[dict[str, Any]] = [main]
    good = main["rate"] if main["sustained"] else None
    bad = None if main["sustained"] else main["rate"]
    for _ in range(opts.search_steps if main["drained"] and main["caught_up_s"] is not None else 0):
        if good is not None and bad is not None:
            if bad <= good * 1.1:
                break
            rate = (good + bad) / 2
        elif good is not None:
            if good >= opts.search_max:
                break
            rate = min(good * 2, opts.search_max)
        else:
            assert bad is not None
            if bad <= 20:
                break
            rate = bad / 2
        fig = await stepper.step(round(rate, -1) or 10.0, opts.search_step_s)
        steps.append(fig)
        if not fig["drained"] or fig["caught_up_s"] is None:
            break  # a backlog left behind would slow the next step: the search ends here
        if fig["sustained"]:
            good = max(good or 0.0, fig["rate"])
        else:
            bad = min(bad if bad is not None else float("inf"), fig["rate"])
    return [{k: s[k] for k in ("rate", "duration_s", "placed_per_s", "p50_ms", "p99_ms", "backlog_at_end",
                               "caught_up_s", "sustained", "cpu_ms_per_job")} for s in steps]


@dataclass
class Stepper:
    bus: Bus
    sup: Supervisor
    servers: list[EmbeddedServer]
    http: aiohttp.ClientSession
    api: str
    opts: ThroughputOptions
    progress: ProgressFn
    count: int = 0
    restarts: list[str] = field(default_factory=list)

    async def step(self, rate: float, duration_s: float, profile: Path | None = None) -> dict[str, Any]:
        """One step: arrivals at `rate` for `duration_s`, then until every job is placed and final."""
        self.count += 1
        planned = plan_step(self.count, max(1, round(rate * duration_s)), self.opts)
        tracker = Tracker({p.job_id for p in planned})
        shown = StepProgress(f"step {self.count}: {rate:g} jobs/s", rate, total=len(planned))
        start_seq = await self.bus.last_seq() + 1
        follower = asyncio.create_task(_follow(self.bus, tracker, start_seq))
        backlog = Backlog()
        sampler = asyncio.create_task(sample_backlog(self.bus, backlog))
        profiler = Profiler.start(self.sup, self.servers, profile, duration_s) if profile else None
        delivered_before = await deliveries(self.bus)
        cpu_before = cpu_seconds(self.sup, self.servers)
        try:
            lag = await self._submit(planned, rate, tracker, shown)
            cpu_arrivals = cpu_seconds(self.sup, self.servers)
            at_end = dict(backlog.peak)  # the services' backlogs while the arrivals went on
            pending_now = await backlogs(self.bus)
            arrivals_end = time.monotonic()
            drained = await self._wait(tracker, shown)
            # Every service done with the step (accounting may trail far behind the placements): the time
            # it took says whether the whole platform, not only the path to a placement, kept up.
            caught_up_s = await self._wait_caught_up(arrivals_end)
            await asyncio.sleep(SETTLE_S)
            cpu_after = cpu_seconds(self.sup, self.servers)
            delivered = await deliveries(self.bus)
            end_seq = await self.bus.last_seq()
        finally:
            for task in (follower, sampler):
                task.cancel()
            await asyncio.gather(follower, sampler, return_exceptions=True)
        profiles = profiler.finish() if profiler else None
        log = [(seq, at, decode(data)) for seq, at, data in await read_range(self.bus, start_seq, end_seq)]
        figures = step_figures(log, tracker.jobs, rate)
        n = len(planned)
        figures.update(
            duration_s=duration_s, drained=drained, caught_up_s=caught_up_s,
            sustained=drained and sustained(figures, self.opts.p99_bound_ms, self.opts.min_share),
            submit_lag_max_s=round(lag, 3), peak_consumer_backlog=at_end, consumer_backlog_at_end=pending_now,
            cpu_s={k: round(cpu_after.get(k, 0.0) - v, 2) for k, v in sorted(cpu_before.items())},
            cpu_s_arrivals={k: round(cpu_arrivals.get(k, 0.0) - v, 2) for k, v in sorted(cpu_before.items())},
            cpu_ms_per_job={k: round(1000 * (cpu_after.get(k, 0.0) - v) / n, 3)
                            for k, v in sorted(cpu_before.items())},
            # Messages each service was handed per job: its events in, the unit of its per-event costs.
            deliveries_per_job={k: round((v - delivered_before.get(k, 0)) / n, 2) for k, v in delivered.items()},
        )
        if profiles is not None:
            figures["profile"] = profiles
        shown.result = figures
        self.progress(shown)
        return figures

    async def _submit(self, planned: list[Planned], rate: float, tracker: Tracker, shown: StepProgress) -> float:
        """Publish each job when it is due, every job due at one tick in one pipelined batch; a job for the
        API is posted on its own. Returns the largest lag of a batch behind its schedule (seconds)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        posts: set[asyncio.Task[None]] = set()
        gate = asyncio.Semaphore(HTTP_CONCURRENCY)
        lag = 0.0
        i = 0
        tick = t0
        while i < len(planned):
            due = max(i, min(len(planned), int((loop.time() - t0) * rate) + 1))
            # How late the batch's first job goes out behind its schedule (the tick itself included).
            lag = max(lag, loop.time() - (t0 + i / rate))
            batch, i = planned[i:due], due
            now = time.time()
            await self.bus.publish([SubmitJob(id=derived_id(SOURCE, "submit", p.job_id), ts=now, source=SOURCE,
                                              correlation_id=p.job_id, job_id=p.job_id, spec=p.spec)
                                    for p in batch if not p.key])
            for p in batch:
                if p.key:
                    task = asyncio.create_task(self._post(p, gate))
                    posts.add(task)
                    task.add_done_callback(posts.discard)
            shown.submitted, shown.placed = i, len(tracker.placed)
            self.progress(shown)
            self._restart_dead()
            # The next batch: at the next tick, or when the next job is due if that is later.
            tick = max(tick + self.opts.batch_every_s, loop.time())
            await asyncio.sleep(max(0.0, max(tick, t0 + i / rate) - loop.time()))
        if posts:
            await asyncio.gather(*posts)
        return lag

    def _restart_dead(self) -> None:
        """Crash-only services resume from the log; the run goes on (and says so)."""
        self.restarts += self.sup.restart_dead()  # at their CPU priority again (the supervisor sets it)

    async def _post(self, p: Planned, gate: asyncio.Semaphore) -> None:
        """POST /v1/jobs until the API takes it (it answers 503 while catching up); same key, same job."""
        body = msgspec.json.encode(p.spec)
        async with gate:
            for _ in range(100):
                async with self.http.post(f"{self.api}/v1/jobs", data=body,
                                          headers={"Content-Type": "application/json"}) as r:
                    if r.status in (200, 201):
                        return
                    if r.status not in (429, 503):
                        raise RuntimeError(f"POST /v1/jobs: {r.status} {await r.text()}")
                await asyncio.sleep(0.1)
        raise RuntimeError(f"POST /v1/jobs never accepted job {p.job_id}")

    async def _wait(self, tracker: Tracker, shown: StepProgress) -> bool:
        """Until every job of the step is placed and final; False when the drain timeout ran out first."""
        deadline = time.monotonic() + self.opts.drain_timeout_s
        while len(tracker.final) < len(tracker.jobs) and time.monotonic() < deadline:
            self._restart_dead()
            shown.placed = len(tracker.placed)
            self.progress(shown)
            await asyncio.sleep(0.2)
        shown.placed = len(tracker.placed)
        return len(tracker.final) >= len(tracker.jobs)

    async def _wait_caught_up(self, since: float) -> float | None:
        """Seconds from `since` until no service has anything left to handle; None past the drain timeout."""
        deadline = since + self.opts.drain_timeout_s
        while time.monotonic() < deadline:
            left = await backlogs(self.bus)
            if left and not any(left.values()):
                return round(time.monotonic() - since, 1)
            self._restart_dead()
            await asyncio.sleep(0.2)
        return None


async def _follow(bus: Bus, tracker: Tracker, start_seq: int) -> None:
    reader = await bus.reader([bus.subject_for_type(t) for t in (JobPlaced, *FINAL)], start_seq=start_seq)
    try:
        while True:
            for m in await reader.fetch(2000, timeout=0.5):
                e = decode(m.data)
                job = getattr(e, "job_id", "")
                if job not in tracker.jobs:
                    continue
                if isinstance(e, JobPlaced):
                    tracker.placed.add(job)
                elif isinstance(e, FINAL):
                    tracker.final.add(job)
    finally:
        await reader.close()
