"""The platform on a three-server NATS cluster (infra/nats/cluster/node.conf) with its streams replicated on
every server (R3). Jobs from three teams arrive through the HTTP API and the bus while the server that leads
the log's stream is SIGKILLed, left down, then started again. Every job reaches its end exactly once, the
platform goes on deciding while the server is down (the jobs submitted meanwhile finish), the restarted
server catches up, and the log verifies and replays to the same decisions."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from contracts import EventBase, JobEvicted, JobFinished, JobPlaced, JobSubmitted
from libs.audit.log_reader import read_log_timed
from libs.audit.verify import verify
from libs.bench import chaos_scenario as scenario
from libs.bench.chaos_run import (
    FAIL_KEYS,
    LogFollower,
    Producer,
    Seen,
    Submissions,
    api_views,
    decode_log,
    judge,
    read_model_mismatches,
    read_whole_log,
    wait_for_platform,
)
from libs.bus.jetstream import Bus, BusConfig
from libs.core.accounting.state import FINAL_STATES
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.nats_cluster import NatsCluster, NatsNode, start_nats_cluster
from libs.runtime.platform import start_platform
from libs.runtime.supervisor import Supervisor

pytestmark = pytest.mark.e2e

JOBS = 150
WINDOW_S = 20.0  # submissions spread over this
TIME_SCALE = 4  # job seconds per wall second of the simulated executor
KILL_AT = 0.2  # of the window: the stream's leader is SIGKILLed then
DOWN_AFTER_ELECTION_S = 8.0  # and stays down this long once another server leads the stream
RUN_TIMEOUT_S = 120.0


@dataclass
class Outage:
    """What happened around the lost server, in wall-clock seconds (the servers' store timestamps use the
    same clock, on this one machine)."""

    node: str = ""
    meta_leader: str = ""
    killed_at: float = 0.0
    new_leader: str = ""
    elected_at: float = 0.0
    restarted_at: float = 0.0
    healthy_at: float = 0.0
    client_retries: int = 0  # stream-info requests the observer made while no server led the stream

    @property
    def done(self) -> bool:
        return self.healthy_at > 0.0


async def stream_leader(bus: Bus, stream: str) -> str:
    info = await bus.js.stream_info(stream)
    return str(info.cluster.leader or "") if info.cluster else ""


async def lose_a_server(cluster: NatsCluster, bus: Bus, stream: str, t0: float, outage: Outage) -> None:
    """SIGKILL the server that leads the log's stream, wait for another to take over, keep it down a while,
    start it again and wait until it has caught up."""
    await asyncio.sleep(max(0.0, t0 + WINDOW_S * KILL_AT - time.monotonic()))
    leader = await stream_leader(bus, stream)
    victim: NatsNode = cluster.node(leader)
    outage.node, outage.meta_leader = leader, victim.meta_leader()
    await asyncio.to_thread(victim.kill)
    outage.killed_at = time.time()
    while True:  # the observer's own view of the failover: stream info answers only once a leader is elected
        try:
            now_leading = await asyncio.wait_for(stream_leader(bus, stream), timeout=1.0)
        except Exception:  # no leader yet, or this client is moving to another server
            now_leading = ""
        if now_leading and now_leading != leader:
            outage.new_leader, outage.elected_at = now_leading, time.time()
            break
        outage.client_retries += 1
        await asyncio.sleep(0.05)
    await asyncio.sleep(DOWN_AFTER_ELECTION_S)
    await asyncio.to_thread(victim.start)
    outage.restarted_at = time.time()
    while not await asyncio.to_thread(victim.healthy):
        await asyncio.sleep(0.1)
    outage.healthy_at = time.time()


@dataclass
class Run:
    seen: Seen
    stored_at: dict[int, float]  # stream sequence -> when the server stored it
    outage: Outage
    crash_restarts: Counter[str]
    replicas: dict[str, int]
    replicas_current: list[tuple[str, bool]]
    run_s: float


async def drive(cluster: NatsCluster, sup: Supervisor, stream: str, prefix: str, api: str) -> Run:
    bus = await Bus.connect(BusConfig(url=cluster.url, stream=stream, subject_prefix=prefix, replicas=3),
                            name="cluster-test")
    follower = LogFollower(bus)
    follower.start()
    crashed: Counter[str] = Counter()
    try:
        replicas = {s: (await bus.js.stream_info(s)).config.num_replicas or 1 for s in (stream, f"{stream}_DLQ")}
        await wait_for_platform(bus)
        plan = scenario.plan(JOBS, seed=11, window_s=WINDOW_S, time_scale=TIME_SCALE)
        outage = Outage()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
            producer = Producer(bus, session, api, plan, time.monotonic() + RUN_TIMEOUT_S)
            t0 = time.monotonic()
            submitting = asyncio.create_task(producer.run())
            losing = asyncio.create_task(lose_a_server(cluster, bus, stream, t0, outage))
            try:
                while not (submitting.done() and losing.done()
                           and all(follower.settled(j) for j in producer.out.accepted)):
                    assert time.monotonic() - t0 < RUN_TIMEOUT_S, (
                        f"not every job settled: {len(producer.out.accepted)} accepted, outage {outage}")
                    for task in (submitting, losing):
                        if task.done():
                            task.result()  # a failure in the producer or the fault is raised, not waited out
                    crashed.update(sup.restart_dead())  # crash-only services: started again, they resume
                    await asyncio.sleep(0.25)
            finally:
                for task in (submitting, losing):
                    task.cancel()
                await asyncio.gather(submitting, losing, return_exceptions=True)
            run_s = time.monotonic() - t0
            await all_ready(sup, crashed)
            seen = await settle(bus, session, api, producer.out)
        stored_at = {seq: ts for seq, ts, _ in await read_log_timed(bus)}
        info = await bus.js.stream_info(stream)
        current = [(str(r.name), bool(r.current)) for r in (info.cluster.replicas or [])] if info.cluster else []
        return Run(seen, stored_at, outage, crashed, replicas, current, run_s)
    finally:
        await follower.stop()
        await bus.close()


async def all_ready(sup: Supervisor, crashed: Counter[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(await asyncio.to_thread(lambda: [c.ready() for c in sup.children.values()])):
        assert time.monotonic() < deadline, "a service never became ready again"
        crashed.update(sup.restart_dead())
        await asyncio.sleep(0.25)


async def settle(bus: Bus, session: aiohttp.ClientSession, api: str, out: Submissions,
                 timeout_s: float = 60.0) -> Seen:
    """The whole log and the API's views, once the views agree with the log (accounting catching up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        raw = await read_whole_log(bus)
        events = decode_log(raw)
        views = await api_views(session, api)
        mismatches = read_model_mismatches(events, views)
        if not mismatches or time.monotonic() > deadline:
            return Seen(raw, events, views, mismatches, out)
        await asyncio.sleep(0.5)


