"""Executor report ids: derived from the run (the JobPlaced event id) and what happened, and the same
whoever reports it. When a node is lost, node-telemetry reports its jobs evicted on the agent's behalf; if
the agent reports too, or an agent of another replica does, the server keeps only the first."""

from __future__ import annotations

from libs.core.kernel.decider import derived_id

EXECUTOR = "executor"


def report_id(run_id: str, what: str) -> str:
    return derived_id(EXECUTOR, run_id, what)
