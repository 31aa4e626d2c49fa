"""A cohort's calm queues in fair order, kept between passes.

A calm queue is quiet (quota_reach.quiet: out of reach whenever its cohort has no room) and keeps its head
between passes (quota_heads.keeps). Nothing but its own state, the policy, flavors and nodes, and the fair order's
epoch changes where it ranks: so a cohort keeps its calm queues in a heap by order key, and a pass looks at the
few that come first instead of ranking every waiting queue again. A queue something of its own touched
(quota_fold.touched) is looked at again by the next pass; the others, restless (not calm when last looked at,
say backing off), by every pass; a new epoch, policy, fleet or inventory ranks the whole cohort again."""

from __future__ import annotations

import heapq

from libs.core.kernel.decider import Decisions
from libs.core.quota.heads import keep_head, keeps, kept_head, stamp
from libs.core.quota.order import Order, fair_epoch, order_key
from libs.core.quota.reach import quiet
from libs.core.quota.state import Pass, QuotaJob, QuotaState
from libs.core.quota.walk import next_head

STALE_SLACK = 64  # stale entries a cohort's heap may carry beyond twice its waiting queues
# (order key, queue, the stamp of what the key was found from: quota_heads.stamp)
CalmEntry = tuple[tuple[object, ...], str, tuple[object, ...]]


def calm_heap(state: QuotaState, cohort: str, p: Pass, out: Decisions) -> list[str]:
    """Bring the cohort's heap of calm queues up to date; the cohort's waiting queues that are not calm, by name."""
    versions = (fair_epoch(state, p.now), state.policy_version, state.flavors_epoch, state.fleet.inventory.version)
    waiting = state.waiting_in.get(cohort, {})
    restless = state.restless.setdefault(cohort, {})
    if state.calm_at.get(cohort) != versions:
        state.calm_at[cohort] = versions
        state.calm[cohort] = []
        state.stirred.pop(cohort, None)
        restless.clear()
        look = list(waiting)
    else:
        stirred = state.stirred.pop(cohort, None)
        look = [*restless, *(q for q in stirred or () if q not in restless)]
    heap = state.calm[cohort]
    if len(heap) > 2 * len(waiting) + STALE_SLACK:
        # Entries gone stale leave only as they come up: past twice the queues, the heap sheds them at once.
        heap[:] = [entry for entry in heap if valid(state, entry, p)]
        heapq.heapify(heap)
    for q in look:
        if q not in waiting:
            restless.pop(q, None)
        elif quiet(state, q, p.backing_off) and keeps(state, q, p.backing_off):
            restless.pop(q, None)
            key = head_key(state, q, p, out)[1]
            heapq.heappush(heap, (key, q, stamp(state, q, p)))
        else:
            restless[q] = None
    return sorted(restless)  # (in the cohort's order, as its members are: what walking them tells comes in it)


def head_key(state: QuotaState, queue: str, p: Pass, out: Decisions) -> tuple[QuotaJob, tuple[object, ...]]:
    """The calm queue's head at the start of a pass and its order key (kept, or found and kept). Walking a
    calm queue to its head tells nobody anything (quiet: its jobs are all told they wait; nothing backs off)."""
    kept = kept_head(state, queue, p)
    if kept is not None:
        return kept
    head = next_head(state, queue, Order(state, queue), p, out)
    assert head is not None  # (a waiting queue's walk yields its first job: nothing of the pass holds it yet)
    key = order_key(state, head, p)
    keep_head(state, queue, p, head, key)
    return head, key


def valid(state: QuotaState, entry: CalmEntry, p: Pass) -> bool:
    """Is the entry of the cohort's calm heap still its queue's place (nothing of the queue changed since)?"""
    _, queue, when = entry
    return when == stamp(state, queue, p) and queue in state.waiting_in.get(p.cohort, {})
