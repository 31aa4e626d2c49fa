"""The scheduling cycle over a group of queues (a cohort, or a queue without one), read as Kueue's schedule():
take a view of what holds for the whole cycle, pick the queues to look at, decide what holds back borrowers,
then take the queues' heads in fair order and try each, until no queue has a job worth trying. A job that gets
no quota is told why, once; so are the jobs skipped on the way to a queue's next head (libs/core/quota/next_head.py).
Quota only shrinks during a cycle, so what failed stays failed until the cycle ends."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from libs.core.kernel.decider import Decisions
from libs.core.kernel.policy import runtime_bound
from libs.core.quota.next_head import next_head
from libs.core.quota.nomination import nominees
from libs.core.quota.order import Order, order_key
from libs.core.quota.reclaim import lent_out
from libs.core.quota.reserve import try_reserve
from libs.core.quota.shortcuts.kept_failures import failures_stand, keep_failures
from libs.core.quota.shortcuts.kept_heads import backing_off_queues, keep_head, kept_head, may_keep_head
from libs.core.quota.shortcuts.ranked_queues import RankedEntry, rank_cohort, still_in_place
from libs.core.quota.shortcuts.skipped_queues import cohort_full, lent_only, skippable
from libs.core.quota.starvation import find_starving
from libs.core.quota.state import Cycle, QuotaJob, QuotaState

OrderKey = tuple[object, ...]


def schedule(state: QuotaState, group: list[str], now: float, out: Decisions) -> None:
    """A scheduling cycle over the group's queues, its decisions emitted to `out`; again while a cycle held
    jobs for a starving job that it then reserved: that hold ended inside the cycle, and the jobs it held would
    otherwise wait for a trigger that may never come."""
    while held_for_a_job_reserved(state, one_cycle(state, group, now, out)):
        pass


def held_for_a_job_reserved(state: QuotaState, cycle: Cycle) -> bool:
    starving = cycle.starving
    return cycle.held_for_starving_job and starving is not None and starving.state != "pending"


def one_cycle(state: QuotaState, group: list[str], now: float, out: Decisions) -> Cycle:
    """One scheduling cycle over the group's queues; what it learned."""
    # 1. Take a view of what holds for the whole cycle: the nominated preemptors, the starving job, the queues
    #    with a job backing off, the group's cohort, and whether a single queue waits in it.
    cycle = take_view(state, group, now)
    # 2. Pick the queues to rank now: a queue without a cohort is alone; a cohort's queues kept ranked from
    #    earlier cycles (shortcuts/ranked_queues.py) come ranked already, and wait for no lent quota.
    if cycle.cohort:
        to_rank = rank_cohort(state, cycle.cohort, cycle, out)
    else:
        to_rank = [queue for queue in group if state.pending.get(queue)]
    # 3. Decide what holds back borrowers: no borrower grows in a flavor that a queue under its nominal quota
    #    waits for while it is lent out (libs/core/quota/reclaim.py).
    lent_out(state, to_rank, cycle)
    # 4. Take the heads in order and try each (every job that gets no quota, or is skipped, is told why once).
    if not cycle.cohort:
        try_one_queue(state, to_rank, cycle, out)
    elif cycle.one_queue:
        try_one_queue(state, list(state.waiting_in[cycle.cohort]), cycle, out)
    elif cohort_full(state, cycle.cohort):
        # A lent-only queue can take nothing while its cohort has no room for its smallest waiting job: the
        # cycle looks at neither the ranked queues nor the lent-only among the others.
        to_try = [queue for queue in to_rank if not lent_only(state, queue, cycle.backing_off)]
        try_heads(state, to_try, [], cycle, out)
    else:
        try_heads(state, to_rank, state.ranked[cycle.cohort], cycle, out)
    return cycle


def take_view(state: QuotaState, group: list[str], now: float) -> Cycle:
    """What holds for the whole cycle, before any job is tried."""
    cycle = Cycle(now=now)
    cycle.nominees = nominees(state, group, now)
    find_starving(state, group, cycle)
    cycle.backing_off = backing_off_queues(state)
    cycle.cohort = state.book.cohort.get(group[0], "") if group else ""
    # (Whether one queue waits is asked before any queue is left out: a cycle over one queue knows more, see
    # Cycle.one_queue, and leaving out queues that decide nothing must not change what a cycle knows.)
    cycle.one_queue = not cycle.cohort or len(state.waiting_in.get(cycle.cohort, ())) == 1
    return cycle


def try_one_queue(state: QuotaState, queues: list[str], cycle: Cycle, out: Decisions) -> None:
    """One queue waits (or the group has no cohort): each queue's own order is the cycle's."""
    for queue in queues:
        if failures_stand(state, queue, cycle) or skippable(state, queue, cycle):
            continue  # (trying its jobs would decide nothing)
        order = Order(state, queue)
        told, timed = len(out.out), False
        cycle.stopped_at = None
        cycle.skipped.clear()
        while (head := next_head(state, queue, order, cycle, out)) is not None:
            timed = timed or runtime_bound(head.spec) is not None
            if try_reserve(state, head, cycle, out):
                cycle.note_reservation()
        keep_failures(state, queue, cycle, decided=len(out.out) != told, timed=timed)


