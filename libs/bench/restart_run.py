"""`gpusched snapshots bench`: how long a service takes to be back after a restart with a long log, from a
snapshot and without one.

The log is what the services would really hold: a long run of the platform in virtual time (the deciders
themselves, a simulated executor and clock ticks; libs/sim/pipeline.py) with jobs from four teams arriving
at a rate that keeps the cluster busy, so there are deferrals, preemptions and evictions, not only clean
lifecycles. It is published to a fresh NATS server of the bench's own. Then, per service:

1. its durable consumer is set as if the service had handled the whole log before it stopped;
2. without a snapshot: the reactor starts (replays every event of the service's up to the consumer's ack
   floor, then binds the consumer), timed;
3. with a snapshot: a snapshot of the state as it was `every_events` of the service's own events before the
   end (the oldest the snapshot policy lets the latest snapshot be) is stored, then a reactor starts from it
   (loads, verifies and restores it, replays the tail), timed;
4. both restarted states are compared with the state of a fold of the whole log.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import REGISTRY

from contracts import EventBase
from libs.bus.jetstream import Bus, BusConfig
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import Decider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from libs.reports.rates import load_rates
from libs.runtime.embedded import start_nats, start_redis
from libs.runtime.handler import DeciderHandler
from libs.runtime.reactor import Reactor
from libs.runtime.settings import DEFAULT_CLUSTER
from libs.runtime.snapshots import EVERY_EVENTS, SnapshotPolicy, Snapshotter
from libs.sim.pipeline import run_virtual
from libs.sim.workload import synthetic_inputs
from libs.views.projector import Projector
from libs.views.store import ViewStore

DECIDERS: dict[str, Callable[[], Decider]] = {"admission": AdmissionDecider, "quota": QuotaDecider,
                                              "placement": PlacementDecider, "preemption": PreemptionDecider}
# Accounting keeps every job it ever saw (its ledger): the largest state, and its read models to rebuild.
SERVICES = (*DECIDERS, "accounting")
STREAM = "RESTARTBENCH"
PREFIX = "rb"
# Events per job in the virtual run at the default rate (measured): how many jobs make the log asked for.
EVENTS_PER_JOB = 15
PUBLISH_CHUNK = 5000
TARGET_S = 5.0

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RestartBenchOptions:
    events: int = 1_000_000
    services: tuple[str, ...] = SERVICES
    every_events: int = EVERY_EVENTS
    # Jobs per second of virtual time on the demo cluster: about 0.3 saturates its quotas.
    rate_per_s: float = 0.15
    seed: int = 1
    data: Path | None = None  # keep the NATS store here (default: a temporary folder, removed afterwards)


def make_history(opts: RestartBenchOptions, progress: Progress | None = None) -> list[EventBase]:
    jobs = math.ceil(opts.events / EVENTS_PER_JOB) + 100
    while True:
        inputs = synthetic_inputs(DEFAULT_CLUSTER, jobs, seed=opts.seed, rate_per_s=opts.rate_per_s)
        log = run_virtual(inputs, tick_s=5.0,
                          progress=(lambda n: progress(f"virtual run: {n:,} events")) if progress else None).log
        if len(log) >= opts.events:
            return [e for _, e in log[:opts.events]]
        jobs = math.ceil(jobs * opts.events / max(len(log), 1)) + 100


async def publish_log(bus: Bus, events: list[EventBase], progress: Progress | None = None) -> None:
    for i in range(0, len(events), PUBLISH_CHUNK):
        await bus.publish(events[i:i + PUBLISH_CHUNK])
        if progress is not None and (i // PUBLISH_CHUNK) % 20 == 0:
            progress(f"published {i + PUBLISH_CHUNK:,} of {len(events):,}")


class Target:
    """One service as the bench drives it: its handler, what its state is, what it has done at a batch's end."""

    def __init__(self, name: str, views: ViewStore | None) -> None:
        self.name = name
        self.views = views

    def handler(self) -> Any:
        if self.name == "accounting":
            assert self.views is not None
            return Projector(self.views, load_rates())
        return DeciderHandler(DECIDERS[self.name]())

    @staticmethod
    def state(handler: Any) -> bytes:
        if isinstance(handler, Projector):
            led = handler.ledger.state
            return msgspec.json.encode([led.jobs, led.teams, led.queues, led.usage.running, handler.first_seq])
        return bytes(handler.decider.snapshot() + msgspec.json.encode(handler.chain))

    @staticmethod
    async def settle(handler: Any) -> None:
        """What a live service has done by the end of a batch: accounting has written its views (which empties
        what its ledger keeps for the next write)."""
        if isinstance(handler, Projector):
            await handler.flush(force=True)


