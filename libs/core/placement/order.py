"""The orders placement takes jobs in: the waiting jobs for a place, the waiting jobs by how long they waited
(who may starve), and the nominated preemptors."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

WaitKey = tuple[int, int, str]  # (-priority, reservation order, job id)


def wait_key(priority: int, reservation: int, job_id: str) -> WaitKey:
    """The place of a waiting job in the order a pass tries them, smallest first:
      1. higher priority first;
      2. then the earlier reservation of quota (quota reserves in its fair order, which placement keeps);
      3. then the job id (reservations are numbered uniquely, so this only makes the key total).
    Kept as a tuple: it is part of the snapshot, and tuples compare in exactly this order."""
    return (-priority, reservation, job_id)


def longest_waiting_first(waiting_since: dict[str, float], waiting: dict[str, WaitKey]
                          ) -> Iterator[tuple[float, str]]:
    """The waiting jobs as (since, job), ordered only as far as they are read (a heap: the starvation walk stops
    at the first job that could starve, or that has not waited long enough):
      1. the longest waiting first (the earliest reservation of quota);
      2. then the job id."""
    waits = [(waiting_since[job_id], job_id) for job_id in waiting]
    heapq.heapify(waits)
    while waits:
        yield heapq.heappop(waits)