def runs_per_job(events: list[tuple[int, EventBase]]) -> dict[str, tuple[int, int, int]]:
    """Per job: (placements, evictions, finishes) in the log."""
    counts: dict[str, list[int]] = {}
    for _, e in events:
        if isinstance(e, JobPlaced | JobEvicted | JobFinished):
            slot = 0 if isinstance(e, JobPlaced) else 1 if isinstance(e, JobEvicted) else 2
            counts.setdefault(e.job_id, [0, 0, 0])[slot] += 1
    return {j: (c[0], c[1], c[2]) for j, c in counts.items()}


def test_a_server_of_three_is_lost_and_comes_back_and_no_job_is_lost_or_decided_twice(
    tmp_path: Path, redis_server: EmbeddedServer, stream_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    (tmp_path / "cluster.csv").write_text(scenario.CLUSTER_CSV)
    (tmp_path / "policy.toml").write_text(scenario.POLICY_TOML)
    cluster = start_nats_cluster(tmp_path / "nats")
    prefix = stream_name.lower()
    # The services, like any process of the platform, find the cluster through their environment alone.
    monkeypatch.setenv("NATS_URL", cluster.url)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    env = {"GPUSCHED_STREAM_REPLICAS": "3", "GPUSCHED_STREAM": stream_name, "GPUSCHED_SUBJECT_PREFIX": prefix,
           "GPUSCHED_TICK_SECONDS": "1", "GPUSCHED_TIME_SCALE": str(TIME_SCALE)}
    try:
        sup, servers, platform_env = start_platform(tmp_path, tmp_path / "cluster.csv", tmp_path / "policy.toml",
                                                    api_port=free_port(), extra_env=env)
        try:
            assert servers == []  # the cluster, not a server of the platform's own
            run = asyncio.run(drive(cluster, sup, stream_name, prefix, f"http://127.0.0.1:{sup.ports['admission']}"))
        finally:
            sup.stop()
    finally:
        cluster.stop()
    key = Path(platform_env["GPUSCHED_AUDIT_KEY_FILE"]).read_text().strip().encode()
    check(run, key, time.monotonic() - started, tmp_path)


def check(run: Run, key: bytes, wall_s: float, folder: Path) -> None:
    seen, outage = run.seen, run.outage
    result = judge(seen)  # lost, duplicated, over-allocated, quota, replay, read models, stuck
    events = seen.events
    accepted = sorted(seen.out.accepted)
    per_job = runs_per_job(events)
    final = {j for j in accepted if settled_final(seen, j)}
    # Decided while the server was down: submissions the log stored between the kill and the restart.
    during = [e.job_id for seq, e in events if isinstance(e, JobSubmitted)
              and outage.killed_at <= run.stored_at[seq] < outage.restarted_at]
    decided_during = Counter(type(e).__name__ for seq, e in events
                             if outage.elected_at <= run.stored_at[seq] < outage.restarted_at)
    stored_after_kill = sorted(ts for ts in run.stored_at.values() if ts >= outage.killed_at)
    placed_after_kill = sorted(run.stored_at[seq] for seq, e in events
                               if isinstance(e, JobPlaced) and run.stored_at[seq] >= outage.killed_at)
    figures = {
        "wall_s": round(wall_s, 1), "run_s": round(run.run_s, 1), "jobs": len(accepted),
        "states": result["states"], "killed": outage.node, "meta_leader_then": outage.meta_leader,
        "new_leader": outage.new_leader,
        "election_s": round(outage.elected_at - outage.killed_at, 2),
        "first_write_after_kill_s": round(stored_after_kill[0] - outage.killed_at, 2) if stored_after_kill else None,
        "first_placement_after_kill_s": (round(placed_after_kill[0] - outage.killed_at, 2)
                                         if placed_after_kill else None),
        "down_s": round(outage.restarted_at - outage.killed_at, 2),
        "caught_up_after_restart_s": round(outage.healthy_at - outage.restarted_at, 2),
        "observer_retries": outage.client_retries, "submitted_while_down": len(during),
        "decided_while_down": dict(decided_during), "service_restarts": dict(run.crash_restarts),
        "producer_retries": seen.out.retries, "replicas": run.replicas, "replicas_current": run.replicas_current,
        "events": result["events"], "decisions_replayed": result["decisions_replayed"],
    }
    (folder / "cluster-run.json").write_text(json.dumps(figures, indent=1))
    print("\nR3 failover:", json.dumps(figures))
    summary = json.dumps({**figures, **{k: result[k] for k in FAIL_KEYS}, "details": result["details"]})

    assert run.replicas == dict.fromkeys(run.replicas, 3), summary
    assert outage.done and outage.new_leader not in ("", outage.node), summary
    assert {k: result[k] for k in FAIL_KEYS if result[k]} == {}, summary
    assert len(accepted) == JOBS and final == set(accepted), summary
    assert result["states"].get("succeeded", 0) >= JOBS - 10, summary
    # Exactly once: each job submitted once (judge), finished at most once, and every placement but its last
    # ended in an eviction; a job that succeeded ran to its end once.
    for job in accepted:
        placed, evicted, finished = per_job.get(job, (0, 0, 0))
        assert finished <= 1 and placed - evicted in (0, 1), (job, per_job.get(job))
        if seen.views.jobs[job]["state"] == "succeeded":
            assert (placed - evicted, finished) == (1, 1), (job, per_job.get(job))
    # The platform kept deciding with one server of three gone: jobs came in and were placed meanwhile, and
    # every one of them reached its end.
    assert len(during) >= 10 and decided_during["JobPlaced"] >= 5, summary
    assert set(during) <= final, summary
    # The restarted server caught up: every copy of the stream is current again.
    assert run.replicas_current and all(ok for _, ok in run.replicas_current), summary
    # Every decision chain links up and the canonical form of each event holds (judge replayed them all).
    report = verify(seen.raw, key)
    assert report.ok and report.decisions == result["decisions_replayed"], report.as_json()


def settled_final(seen: Seen, job: str) -> bool:
    view = seen.views.jobs.get(job)
    return view is not None and view["state"] in FINAL_STATES

