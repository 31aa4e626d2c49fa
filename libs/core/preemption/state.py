"""What the preemption decider knows, as data: the jobs running (its victim candidates), the jobs waiting (its
preemptors), the evictions decided and not yet done, the indexes that keep clock ticks cheap, and (World) the
policy, cluster and retries it reads beside them."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.model import Cluster
from libs.core.kernel.attained_service import AttainedService
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.kernel.retries import RetryBook
from libs.core.kernel.usable_flavors import ModelCounts

# A job still running this long after its declared end has overrun its estimate (its executor's report of
# an end on time would have come by then): it is no longer about to end.
OVERRUN_S = 1.0
PLACEMENT = "placement"  # the waiting code of a job deferred by placement (it holds its quota)


@dataclass(slots=True)
class Running:
    job_id: str
    queue: str
    priority: int
    preemptible: bool
    demand: int
    started: float
    placements: tuple[ReplicaPlacement, ...]
    flavor: str = ANY
    over_budget: bool = False
    min_runtime_s: float = 0.0
    ends_at: float | None = None  # from its declared duration
    placed_order: int = 0  # breaks ties between jobs started at the same instant: later placed, first out
    checkpoints_on_stop: bool = False  # it saves its state when told to stop: evicting it loses nothing
    last_checkpoint: float | None = None

    def lost(self, now: float) -> float:
        """GPU-time (thousandths of GPU-seconds) an eviction now throws away: nothing for a job that
        checkpoints when stopped, else everything since its last checkpoint (or its start)."""
        if self.checkpoints_on_stop:
            return 0.0
        since = self.started if self.last_checkpoint is None else max(self.started, self.last_checkpoint)
        return (now - since) * self.demand

    def nodes(self) -> list[str]:
        """The nodes it runs on, each once, in replica order."""
        return list(dict.fromkeys(p.node for p in self.placements))


@dataclass(slots=True)
class Waiting:
    code: str  # the quota deferral's code, or "placement"
    since: float
    grace_checked: bool = False  # considered once its queue's reclaim grace was over?
    queue: str = ""
    priority: int = 0


@dataclass(slots=True)
class PreemptionState:
    specs: dict[str, JobSpec] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    # job -> (queue, flavor, milli, over budget) of its quota reservation
    reserved: dict[str, tuple[str, str, int, bool]] = field(default_factory=dict)
    # preemptor -> victims still being evicted; a victim -> its preemptor.
    in_flight: dict[str, list[str]] = field(default_factory=dict)
    victim_of: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    placing: dict[str, None] = field(default_factory=dict)  # the waiting jobs that wait for placement
    # job -> since when it waits for quota or GPUs (held by nothing else: not its user's limit, a budget or a
    # failure's backoff): a reclaim grace counts from there, whatever reservations came and went meanwhile.
    pending_since: dict[str, float] = field(default_factory=dict)
    # job -> when quota reserved it (for its placement timeout); jobs placement told capacity is held for.
    reserved_at: dict[str, float] = field(default_factory=dict)
    capacity_held: dict[str, None] = field(default_factory=dict)
    # queue -> priority -> how many of its jobs wait for quota at that priority
    waiting_priorities: dict[str, dict[int, int]] = field(default_factory=dict)
    cancelled: dict[str, None] = field(default_factory=dict)
    # Jobs whose run is over (finished, failed, evicted) while quota still holds their reservation: quota
    # releases it as it reads the report, so it is leaving its queue.
    ended: dict[str, None] = field(default_factory=dict)
    # victim -> the jobs it was evicted for: a victim never preempts any of its preemptors back.
    preempted_by: dict[str, dict[str, None]] = field(default_factory=dict)
    # queue -> [(when, GPUs in thousandths)] chosen for eviction, for the blast-radius budget.
    evicted: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    # Indexes of `waiting`, so that clock ticks need not scan every waiting job:
    # queue (of the job's spec) -> [(-priority, job id)] sorted: the queue's first waiting job, fast;
    heads: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    head_of: dict[str, tuple[str, tuple[int, str]]] = field(default_factory=dict)
    # queue -> [(waiting since, job id)] sorted, of the waiting jobs (for quota or placement) whose reclaim
    # grace has not been checked yet.
    grace: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    grace_of: dict[str, tuple[str, tuple[float, str]]] = field(default_factory=dict)
    # queue -> [(waiting since, job id)] sorted, of every waiting job: the queue's reclaim grace counts from
    # the first (grace_over).
    waits: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    wait_of: dict[str, tuple[str, tuple[float, str]]] = field(default_factory=dict)
    # queue -> when its unbroken wait began: it has had a job waiting (for quota or GPUs) ever since, whichever
    # of its jobs were served or came to wait meanwhile (the reclaim grace counts from there: grace_over). A
    # wait that ended goes on if a job of the queue waits again at that same instant (a job evicted for another
    # of its queue comes to wait as that one is served): queue -> (when it began, when it ended).
    queue_waits_since: dict[str, float] = field(default_factory=dict)
    queue_wait_ended: dict[str, tuple[float, float]] = field(default_factory=dict)
    clock: float = 0.0  # the time of the last event folded
    # `running` by queue (each queue's victim candidates, without scanning every running job).
    by_queue: dict[str, dict[str, Running]] = field(default_factory=dict)
    # queue -> priority -> how many of its jobs run at that priority
    running_priorities: dict[str, dict[int, int]] = field(default_factory=dict)
    # Protections that run out with time, so that a tick knows when to look again: a heap of (when a
    # running job's minimum runtime ends, job id), and the queues whose eviction budget grew back since.
    protected_until: list[tuple[float, str]] = field(default_factory=list)
    budget_freed: dict[str, None] = field(default_factory=dict)
    # GPU time each job held over its runs: a queue of least attained service evicts by it (kernel/attained_service.py)
    attained: AttainedService = field(default_factory=AttainedService)
    placed_count: int = 0  # placements folded so far: each run's placed_order
    # job -> when it was submitted: a queue whose jobs may evict newer jobs of their priority asks it
    submitted: dict[str, float] = field(default_factory=dict)
    changed: bool = False  # anything folded since the last tick's reconsideration?

    # --- waiting jobs ----------------------------------------------------------------------------

    def wait(self, job_id: str, queue: str, priority: int, code: str, now: float) -> None:
        """The job waits (again) with `code`, since it began waiting to run (`pending_since`)."""
        held = self.waiting.get(job_id)
        if held is not None:
            self.unwait(job_id)
        since = held.since if held is not None else self.pending_since.get(job_id, now)
        self.waiting[job_id] = Waiting(code, since, False, queue, priority)
        if code == PLACEMENT:
            self.placing[job_id] = None
        # index(), inline: the head and (for quota) grace indexes, then the waiting priorities.
        head = (-priority, job_id)
        self.head_of[job_id] = (queue, head)
        bisect.insort(self.heads.setdefault(queue, []), head)
        self.wait_of[job_id] = (queue, (since, job_id))
        bisect.insort(self.waits.setdefault(queue, []), (since, job_id))
        self._queue_waits(queue, since)
        entry = (since, job_id)  # a job waiting for placement may reclaim GPUs too (reclaim.placement_victims)
        self.grace_of[job_id] = (queue, entry)
        bisect.insort(self.grace.setdefault(queue, []), entry)
        if code != PLACEMENT:
            counts = self.waiting_priorities.setdefault(queue, {})
            counts[priority] = counts.get(priority, 0) + 1

    def grace_over(self, job_id: str, reclaim_after_s: float, now: float) -> bool:
        """Is the reclaim grace of the waiting job's queue over? The grace is the queue's: it counts from when
        the queue began its unbroken wait (queue_waits_since), so neither a job that comes to wait ahead of
        others nor its earliest waiting job served while others still wait (one of its own evicted to make room
        for it, say) starts it again (the reclaim bound a lender is owed counts so too)."""
        entry = self.wait_of.get(job_id)
        since = self.queue_waits_since[entry[0]] if entry is not None else self.waiting[job_id].since
        return now >= since + reclaim_after_s

    def _queue_waits(self, queue: str, since: float) -> None:
        """A job of the queue waits since `since`: the queue's unbroken wait began then at the latest (earlier
        if it goes on from a wait that ended at this instant)."""
        began = self.queue_waits_since.get(queue)
        if began is None:
            ended = self.queue_wait_ended.pop(queue, None)
            began = ended[0] if ended is not None and ended[1] == self.clock else since
        self.queue_waits_since[queue] = min(began, since)

    def index(self, job_id: str, queue: str, priority: int, grace: bool) -> None:
        """Enter a waiting job into the indexes (`grace`: among those whose reclaim grace is unchecked)."""
        self.head_of[job_id] = _sorted_in(self.heads, queue, (-priority, job_id))
        since = (self.waiting[job_id].since, job_id)
        self.wait_of[job_id] = _sorted_in(self.waits, queue, since)
        self._queue_waits(queue, since[0])
        if grace:
            self.grace_of[job_id] = _sorted_in(self.grace, queue, since)

    def unindex(self, job_id: str) -> None:
        _sorted_out(self.heads, self.head_of.pop(job_id, None))
        entry = self.wait_of.pop(job_id, None)
        _sorted_out(self.waits, entry)
        if entry is not None and entry[0] not in self.waits:  # its last waiting job: the queue's wait is over
            began = self.queue_waits_since.pop(entry[0], None)
            if began is not None:
                self.queue_wait_ended[entry[0]] = (began, self.clock)
        self.ungrace(job_id)

    def ungrace(self, job_id: str) -> None:
        _sorted_out(self.grace, self.grace_of.pop(job_id, None))

    def unwait(self, job_id: str) -> None:
        held = self.waiting.pop(job_id, None)
        if held is None:
            return
        self.placing.pop(job_id, None)
        self.unindex(job_id)
        if held.code != PLACEMENT:
            counts = self.waiting_priorities[held.queue]
            counts[held.priority] -= 1
            if not counts[held.priority]:
                del counts[held.priority]

    def rerank(self, policy: PolicyBook) -> None:
        """Priority classes changed: running and waiting jobs take their class's new value."""
        self.running_priorities = {}
        for run in self.running.values():
            spec = self.specs.get(run.job_id)
            if spec is not None:
                run.priority = policy.priority_of(spec)
                run.preemptible = policy.preemptible(spec) or run.over_budget
            counts = self.running_priorities.setdefault(run.queue, {})
            counts[run.priority] = counts.get(run.priority, 0) + 1
        self.waiting_priorities = {}
        self.heads, self.head_of = {}, {}
        for job_id in list(self.waiting):
            waiting = self.waiting[job_id]
            if job_id in self.specs:
                waiting.priority = policy.priority_of(self.specs[job_id])
            if waiting.code != PLACEMENT:
                counts = self.waiting_priorities.setdefault(waiting.queue, {})
                counts[waiting.priority] = counts.get(waiting.priority, 0) + 1
            if job_id in self.specs:
                spec = self.specs[job_id]
                head = (spec.queue, (-policy.priority_of(spec), job_id))
                self.head_of[job_id] = head
                self.heads.setdefault(head[0], []).append(head[1])
        for keys in self.heads.values():
            keys.sort()

    # --- running jobs ----------------------------------------------------------------------------

    def run(self, run: Running) -> None:
        """The job runs (a job placed again replaces its earlier run)."""
        held = self.running.get(run.job_id)
        if held is not None:
            self.unindex_running(held)
        self.running[run.job_id] = run
        self.by_queue.setdefault(run.queue, {})[run.job_id] = run
        counts = self.running_priorities.setdefault(run.queue, {})
        counts[run.priority] = counts.get(run.priority, 0) + 1
        if run.min_runtime_s > 0:
            heapq.heappush(self.protected_until, (run.started + run.min_runtime_s, run.job_id))
        if run.ends_at is not None:  # still running then, it overran its estimate: no longer about to end
            heapq.heappush(self.protected_until, (run.ends_at + OVERRUN_S, run.job_id))

    def unindex_running(self, run: Running) -> None:
        jobs = self.by_queue[run.queue]
        del jobs[run.job_id]
        if not jobs:
            del self.by_queue[run.queue]
        counts = self.running_priorities[run.queue]
        counts[run.priority] -= 1
        if not counts[run.priority]:
            del counts[run.priority]
            if not counts:
                del self.running_priorities[run.queue]

    def holding_lent(self, book: QuotaBook, lender: str, flavor: str | None = None) -> Iterator[Running]:
        """The running jobs, of the flavor (None: of any), that hold what the lender's queue lent
        (QuotaBook.holders_of_lent, holds_lent), nearest level first."""
        for queue in book.holders_of_lent(lender):
            for run in self.by_queue.get(queue, {}).values():
                if (flavor is None or run.flavor == flavor) and book.holds_lent(lender, queue, run.flavor,
                                                                                run.over_budget):
                    yield run

    def lent_to(self, book: QuotaBook, lender: str, flavor: str) -> Iterator[tuple[int, int]]:
        """The running jobs of the flavor that hold what the lender's queue lent (holding_lent), each as its priority
        and its quota: what its flavor fungibility asks about (kernel/queue_policies.py flavors_in_turn)."""
        return ((run.priority, run.demand) for run in self.holding_lent(book, lender, flavor))

    def unprotected(self, now: float) -> list[str]:
        """The queues (sorted) of running jobs whose minimum runtime ended, that overran their declared end or
        (least attained service) passed their queue's threshold, by `now` since last asked, and of queues whose
        eviction budget grew back: new victims may be found there."""
        queues = dict(self.budget_freed)
        self.budget_freed = {}
        heap = self.protected_until
        while heap and heap[0][0] <= now:
            _, job_id = heapq.heappop(heap)
            run = self.running.get(job_id)
            if run is not None:  # ended since: it protects nobody
                queues[run.queue] = None
        return sorted(queues)