async def bench_service(bus: Bus, target: Target, events: list[EventBase], every_events: int,
                        progress: Progress | None = None) -> dict[str, Any]:
    name = target.name
    folded = target.handler()
    accepted = tuple(folded.input_types())
    mine = [(seq, e) for seq, e in enumerate(events, 1) if isinstance(e, accepted)]
    last = len(events)
    snapshot_seq = mine[-every_events - 1][0] if len(mine) > every_events else 0

    # The state a snapshot holds: the fold up to `snapshot_seq`; the fold of it all, to compare with.
    say = progress or (lambda _: None)
    say(f"{name}: folding its {len(mine):,} events in memory")
    snaps = Snapshotter(bus, folded, SnapshotPolicy(every_events=every_events))
    capture_s = 0.0
    for seq, e in mine:
        if snapshot_seq and seq > snapshot_seq and not capture_s:
            await target.settle(folded)
            started = time.perf_counter()
            snaps.take(snapshot_seq)  # encodes the state at once; stores it in the background
            capture_s = time.perf_counter() - started
            await snaps.flush()
        folded.replay(seq, e)
    await snaps.close()
    stored = await snaps.store.manifest()
    expected = target.state(folded)

    # The service had handled everything before it stopped: its consumer's ack floor is the log's end.
    consumer = await bus.durable(name, [bus.subject_for_type(t) for t in accepted], start_seq=last + 1)
    await consumer.close()
    floor = await bus.ack_floor(name)

    say(f"{name}: restart without a snapshot")
    plain = target.handler()
    reactor = Reactor(bus, plain)
    started = time.perf_counter()
    await reactor.start()
    full_s = time.perf_counter() - started
    full_catch_up_s = _catch_up_s(name)

    say(f"{name}: restart from the snapshot")
    restored = target.handler()
    loader = Snapshotter(bus, restored, SnapshotPolicy(every_events=every_events))
    reactor = Reactor(bus, restored, snapshots=loader)
    started = time.perf_counter()
    await reactor.start()
    snap_s = time.perf_counter() - started
    snap_catch_up_s = _catch_up_s(name)
    await loader.close()
    return {
        "service": name, "log_events": last, "service_events": len(mine), "ack_floor": floor,
        # Catch-up: until the service handles the live log (the reactor's gpusched_reactor_catch_up_seconds);
        # ready: also what the handler does after it (accounting rewrites every read model in Redis).
        "catch_up_s": round(full_catch_up_s, 2), "ready_s": round(full_s, 2),
        "catch_up_events_per_s": round(len(mine) / full_catch_up_s),
        "snapshot_seq": loader.restored_seq, "tail_events": sum(seq > loader.restored_seq for seq, _ in mine),
        "snapshot_bytes": stored[0].size if stored is not None else 0,
        "snapshot_capture_s": round(capture_s, 3), "snapshot_load_s": round(loader.load_s, 2),
        "catch_up_with_snapshot_s": round(snap_catch_up_s, 2), "ready_with_snapshot_s": round(snap_s, 2),
        "same_state": target.state(plain) == expected == target.state(restored),
    }


def _catch_up_s(service: str) -> float:
    return REGISTRY.get_sample_value("gpusched_reactor_catch_up_seconds", {"service": service}) or 0.0


async def _run(opts: RestartBenchOptions, folder: Path, progress: Progress | None) -> dict[str, Any]:
    say = progress or (lambda _: None)
    started = time.perf_counter()
    events = make_history(opts, progress)
    made_s = time.perf_counter() - started
    servers = [start_nats(folder / "nats")]
    views: ViewStore | None = None
    try:
        if "accounting" in opts.services:
            servers.append(start_redis(folder / "redis"))
            views = ViewStore.from_url(servers[-1].url, prefix=STREAM.lower())
        bus = await Bus.connect(BusConfig(url=servers[0].url, stream=STREAM, subject_prefix=PREFIX))
        try:
            started = time.perf_counter()
            await publish_log(bus, events, progress)
            published_s = time.perf_counter() - started
            say(f"{len(events):,} events published in {published_s:.0f}s")
            results = [await bench_service(bus, Target(name, views), events, opts.every_events, progress)
                       for name in opts.services]
        finally:
            await bus.close()
            if views is not None:
                await views.close()
    finally:
        for server in reversed(servers):
            server.stop()
    return {"events": len(events), "every_events": opts.every_events, "rate_per_s": opts.rate_per_s,
            "history_s": round(made_s, 1), "publish_s": round(published_s, 1), "target_s": TARGET_S,
            "services": results,
            "met": all(r["catch_up_with_snapshot_s"] <= TARGET_S and r["same_state"] for r in results)}


def run_restart_bench(opts: RestartBenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    unknown = sorted(set(opts.services) - set(SERVICES))
    if unknown:
        raise ValueError(f"unknown service(s) {', '.join(unknown)}; choose from {', '.join(SERVICES)}")
    folder = opts.data or Path(tempfile.mkdtemp(prefix="gpusched-restart-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_run(opts, folder, progress))
    finally:
        if opts.data is None:
            shutil.rmtree(folder, ignore_errors=True)
