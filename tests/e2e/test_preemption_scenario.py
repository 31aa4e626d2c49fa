"""Reclaim with checkpoints, on the whole platform (real NATS and Redis, six processes): team A borrows the
whole 16-GPU cluster with low-priority work, some of it checkpointing; team B, in the same cohort, then asks
for its nominal quota back. B's jobs start soon after their submission (not when A's jobs end), only A's
jobs are evicted and no more GPUs than B needs; the victims that checkpoint lose only what they ran while
writing their checkpoint and resume where they stopped, the others lose their run (and the ledger says exactly
that); in the end every job succeeds and the log replays, within quota and without over-allocation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts import (
    EventBase,
    JobCheckpointed,
    JobEvicted,
    JobFinished,
    JobStarted,
    PreemptionDecided,
    SubmitJob,
)
from contracts.codec import decode
from libs.audit.invariants import overallocations
from libs.audit.log_reader import read_log
from libs.audit.quota_audit import quota_violations
from libs.audit.replay import replay
from libs.bus.jetstream import Bus, BusConfig
from libs.cli.client import Client
from libs.runtime.embedded import EmbeddedServer, free_port
from libs.runtime.platform import start_platform
from libs.runtime.supervisor import Supervisor
from libs.sim.executor import SIM_CHECKPOINT_S
from tests.e2e.waiting import wait_for

pytestmark = pytest.mark.e2e


TICK_S = 1.0
CHECKPOINT_WRITE_S = 0.5
A_DURATION_S = 20.0  # long enough that B's jobs come and go while A's victims are still short of done
B_DURATION_S = 3.0
CHECKPOINT_EVERY_S = 5.0
# How long a few hops through the pipeline may take on a loaded machine (some of them through services that run
# at a lower CPU priority): from B's submission to a victim's executor, from the victims' ends to B's start.
# Far less than the ~18 s left of A's jobs when B arrives: waiting for them to end would still fail the checks.
PIPELINE_SLACK_S = 5.0
A_GPUS, B_GPUS = 2, 4
# Which of A's jobs (a-0..a-7, placed two to a node in order) checkpoint. Victims that lose nothing come first,
# so with half of them checkpointing every victim would be one (or, with one per node, reclaim finds nothing
# to evict at all: see tests/unit/core/preemption/test_reclaim_on_a_fragmented_cohort.py). Three, two of them
# sharing a node, make b-0 evict a node of checkpointing jobs and b-1 the node of a-6 (checkpoints) and a-7 (does not).
CHECKPOINTING = frozenset({2, 3, 6})

CLUSTER = """sn,cpu_milli,memory_mib,gpu,model
pre-0,64000,262144,4,A100
pre-1,64000,262144,4,A100
pre-2,64000,262144,4,A100
pre-3,64000,262144,4,A100
"""

POLICY = """
[settings]
preempt_min_remaining_s = 0.0   # any running job may be a victim, however close to its end

[[queues]]
name = "org"
team = "org"

[[queues]]
name = "a"
team = "a"
parent = "org"
nominal_gpus = 8
borrowing_limit_gpus = 8

