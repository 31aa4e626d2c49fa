"""The scheduling pass over a group of queues (a cohort, or a queue without one): first what holds for the whole
pass (the nominated preemptors, the starving job, the flavors lent out, the lent quota that unplaced borrowers
give back), then, repeatedly, the best head among the queues by the fair order is tried, until no queue has a
job worth trying. Finding a queue's next head skips, and tells why once, the jobs backing off, the jobs held
behind a job of higher priority, and those at least as large as a job of the same flavors that already failed
this pass (quota only shrinks during a pass)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from libs.core.decider import Decisions
from libs.core.quota_fit import flavors_of
from libs.core.quota_heads import backing_off_queues, keep_head, keeps, kept_head
from libs.core.quota_nomination import nominees
from libs.core.quota_order import Order, order_key
from libs.core.quota_reach import no_room, out_of_reach, quiet
from libs.core.quota_reasons import (
    BACKING_OFF,
    BEHIND_HIGHER_PRIORITY,
    RETRY_BACKOFF,
    WAITING_FOR_QUOTA,
    defer,
    quota_reason,
    tells,
)
from libs.core.quota_reclaim import lent_out
from libs.core.quota_reserve import held_like_another, try_reserve, usable_flavors
from libs.core.quota_starvation import find_starving
from libs.core.quota_state import Pass, QuotaJob

if TYPE_CHECKING:
    from libs.core.quota import QuotaDecider


def schedule(d: QuotaDecider, group: list[str], now: float, out: Decisions) -> None:
    p = Pass(now=now)
    p.nominees = nominees(d, group, now)
    find_starving(d, group, p)
    waiting = [q for q in group if d.pending.get(q)]
    # (Whether one queue waits is asked before any queue is left out: a pass over one queue knows more, see
    # Pass.one_queue, and leaving out queues that decide nothing must not change what a pass knows.)
    p.one_queue = len(waiting) == 1
    p.backing_off = backing_off_queues(d)
    # A quiet queue waits for no lent quota (lent_out would find none), and while its cohort has no room for
    # the cohort's smallest waiting job it is out of reach: the pass need not look at it at all.
    loud = [q for q in waiting if not quiet(d, q, p.backing_off)]
    lent_out(d, loud, p)
    p.cohort = d.book.cohort.get(waiting[0], "") if waiting else ""
    run_pass(d, loud if p.cohort and no_room(d, p.cohort) else waiting, p, out)


def run_pass(d: QuotaDecider, waiting: list[str], p: Pass, out: Decisions) -> None:
    # Each queue's walk, made when its head is first tried (None until then: its head is the one kept).
    orders: dict[str, Order | None] = {}
    if p.one_queue:  # one queue waits: its own order is the pass's
        for queue in waiting:
            if out_of_reach(d, queue, p):
                continue
            order = Order(d, queue)
            while (head := next_head(d, queue, order, p, out)) is not None:
                if try_reserve(d, head, p, out):
                    p.reserved()
        return
    # The queues' heads in a heap by order key. A reservation changes the keys of its own queue's jobs only
    # (its usage, so its fair share and what is left of its nominal quota), unless the queue is in a tree: a
    # parent's fair share is part of every sibling's key, and then every head's key is taken again. An entry
    # whose key is no longer its queue's (`current`) is stale and skipped. A queue out of reach when its head
    # comes up is left (quota only shrinks during a pass); once its cohort has no room, so are the quiet ones.
    heap: list[tuple[tuple[object, ...], str]] = []
    heads: dict[str, QuotaJob] = {}
    current: dict[str, tuple[object, ...]] = {}

    def enter(q: str) -> None:
        fresh = q not in orders  # nothing of the queue was tried yet in this pass
        keep = fresh and keeps(d, q, p.backing_off)
        kept = kept_head(d, q, p) if keep else None
        if kept is not None:
            orders[q] = None
            head, key = kept
        else:
            order = orders.get(q) or Order(d, q)
            orders[q] = order
            found = next_head(d, q, order, p, out)
            if found is None:
                del orders[q]
                return
            head, key = found, order_key(d, found, p)
            if keep:
                keep_head(d, q, p, head, key)
        heads[q] = head
        current[q] = key
        heapq.heappush(heap, (key, q))

    for q in waiting:
        enter(q)
    while heap:
        key, q = heapq.heappop(heap)
        if current.get(q) != key:
            continue
        best = heads.pop(q)
        del current[q]
        if out_of_reach(d, q, p):
            del orders[q]
            continue
        if orders[q] is None:  # its head was kept: its walk starts now, at that same job
            order = orders[q] = Order(d, q)
            next_head(d, q, order, p, out)
        if try_reserve(d, best, p, out):
            p.reserved()
            in_tree = d.policy.queues.get(q) is not None and bool(d.policy.queues[q].parent)
            for other in list(heads) if in_tree else ():
                current[other] = order_key(d, heads[other], p)
                heapq.heappush(heap, (current[other], other))
            if p.cohort and no_room(d, p.cohort):
                # The quiet queues are out of reach from now on: only the others are looked at.
                for other in [o for o in heads if quiet(d, o, p.backing_off)]:
                    del heads[other], current[other], orders[other]
        enter(q)


def next_head(d: QuotaDecider, queue: str, order: Order, p: Pass, out: Decisions) -> QuotaJob | None:
    """The next job of the queue worth trying; jobs that cannot fit are told why (once) on the way."""
    backing_off = d.backing_off
    requeued = d.requeued
    # None of these changes while the queue's next head is looked for (only trying a head does).
    held = p.held_below.get(queue)
    held_all = p.held_all.get(queue)
    failures = p.failed
    deferred = d.deferred
    version = d.flavors_epoch
    waiting_for_quota = WAITING_FOR_QUOTA
    # The last flavors (interned: see quota_fit.flavors_of) and level seen, with what the pass knows of them.
    seen_flavors: tuple[str, ...] | None = None
    seen_failed: int | None = None
    seen_level = -1
    level_skips = False
    for job in order.walk:
        if backing_off or requeued:
            backoffs = backing_off if job.job_id in backing_off else requeued
            not_before = backoffs.get(job.job_id)
            if not_before is not None:
                if not_before > p.now:
                    if deferred.get(job.job_id) not in BACKING_OFF:
                        defer(d, job, RETRY_BACKOFF, f"it failed and runs again after {not_before:.0f}", 0, out)
                    continue
                del backoffs[job.job_id]
        if held is not None and ((held_all is not None and job.priority < held_all)
                                 or not usable_flavors(d, job, p)):
            if held_all is not None and job.priority < held_all and deferred.get(job.job_id) in WAITING_FOR_QUOTA:
                return None  # everything after it is of lower priority still, held in every flavor, and told
            if tells(d, job, BEHIND_HIGHER_PRIORITY):
                defer(d, job, BEHIND_HIGHER_PRIORITY, f"a job of higher priority waits for queue {queue}'s quota first",
                      0, out)
            continue
        if failures:
            flavors = job.flavors if job.flavors_version == version else flavors_of(d, job)
            if flavors is not seen_flavors:
                seen_flavors, seen_failed, seen_level = flavors, failures.get((queue, flavors)), -1
            failed = seen_failed
            if failed is not None and job.demand >= failed:
                if deferred.get(job.job_id) in waiting_for_quota:
                    if job.priority != seen_level:
                        seen_level = job.priority
                        level = (queue, seen_level)
                        smallest = p.smallest.get(level)
                        if smallest is None:
                            smallest = p.smallest[level] = min(d.demands[level])
                        # Nothing of this level is smaller or asks for other models: skip the level.
                        level_skips = failed <= smallest and len(d.models[level]) == 1
                    if level_skips:
                        order.skip_level()
                    continue
                defer(d, job, *quota_reason(d, job, p), out)
                continue
        if p.held_for_starving and held_like_another(d, job, p):
            continue
        return job
    return None
