"""The node agent enforces a job's `max_runtime_s` on its real processes: stopped at the limit (SIGTERM, then
SIGKILL after the class's grace) and reported failed with reason RUNTIME_LIMIT, as the simulated executor does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contracts import (
    RUNTIME_LIMIT,
    RUNTIME_LIMIT_EXIT_CODE,
    EventBase,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSpec,
    JobSubmitted,
    ReplicaPlacement,
)
from services.agent.executor import ProcessExecutor

JOB = "j"


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ProcessExecutor, list[EventBase]]:
    agent = ProcessExecutor(node="n0", workdir=tmp_path)
    agent.grace = {"training": 0.5}
    published: list[EventBase] = []

    async def publish(reports: list[EventBase]) -> None:
        published.extend(reports)

    monkeypatch.setattr(agent, "_publish", publish)
    return agent, published


def _place(agent: ProcessExecutor, spec: JobSpec) -> None:
    agent.on_event(1, JobSubmitted(id="s", ts=0.0, source="admission", job_id=JOB, spec=spec))
    agent.on_event(2, JobPlaced(id="p1", ts=0.0, source="placement", job_id=JOB,
                                placements=(ReplicaPlacement(replica=0, node="n0", gpu_indices=(0,),
                                                             gpu_milli=1000),)))


async def _ended(published: list[EventBase], within_s: float = 10.0) -> EventBase:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ends = [e for e in published if isinstance(e, JobFinished | JobFailed)]
        if ends:
            return ends[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no end reported: {published}")


async def test_the_agent_stops_a_run_at_its_runtime_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, published = _agent(tmp_path, monkeypatch)
    began = time.monotonic()
    _place(agent, JobSpec(team="a", queue="a", gpus=1, command=("sleep", "30"), duration_s=1.0, max_runtime_s=0.3))
    failed = await _ended(published)
    assert isinstance(failed, JobFailed)
    assert (failed.reason, failed.exit_code, failed.run) == (RUNTIME_LIMIT, RUNTIME_LIMIT_EXIT_CODE, "p1")
    assert 0.3 <= time.monotonic() - began < 5.0
    assert JOB not in agent.placed and agent.running() == 0


async def test_a_run_within_its_limit_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, published = _agent(tmp_path, monkeypatch)
    _place(agent, JobSpec(team="a", queue="a", gpus=1, command=("sleep", "0.05"), max_runtime_s=5.0))
    assert isinstance(await _ended(published), JobFinished)