@dataclass(slots=True)
class World:
    """Everything the preemption decider folds and decides from: its jobs (`state`), the policy (priority classes,
    queues and their quota book, settings), the cluster's nodes and free GPUs, and the retries of failed jobs."""

    state: PreemptionState = field(default_factory=PreemptionState)
    policy: PolicyBook = field(default_factory=PolicyBook)
    cluster: Cluster = field(default_factory=Cluster)
    retries: RetryBook = field(default_factory=RetryBook)
    # The healthy GPUs of each model: which of its queue's flavors a job can use (kernel/usable_flavors.py).
    models: ModelCounts = field(default_factory=ModelCounts)


def _sorted_in(index: dict[str, list[Any]], queue: str, key: Any) -> tuple[str, Any]:
    """Insert `key` in the queue's sorted list of the index; the entry that takes it out again."""
    bisect.insort(index.setdefault(queue, []), key)
    return queue, key


def _sorted_out(index: dict[str, list[Any]], entry: tuple[str, Any] | None) -> None:
    """Take an entry (from `_sorted_in`) out of its queue's sorted list, and the list once empty."""
    if entry is None:
        return
    keys = index[entry[0]]
    keys.pop(bisect.bisect_left(keys, entry[1]))
    if not keys:
        del index[entry[0]]
