"""The fair order: across the queues of a scheduling cycle, which queue's head goes next (its order key: a
nominated preemptor first, then jobs within their queue's nominal quota, then the queue furthest below its
fair share level by level down the queue tree, then priority, arrival and id), and inside a queue the order
of its waiting jobs, read once per cycle."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from libs.core.kernel.quota_figures import fair_share
from libs.core.quota.fit import entitled, flavors_of, over_budget
from libs.core.quota.nomination import in_queue
from libs.core.quota.state import Cycle, QuotaJob, QuotaState

EPOCHS_PER_HALF_LIFE = 1024


def fair_key(state: QuotaState, queue: str, now: float) -> tuple[float, ...]:
    """The queue's fair shares level by level, from the root of its tree down to it."""
    spec = state.policy.queues.get(queue)
    if spec is None or not spec.parent:
        return (fair_share(state, queue, now),)  # (most queues: no tree above)
    path = [queue]
    while (parent := state.policy.queues[path[-1]].parent if path[-1] in state.policy.queues else ""):
        path.append(parent)
    return tuple(fair_share(state, q, now) for q in reversed(path))


def order_key(state: QuotaState, job: QuotaJob, cycle: Cycle) -> tuple[object, ...]:
    """The job's place among the heads of a cycle's queues: the smallest key goes first. Compared, in turn:
      1. a nominated preemptor first: the quota its victims free is its;
      2. then a job within its queue's nominal quota (entitled) before one that must borrow; a queue whose
         head must borrow still ranks as entitled when a smaller job of the head's priority fits its nominal
         quota: that job comes right after the head fails, and quota freed for it (say by a reclaim) must not
         go to a borrower meanwhile;
      3. then the queue furthest below its fair share, level by level down the queue tree (fair_key);
      4. then higher priority;
      5. then earlier arrival;
      6. then the job id: no two jobs tie.
    Kept in the cycle until it reserves (a reservation changes usage)."""
    key = cycle.keys.get(job.job_id)
    if key is None:
        key = cycle.keys[job.job_id] = (job.job_id not in state.nominated,
                                        not (entitled(state, job, cycle) or level_entitled(state, job, cycle)),
                                        cycle_fair_key(state, job.queue, cycle), -job.priority, job.arrival,
                                        job.job_id)
    return key


def cycle_fair_key(state: QuotaState, queue: str, cycle: Cycle) -> tuple[float, ...]:
    key = cycle.fair.get(queue)
    if key is None:
        key = cycle.fair[queue] = fair_key(state, queue, fair_epoch(state, cycle.now))
    return key


def fair_epoch(state: QuotaState, now: float) -> float:
    """The instant the fair order reads decayed usage at: the start of the current epoch, a 1024th of the
    half-life long (about ten minutes for a week). Between two epochs a queue's place in the fair order then
    changes only when its own usage does, so a cycle can keep what it found of the queues nothing changed
    (shortcuts/kept_heads.py); decay over a 1024th of a half-life moves a share by under 0.07 %. (Slurm likewise
    recomputes fair-share priorities periodically, not per event.)"""
    half_life = state.policy.settings.fair_share_half_life_s
    if half_life <= 0:
        return now
    step = half_life / EPOCHS_PER_HALF_LIFE
    return math.floor(now / step) * step


def level_entitled(state: QuotaState, job: QuotaJob, cycle: Cycle) -> bool:
    if over_budget(state, job.queue, cycle) or not state.book.governed(job.queue):
        return False
    smallest = min(state.demands.get((job.queue, job.priority), {job.demand: 0}))
    return any(state.book.nominal_left(job.queue, f) >= smallest for f in flavors_of(state, job))


class Order:
    """A queue's waiting jobs in order, the first job first:
      1. its nominated preemptors, in nomination order (the quota their victims free is theirs:
         libs/core/quota/nomination.py);
      2. then higher priority;
      3. then, within a priority, the user holding fewest GPUs in the queue (counting what this cycle gives);
      4. then, within a user, earlier arrival, then the job id.
    Read once per cycle, resumed by each call for the next head, and robust to the job just yielded leaving
    the queue (being reserved) before the next is asked for; `skip_level` jumps to the next (lower) priority."""

    def __init__(self, state: QuotaState, queue: str) -> None:
        self.state = state
        self.queue = queue
        self.levels = sorted(state.pending.get(queue, {}), reverse=True)
        self._skip = False
        self.first = in_queue(state, queue)
        self.remaining = self._nominated_first() if self.first else self._jobs()

    def __iter__(self) -> Iterator[QuotaJob]:
        return self.remaining

    def skip_level(self) -> None:
        self._skip = True

    def _nominated_first(self) -> Iterator[QuotaJob]:
        jobs = self.state.jobs
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
        jobs = self.state.jobs
        for level in self.levels:
            self._skip = False
            users = self.state.pending.get(self.queue, {}).get(level, {})
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
        """Round robin by GPUs held: the user holding least goes next, counting what this cycle gives."""
        index = dict.fromkeys(users, 0)
        heap = [(self.state.user_used.get((self.queue, u), 0), keys[0][0], u) for u, keys in users.items() if keys]
        heapq.heapify(heap)
        while heap:
            used, _, user = heapq.heappop(heap)
            keys, i = users[user], index[user]
            if i >= len(keys):
                continue
            job = self.state.jobs[keys[i][1]]
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
