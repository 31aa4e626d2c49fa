"""Invariants checked from the log alone: no GPU share, GPU memory, CPU or memory allocated beyond
capacity at any point, and every job's final state."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, JobEvicted, JobFailed, JobFinished, JobPlaced, NodeRegistered, ReplicaPlacement
from libs.core.cluster import Cluster

FINAL_EVENTS = (JobFinished, JobFailed)


def overallocations(events: Iterable[tuple[int, EventBase]]) -> list[str]:
    """Fold allocations in log order; report every moment some capacity went below zero or above full."""
    cluster = Cluster()
    live: dict[str, tuple[ReplicaPlacement, ...]] = {}
    problems: list[str] = []
    for seq, event in events:
        if isinstance(event, NodeRegistered):
            cluster.register(event.node)
        elif isinstance(event, JobPlaced):
            if event.job_id in live:
                problems.append(f"seq {seq}: job {event.job_id} placed twice without being released")
            live[event.job_id] = event.placements
            cluster.allocate(event.placements)
            for p in event.placements:
                node = cluster.nodes[p.node]
                if node.free_cpu_milli < 0 or node.free_memory_mib < 0:
                    problems.append(f"seq {seq}: node {p.node} CPU or memory over capacity")
                for idx in p.gpu_indices:
                    g = node.gpu(idx)
                    if g.free_milli < 0 or g.free_memory_mib < 0:
                        problems.append(f"seq {seq}: GPU {p.node}/{idx} over capacity ({g.free_milli} milli free)")
        elif isinstance(event, JobFinished | JobFailed | JobEvicted):
            placements = live.pop(event.job_id, None)
            if placements is not None:
                cluster.release(placements)
    return problems