[[queues]]
name = "b"
team = "b"
parent = "org"
nominal_gpus = 8
reclaim_after_s = 0.0   # no grace: B reclaims its lent quota at once
"""


@dataclass
class Platform:
    sup: Supervisor
    client: Client
    bus: BusConfig
    dump: Path  # where a failing test leaves the log


@pytest.fixture
def platform(tmp_path: Path, nats_server: EmbeddedServer, redis_server: EmbeddedServer,
             stream_name: str) -> Iterator[Platform]:
    (tmp_path / "cluster.csv").write_text(CLUSTER)
    (tmp_path / "policy.toml").write_text(POLICY)
    env = {"GPUSCHED_STREAM": stream_name, "GPUSCHED_SUBJECT_PREFIX": stream_name.lower(),
           "GPUSCHED_TICK_SECONDS": str(TICK_S)}
    with pytest.MonkeyPatch.context() as mp:  # start_platform uses the session's servers when these are set
        mp.setenv("NATS_URL", nats_server.url)
        mp.setenv("REDIS_URL", redis_server.url)
        sup, servers, _ = start_platform(tmp_path, tmp_path / "cluster.csv", tmp_path / "policy.toml",
                                         api_port=free_port(), extra_env=env)
    assert servers == []
    try:
        client = Client(f"http://127.0.0.1:{sup.ports['admission']}")
        wait_for(lambda: len(client.nodes()) == 4 and len(client.queues()) == 3, "the cluster never registered")
        yield Platform(sup, client, BusConfig(url=nats_server.url, stream=stream_name,
                                              subject_prefix=stream_name.lower()), tmp_path / "log.jsonl")
    finally:
        sup.stop()


def all_in(client: Client, ids: list[str], state: str) -> bool:
    """Are all these jobs (each of them listed already) in `state`?"""
    now = {j["id"]: j["state"] for j in client.jobs(limit=1000) if j["id"] in ids}
    return len(now) == len(ids) and set(now.values()) == {state}


def read_events(bus: BusConfig) -> tuple[list[tuple[int, bytes]], list[tuple[int, EventBase]]]:
    async def read() -> list[tuple[int, bytes]]:
        b = await Bus.connect(bus)
        try:
            return await read_log(b)
        finally:
            await b.close()

    raw = asyncio.run(read())
    return raw, [(seq, decode(data)) for seq, data in raw]


def describe(events: list[tuple[int, EventBase]], names: dict[str, str]) -> str:
    """The jobs' part of the log, one line an event, for a failing assertion's message."""
    lines = []
    for seq, e in events:
        job = getattr(e, "job_id", None) or getattr(e, "preemptor_id", None)
        if job is None:
            continue
        extra = ""
        if isinstance(e, PreemptionDecided):
            extra = f" {e.code} victims={[names.get(v.job_id, v.job_id) for v in e.victims]}"
        elif isinstance(e, JobEvicted | JobCheckpointed):
            extra = f" progress={e.progress_s}"
        elif code := getattr(e, "code", ""):
            extra = f" {code}"
        lines.append(f"{seq:4d} {e.ts:.3f} {type(e).__name__:18s} {names.get(job, job)}{extra}")
    return "\n".join(lines)


@dataclass
class Run:
    started: float
    ended: float | None = None
    how: str = ""  # "finished" | "evicted"
    progress_s: float = 0.0


def runs_of(events: list[tuple[int, EventBase]]) -> dict[str, list[Run]]:
    """Each job's runs, from the executor's reports in the log."""
    runs: dict[str, list[Run]] = {}
    for _, e in events:
        if isinstance(e, JobStarted):
            runs.setdefault(e.job_id, []).append(Run(started=e.ts))
        elif isinstance(e, JobFinished | JobEvicted):
            assert runs.get(e.job_id), f"{e.job_id} ended before it started"
            run = runs[e.job_id][-1]
            assert run.ended is None, f"{e.job_id} ended twice"
            run.ended, run.how = e.ts, "finished" if isinstance(e, JobFinished) else "evicted"
            if isinstance(e, JobEvicted):
                run.progress_s = e.progress_s
    return runs


def test_reclaim_evicts_only_what_b_needs_and_checkpointing_victims_lose_nothing(platform: Platform) -> None:
    client = platform.client
    names: dict[str, str] = {}
    checkpoints: dict[str, bool] = {}

    # 1. Team A borrows the whole cluster: 8 x 2 GPUs, its nominal 8 and 8 borrowed from b.
    a_ids = []
    for i in range(8):
        spec: dict[str, Any] = {"team": "a", "queue": "a", "gpus": A_GPUS, "priority": "batch",
                                "duration_s": A_DURATION_S, "name": f"a-{i}"}
        if i in CHECKPOINTING:
            # It checkpoints, and writing the checkpoint takes half a second once it is told to stop (well
            # within the class's grace): the executor stops it when the checkpoint is written.
            spec["checkpoint_interval_s"] = CHECKPOINT_EVERY_S
            spec["labels"] = {SIM_CHECKPOINT_S: str(CHECKPOINT_WRITE_S)}
        job_id = client.submit(spec)["id"]
        a_ids.append(job_id)
        names[job_id], checkpoints[job_id] = f"a-{i}", i in CHECKPOINTING
    wait_for(lambda: all_in(client, a_ids, "running"), "A's eight jobs never all ran")
    nodes = [{p["node"] for p in client.job(j)["placements"]} for j in a_ids]
    if any(len(nodes[i]) != 1 or nodes[i] != nodes[i + 1] for i in range(0, 8, 2)):
        pytest.fail(f"precondition: A's jobs are placed two to a node in submission order, got {nodes}")
    time.sleep(2.0)  # the victims have run a while: there is progress to save, or to lose

    # 2. Team B asks for its nominal quota back: 2 x 4 GPUs, i.e. two whole nodes.
    b_ids = []
    for i in range(2):
        job_id = client.submit({"team": "b", "queue": "b", "gpus": B_GPUS, "priority": "training",
                                "duration_s": B_DURATION_S, "name": f"b-{i}"})["id"]
        b_ids.append(job_id)
        names[job_id] = f"b-{i}"
    all_ids = a_ids + b_ids

    def save_log() -> tuple[list[tuple[int, bytes]], list[tuple[int, EventBase]]]:
        raw, events = read_events(platform.bus)
        platform.dump.write_bytes(b"\n".join(b"%d %s" % (seq, data) for seq, data in raw))
        return raw, events

    wait_for(lambda: all_in(client, b_ids, "succeeded"),
             lambda: "B's jobs never succeeded:\n" + describe(save_log()[1], names), timeout=20.0, every=0.2)
    # 3. A's victims run again once B is done; every job ends well.
    wait_for(lambda: all_in(client, all_ids, "succeeded"),
             lambda: "not every job succeeded:\n" + describe(save_log()[1], names), timeout=A_DURATION_S + 20.0,
             every=0.3)
    views = {j: client.job(j) for j in all_ids}

    def usage_of_a() -> dict[str, Any]:
        usage: dict[str, Any] = {u["team"]: u for u in client.usage()}.get("a", {})
        return usage if usage.get("jobs_finished") == 8 else {}

    usage = wait_for(usage_of_a, "team a's usage never counted its eight jobs")
    raw, events = save_log()
    log = describe(events, names)

    # --- B's jobs start soon after their submission: within a clock tick, the victims' checkpoint writes and
    # the pipeline's latency, not when A's jobs end.
    submitted = {e.job_id: e.ts for _, e in events if isinstance(e, SubmitJob)}
    runs = runs_of(events)
    bound = TICK_S + CHECKPOINT_WRITE_S + PIPELINE_SLACK_S
    for job_id in b_ids:
        assert len(runs[job_id]) == 1, log
        waited = runs[job_id][0].started - submitted[job_id]
        assert 0 <= waited <= bound, f"{names[job_id]} started {waited:.2f} s after submission\n{log}"
        view = views[job_id]
        assert view["started_at"] - view["submitted_at"] <= bound, view

    # --- Reclaim took only A's jobs, and no more GPUs than B needed.
    decisions = [e for _, e in events if isinstance(e, PreemptionDecided)]
    assert decisions, log
    assert all(d.code == "reclaim" for d in decisions), log
    assert {d.preemptor_id for d in decisions} <= set(b_ids), log
    victims = [v for d in decisions for v in d.victims]
    assert all(v.job_id in a_ids and v.queue == "a" and v.reason == "reclaim" for v in victims), log
    assert len({v.job_id for v in victims}) == len(victims), f"a job chosen twice\n{log}"
    assert sum(v.gpu_milli for v in victims) <= 2 * B_GPUS * 1000, log
    victim_ids = {v.job_id for v in victims}
    told_at = {v.job_id: d.ts for d in decisions for v in d.victims}  # when each victim was told to stop
    assert {e.job_id for _, e in events if isinstance(e, JobEvicted)} == victim_ids, log
    for job_id in set(a_ids) - victim_ids:  # the others ran once, undisturbed
        assert [r.how for r in runs[job_id]] == ["finished"], log
    # The scenario is the one intended: victims of both kinds (see CHECKPOINTING).
    assert {checkpoints[j] for j in victim_ids} == {True, False}, log

    # --- What each victim kept: one that checkpoints its whole run up to when it was told to stop, one that
    # does not nothing. What a victim loses is measured from the log: how long it went on after it was told to
    # stop depends on how fast the decision reached the executor, not only on the checkpoint's write time.
    checkpointed = {e.job_id for _, e in events if isinstance(e, JobCheckpointed)}
    lost = 0.0
    for job_id in sorted(victim_ids):
        first, again = runs[job_id]  # evicted once, then ran to its end
        assert (first.how, again.how) == ("evicted", "finished"), log
        assert first.ended is not None and again.ended is not None
        ran, name = first.ended - first.started, names[job_id]
        assert views[job_id]["evictions"] == 1, views[job_id]
        if checkpoints[job_id]:
            assert job_id in checkpointed, f"{name} did not checkpoint\n{log}"
            # Its checkpoint holds its whole run up to the moment it was told to stop ...
            kept = told_at[job_id] - first.started
            assert first.progress_s == pytest.approx(kept, abs=0.05), \
                f"{name}: progress {first.progress_s} s, told to stop {kept:.3f} s into a run of {ran:.3f} s"
            # ... and it stopped once that checkpoint was written: not before, nor long after.
            writing = first.ended - told_at[job_id]
            assert CHECKPOINT_WRITE_S - 0.05 <= writing <= CHECKPOINT_WRITE_S + PIPELINE_SLACK_S, \
                f"{name} stopped {writing:.3f} s after it was told to\n{log}"
            # Only what it ran after it was told to stop (while writing its checkpoint) is lost.
            lost += writing * A_GPUS
            assert views[job_id]["lost_gpu_seconds"] == pytest.approx(writing * A_GPUS, abs=0.1), views[job_id]
            # It resumed: its second run did only what was left of its work.
            left = A_DURATION_S - first.progress_s
            assert abs(again.ended - again.started - left) <= 1.5, f"{name}: {again} for the {left:.3f} s left"
        else:
            assert job_id not in checkpointed, log
            assert first.progress_s == 0.0, log
            lost += ran * A_GPUS
            assert views[job_id]["lost_gpu_seconds"] == pytest.approx(ran * A_GPUS, abs=2.0 * A_GPUS)
            assert abs(again.ended - again.started - A_DURATION_S) <= 1.5, f"{name} started over: {again}"
    # The GPU time lost is the non-checkpointing victims' runs, and what the others ran while checkpointing.
    assert usage["lost_gpu_seconds"] == pytest.approx(lost, abs=0.1), (usage, lost)

    # --- Every job succeeded, by the API and by the log; the log replays and kept every limit.
    assert {e.job_id for _, e in events if isinstance(e, JobFinished) and e.exit_code == 0} == set(all_ids)
    assert overallocations(events) == []
    assert quota_violations(e for _, e in events) == []
    report = replay(raw)
    assert report.decisions_checked > 0
    assert report.mismatches == []