def try_heads(state: QuotaState, to_rank: list[str], ranked: list[RankedEntry], cycle: Cycle,
              out: Decisions) -> None:
    """Try the best head among the queues, again and again: `to_rank` the queues ranked now, `ranked` the
    cohort's heap of queues ranked already (left as it was found, less the entries gone stale). A queue that
    cannot take quota when its head comes up is left (quota only shrinks during a cycle); once its cohort has
    no room, so are the lent-only ones, the ranked among them."""
    heads = QueueHeads(state, cycle, out)
    taken: list[RankedEntry] = []  # the entries of the ranked heap this cycle took out
    for queue in to_rank:
        heads.enter(queue)
    while (best := heads.next_best(ranked, taken)) is not None:
        queue, job = best
        if skippable(state, queue, cycle):
            heads.orders.pop(queue, None)
            continue
        if queue not in heads.orders:  # its head was kept: its order starts now, at that same job
            heads.orders[queue] = Order(state, queue)
            next_head(state, queue, heads.orders[queue], cycle, out)
        if try_reserve(state, job, cycle, out):
            cycle.note_reservation()
            heads.reserved_in(queue)
            if cohort_full(state, cycle.cohort):
                ranked = []  # the lent-only queues can take nothing from now on: only the others are looked at
                heads.drop_lent_only()
        heads.enter(queue)
    # What the cycle took out of the ranked heap and is still in its place goes back.
    if taken:
        cohort_ranked = state.ranked[cycle.cohort]
        for entry in taken:
            if still_in_place(state, entry, cycle):
                heapq.heappush(cohort_ranked, entry)


@dataclass
class QueueHeads:
    """The queues' heads in a heap by order key, beside the cohort's heap of ranked queues: the best of the two
    comes next. A reservation changes the keys of its own queue's jobs only (its usage, so its fair share and
    what is left of its nominal quota), unless the queue is in a tree: a parent's fair share is part of every
    sibling's key, and then every head's key is taken again. An entry whose key is no longer its queue's
    (`current`) is stale and skipped."""

    state: QuotaState
    cycle: Cycle
    out: Decisions
    heap: list[tuple[OrderKey, str]] = field(default_factory=list)
    heads: dict[str, QuotaJob] = field(default_factory=dict)
    current: dict[str, OrderKey] = field(default_factory=dict)
    orders: dict[str, Order] = field(default_factory=dict)  # each queue's order, once its head came up

    def enter(self, queue: str) -> None:
        """Put the queue's next head in the heap (its kept head, when nothing of it was tried yet)."""
        state, cycle = self.state, self.cycle
        fresh = queue not in self.orders  # nothing of the queue was tried yet in this cycle
        keep = fresh and may_keep_head(state, queue, cycle.backing_off)
        kept = kept_head(state, queue, cycle) if keep else None
        if kept is not None:
            head, key = kept
        else:
            order = self.orders.get(queue) or Order(state, queue)
            found = next_head(state, queue, order, cycle, self.out)
            if found is None:
                self.orders.pop(queue, None)
                return
            self.orders[queue] = order
            head, key = found, order_key(state, found, cycle)
            if keep and queue not in cycle.passed_inadmissible:
                keep_head(state, queue, cycle, head, key)
        self.heads[queue] = head
        self.current[queue] = key
        heapq.heappush(self.heap, (key, queue))

    def next_best(self, ranked: list[RankedEntry], taken: list[RankedEntry]) -> tuple[str, QuotaJob] | None:
        """The queue whose head comes next and that head, of this heap and the ranked one (whose entries it
        takes are added to `taken`); None when neither has one."""
        state = self.state
        while True:
            while ranked and not still_in_place(state, ranked[0], self.cycle):
                heapq.heappop(ranked)  # something of that queue changed: it is ranked again by the next cycle
            if ranked and (not self.heap or ranked[0][:2] < self.heap[0]):
                entry = heapq.heappop(ranked)
                taken.append(entry)
                queue = entry[1]
                return queue, state.jobs[state.kept_heads[queue][1]]
            if not self.heap:
                return None
            key, queue = heapq.heappop(self.heap)
            if self.current.get(queue) == key:
                del self.current[queue]
                return queue, self.heads.pop(queue)

    def reserved_in(self, queue: str) -> None:
        """A job of the queue got quota: in a tree, every head's key changes with the parent's fair share."""
        spec = self.state.policy.queues.get(queue)
        if spec is None or not spec.parent:
            return
        for other in list(self.heads):
            self.current[other] = order_key(self.state, self.heads[other], self.cycle)
            heapq.heappush(self.heap, (self.current[other], other))

    def drop_lent_only(self) -> None:
        """The cohort has no room left: its lent-only queues are out of the cycle."""
        for other in [queue for queue in self.heads if lent_only(self.state, queue, self.cycle.backing_off)]:
            del self.heads[other], self.current[other], self.orders[other]
