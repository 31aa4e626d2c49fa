"""The order of a queue's waiting jobs, walked once per scheduling pass."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from libs.core.quota_nomination import in_queue
from libs.core.quota_state import QuotaJob

if TYPE_CHECKING:
    from libs.core.quota import QuotaDecider


class Order:
    """A queue's pending jobs in order: its nominated preemptors first, in nomination order (the quota their
    victims free is theirs: libs/core/quota_nomination.py), then priority, then the user holding least, then
    arrival. Robust to the job just yielded leaving the queue (being reserved) before the next is asked for;
    `skip_level` jumps to the next (lower) priority."""

    def __init__(self, decider: QuotaDecider, queue: str) -> None:
        self.d = decider
        self.queue = queue
        self.levels = sorted(decider.pending.get(queue, {}), reverse=True)
        self._skip = False
        self.first = in_queue(decider, queue)
        # The one walk over the queue, resumed by each call for the next head.
        self.walk = self._nominated_first() if self.first else self._jobs()

    def __iter__(self) -> Iterator[QuotaJob]:
        return self.walk

    def skip_level(self) -> None:
        self._skip = True

    def _nominated_first(self) -> Iterator[QuotaJob]:
        jobs = self.d.jobs
        for job_id in self.first:
            job = jobs.get(job_id)
            if job is not None and job.state == "pending":
                yield job
        self._skip = False
        first = set(self.first)
        for job in self._jobs():
            if job.job_id not in first:
                yield job

    def _jobs(self) -> Iterator[QuotaJob]:
        jobs = self.d.jobs
        for level in self.levels:
            self._skip = False
            users = self.d.pending.get(self.queue, {}).get(level, {})
            if len(users) != 1:
                yield from self._users(users)
                continue
            keys = next(iter(users.values()))
            i = 0
            while i < len(keys):
                job_id = keys[i][1]
                yield jobs[job_id]
                if self._skip:
                    break
                if i < len(keys) and keys[i][1] == job_id:
                    i += 1

    def _users(self, users: dict[str, list[tuple[int, str]]]) -> Iterator[QuotaJob]:
        """Round robin by GPUs held: the user holding least goes next, counting what this pass gives."""
        index = dict.fromkeys(users, 0)
        heap = [(self.d.user_used.get((self.queue, u), 0), keys[0][0], u) for u, keys in users.items() if keys]
        heapq.heapify(heap)
        while heap:
            used, _, user = heapq.heappop(heap)
            keys, i = users[user], index[user]
            if i >= len(keys):
                continue
            job = self.d.jobs[keys[i][1]]
            yield job
            if self._skip:
                return
            if i < len(keys) and keys[i][1] == job.job_id:
                i += 1  # it stays waiting: the user holds no more than before
            else:
                used += job.demand  # it was reserved: the user now holds more
            index[user] = i
            if i < len(keys):
                heapq.heappush(heap, (used, keys[i][0], user))
