"""The scheduling pass over a group of queues (a cohort, or a queue without one): first what holds for the whole
pass (the nominated preemptors, the starving job, the flavors lent out, the lent quota that unplaced borrowers
give back), then, repeatedly, the best head among the queues by the fair order is tried, until no queue has a
job worth trying. Finding a queue's next head skips, and tells why once, the jobs backing off, the jobs held
behind a job of higher priority, and those at least as large as a job of the same flavors that already failed
this pass (quota only shrinks during a pass)."""

from __future__ import annotations

import heapq

from libs.core.kernel.decider import Decisions
from libs.core.quota.next_head import next_head
from libs.core.quota.nomination import nominees
from libs.core.quota.order import Order, order_key
from libs.core.quota.reclaim import lent_out
from libs.core.quota.reserve import try_reserve
from libs.core.quota.shortcuts.kept_heads import backing_off_queues, keep_head, kept_head, may_keep_head
from libs.core.quota.shortcuts.ranked_queues import RankedEntry, rank_cohort, still_in_place
from libs.core.quota.shortcuts.skipped_queues import cohort_full, lent_only, skippable
from libs.core.quota.starvation import find_starving
from libs.core.quota.state import Cycle, QuotaJob, QuotaState


def schedule(state: QuotaState, group: list[str], now: float, out: Decisions) -> None:
    cycle = Cycle(now=now)
    cycle.nominees = nominees(state, group, now)
    find_starving(state, group, cycle)
    cycle.backing_off = backing_off_queues(state)
    cycle.cohort = state.book.cohort.get(group[0], "") if group else ""
    if not cycle.cohort:  # a queue without a cohort
        waiting = [q for q in group if state.pending.get(q)]
        cycle.one_queue = True
        lent_out(state, waiting, cycle)
        run_cycle(state, waiting, [], cycle, out)
        return
    # (Whether one queue waits is asked before any queue is left out: a pass over one queue knows more, see
    # Pass.one_queue, and leaving out queues that decide nothing must not change what a pass knows.)
    cycle.one_queue = len(state.waiting_in.get(cycle.cohort, ())) == 1
    # The calm queues (quota_calm) wait for no lent quota (lent_out would find none): only the others are asked.
    unranked = rank_cohort(state, cycle.cohort, cycle, out)
    lent_out(state, unranked, cycle)
    if cycle.one_queue:
        run_cycle(state, list(state.waiting_in[cycle.cohort]), [], cycle, out)
    elif cohort_full(state, cycle.cohort):
        # A quiet queue is out of reach while its cohort has no room for its smallest waiting job: the pass
        # need not look at the calm ones at all, nor at the quiet among the others.
        run_cycle(state, [q for q in unranked if not lent_only(state, q, cycle.backing_off)], [], cycle, out)
    else:
        run_cycle(state, unranked, state.ranked[cycle.cohort], cycle, out)


def run_cycle(state: QuotaState, waiting: list[str], ranked: list[RankedEntry], cycle: Cycle, out: Decisions) -> None:
    """Try the best head among the queues, again and again: `waiting` the queues to rank now, `calm` the
    cohort's heap of calm queues, ranked already (left as it was found, less the entries gone stale)."""
    if cycle.one_queue:  # one queue waits: its own order is the pass's
        for queue in waiting:
            if skippable(state, queue, cycle):
                continue
            order = Order(state, queue)
            while (head := next_head(state, queue, order, cycle, out)) is not None:
                if try_reserve(state, head, cycle, out):
                    cycle.reserved()
        return
    # The queues' heads in a heap by order key (with the calm heap beside it: the best of the two comes
    # next). A reservation changes the keys of its own queue's jobs only (its usage, so its fair share and
    # what is left of its nominal quota), unless the queue is in a tree: a parent's fair share is part of
    # every sibling's key, and then every head's key is taken again. An entry whose key is no longer its
    # queue's (`current`) is stale and skipped. A queue out of reach when its head comes up is left (quota
    # only shrinks during a pass); once its cohort has no room, so are the quiet ones, the calm among them.
    heap: list[tuple[tuple[object, ...], str]] = []
    heads: dict[str, QuotaJob] = {}
    current: dict[str, tuple[object, ...]] = {}
    orders: dict[str, Order] = {}  # each queue's walk, once its head came up
    taken: list[RankedEntry] = []  # the calm heap's entries this pass took out

    def enter(q: str) -> None:
        fresh = q not in orders  # nothing of the queue was tried yet in this pass
        keep = fresh and may_keep_head(state, q, cycle.backing_off)
        kept = kept_head(state, q, cycle) if keep else None
        if kept is not None:
            head, key = kept
        else:
            order = orders.get(q) or Order(state, q)
            found = next_head(state, q, order, cycle, out)
            if found is None:
                orders.pop(q, None)
                return
            orders[q] = order
            head, key = found, order_key(state, found, cycle)
            if keep:
                keep_head(state, q, cycle, head, key)
        heads[q] = head
        current[q] = key
        heapq.heappush(heap, (key, q))

    for q in waiting:
        enter(q)
    while True:
        while ranked and not still_in_place(state, ranked[0], cycle):
            heapq.heappop(ranked)  # something of that queue changed: it is ranked again by the next pass
        if ranked and (not heap or ranked[0][:2] < heap[0]):
            entry = heapq.heappop(ranked)
            taken.append(entry)
            key, q, _ = entry
            best = state.jobs[state.kept_heads[q][1]]
        elif heap:
            key, q = heapq.heappop(heap)
            if current.get(q) != key:
                continue
            best = heads.pop(q)
            del current[q]
        else:
            break
        if skippable(state, q, cycle):
            orders.pop(q, None)
            continue
        if q not in orders:  # its head was kept: its walk starts now, at that same job
            orders[q] = Order(state, q)
            next_head(state, q, orders[q], cycle, out)
        if try_reserve(state, best, cycle, out):
            cycle.reserved()
            in_tree = state.policy.queues.get(q) is not None and bool(state.policy.queues[q].parent)
            for other in list(heads) if in_tree else ():
                current[other] = order_key(state, heads[other], cycle)
                heapq.heappush(heap, (current[other], other))
            if cohort_full(state, cycle.cohort):
                # The quiet queues are out of reach from now on: only the others are looked at.
                ranked = []
                for other in [o for o in heads if lent_only(state, o, cycle.backing_off)]:
                    del heads[other], current[other], orders[other]
        enter(q)
    # What the pass took out of the calm heap and is still in its place goes back.
    if taken:
        cohort_calm = state.ranked[cycle.cohort]
        for entry in taken:
            if still_in_place(state, entry, cycle):
                heapq.heappush(cohort_calm, entry)
