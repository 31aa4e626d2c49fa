"""The scheduling pass over a group of queues (a cohort, or a queue without one): first what holds for the whole
pass (the nominated preemptors, the starving job, the flavors lent out, the lent quota that unplaced borrowers
give back), then, repeatedly, the best head among the queues by the fair order is tried, until no queue has a
job worth trying. Finding a queue's next head skips, and tells why once, the jobs backing off, the jobs held
behind a job of higher priority, and those at least as large as a job of the same flavors that already failed
this pass (quota only shrinks during a pass)."""

from __future__ import annotations

import heapq

from libs.core.kernel.decider import Decisions
from libs.core.quota.calm import CalmEntry, calm_heap, valid
from libs.core.quota.heads import backing_off_queues, keep_head, keeps, kept_head
from libs.core.quota.nomination import nominees
from libs.core.quota.order import Order, order_key
from libs.core.quota.reach import no_room, out_of_reach, quiet
from libs.core.quota.reclaim import lent_out
from libs.core.quota.reserve import try_reserve
from libs.core.quota.starvation import find_starving
from libs.core.quota.state import Pass, QuotaJob, QuotaState
from libs.core.quota.walk import next_head


def schedule(state: QuotaState, group: list[str], now: float, out: Decisions) -> None:
    p = Pass(now=now)
    p.nominees = nominees(state, group, now)
    find_starving(state, group, p)
    p.backing_off = backing_off_queues(state)
    p.cohort = state.book.cohort.get(group[0], "") if group else ""
    if not p.cohort:  # a queue without a cohort
        waiting = [q for q in group if state.pending.get(q)]
        p.one_queue = True
        lent_out(state, waiting, p)
        run_pass(state, waiting, [], p, out)
        return
    # (Whether one queue waits is asked before any queue is left out: a pass over one queue knows more, see
    # Pass.one_queue, and leaving out queues that decide nothing must not change what a pass knows.)
    p.one_queue = len(state.waiting_in.get(p.cohort, ())) == 1
    # The calm queues (quota_calm) wait for no lent quota (lent_out would find none): only the others are asked.
    restless = calm_heap(state, p.cohort, p, out)
    lent_out(state, restless, p)
    if p.one_queue:
        run_pass(state, list(state.waiting_in[p.cohort]), [], p, out)
    elif no_room(state, p.cohort):
        # A quiet queue is out of reach while its cohort has no room for its smallest waiting job: the pass
        # need not look at the calm ones at all, nor at the quiet among the others.
        run_pass(state, [q for q in restless if not quiet(state, q, p.backing_off)], [], p, out)
    else:
        run_pass(state, restless, state.calm[p.cohort], p, out)


def run_pass(state: QuotaState, waiting: list[str], calm: list[CalmEntry], p: Pass, out: Decisions) -> None:
    """Try the best head among the queues, again and again: `waiting` the queues to rank now, `calm` the
    cohort's heap of calm queues, ranked already (left as it was found, less the entries gone stale)."""
    if p.one_queue:  # one queue waits: its own order is the pass's
        for queue in waiting:
            if out_of_reach(state, queue, p):
                continue
            order = Order(state, queue)
            while (head := next_head(state, queue, order, p, out)) is not None:
                if try_reserve(state, head, p, out):
                    p.reserved()
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
    taken: list[CalmEntry] = []  # the calm heap's entries this pass took out

    def enter(q: str) -> None:
        fresh = q not in orders  # nothing of the queue was tried yet in this pass
        keep = fresh and keeps(state, q, p.backing_off)
        kept = kept_head(state, q, p) if keep else None
        if kept is not None:
            head, key = kept
        else:
            order = orders.get(q) or Order(state, q)
            found = next_head(state, q, order, p, out)
            if found is None:
                orders.pop(q, None)
                return
            orders[q] = order
            head, key = found, order_key(state, found, p)
            if keep:
                keep_head(state, q, p, head, key)
        heads[q] = head
        current[q] = key
        heapq.heappush(heap, (key, q))

    for q in waiting:
        enter(q)
    while True:
        while calm and not valid(state, calm[0], p):
            heapq.heappop(calm)  # something of that queue changed: it is ranked again by the next pass
        if calm and (not heap or calm[0][:2] < heap[0]):
            entry = heapq.heappop(calm)
            taken.append(entry)
            key, q, _ = entry
            best = state.jobs[state.heads[q][1]]
        elif heap:
            key, q = heapq.heappop(heap)
            if current.get(q) != key:
                continue
            best = heads.pop(q)
            del current[q]
        else:
            break
        if out_of_reach(state, q, p):
            orders.pop(q, None)
            continue
        if q not in orders:  # its head was kept: its walk starts now, at that same job
            orders[q] = Order(state, q)
            next_head(state, q, orders[q], p, out)
        if try_reserve(state, best, p, out):
            p.reserved()
            in_tree = state.policy.queues.get(q) is not None and bool(state.policy.queues[q].parent)
            for other in list(heads) if in_tree else ():
                current[other] = order_key(state, heads[other], p)
                heapq.heappush(heap, (current[other], other))
            if no_room(state, p.cohort):
                # The quiet queues are out of reach from now on: only the others are looked at.
                calm = []
                for other in [o for o in heads if quiet(state, o, p.backing_off)]:
                    del heads[other], current[other], orders[other]
        enter(q)
    # What the pass took out of the calm heap and is still in its place goes back.
    if taken:
        cohort_calm = state.calm[p.cohort]
        for entry in taken:
            if valid(state, entry, p):
                heapq.heappush(cohort_calm, entry)
