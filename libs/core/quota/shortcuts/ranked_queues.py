"""A cohort's queues kept ranked in fair order between cycles.

A queue is kept ranked when it is lent-only (skipped_queues.lent_only: it can take nothing whenever its cohort
has no room) and keeps its head between cycles (kept_heads.may_keep_head). Nothing but its own state, the
policy, flavors and nodes, and the fair order's epoch changes where it ranks: so a cohort keeps these queues in
a heap by order key, and a cycle looks at the few that come first instead of ranking every waiting queue again.
A queue something of its own changed (waiting.queue_changed) is looked at again by the next cycle; the
unranked ones (not lent-only, or not keeping their head, when last looked at: say backing off) by every cycle;
a new epoch, policy, fleet or inventory ranks the whole cohort again."""

from __future__ import annotations

import heapq

from libs.core.kernel.decider import Decisions
from libs.core.quota.next_head import next_head
from libs.core.quota.order import Order, fair_epoch, order_key
from libs.core.quota.shortcuts.kept_heads import head_stamp, keep_head, kept_head, may_keep_head
from libs.core.quota.shortcuts.skipped_queues import lent_only
from libs.core.quota.state import Cycle, QuotaJob, QuotaState, RankedEntry

STALE_SLACK = 64  # stale entries a cohort's heap may carry beyond twice its waiting queues


def rank_cohort(state: QuotaState, cohort: str, cycle: Cycle, out: Decisions) -> list[str]:
    """Bring the cohort's heap of ranked queues up to date; the cohort's waiting queues not in it, by name."""
    versions = (fair_epoch(state, cycle.now), state.policy_version, state.flavors_epoch, state.fleet.inventory.version)
    waiting = state.waiting_in.get(cohort, {})
    unranked = state.unranked.setdefault(cohort, {})
    if state.ranked_at.get(cohort) != versions:
        state.ranked_at[cohort] = versions
        state.ranked[cohort] = []
        state.changed_queues.pop(cohort, None)
        unranked.clear()
        to_look_at = list(waiting)
    else:
        changed_queues = state.changed_queues.pop(cohort, None)
        to_look_at = [*unranked, *(q for q in changed_queues or () if q not in unranked)]
    heap = state.ranked[cohort]
    if len(heap) > 2 * len(waiting) + STALE_SLACK:
        # Entries gone stale leave only as they come up: past twice the queues, the heap sheds them at once.
        heap[:] = [entry for entry in heap if still_in_place(state, entry, cycle)]
        heapq.heapify(heap)
    for queue in to_look_at:
        if queue not in waiting:
            unranked.pop(queue, None)
        elif lent_only(state, queue, cycle.backing_off) and may_keep_head(state, queue, cycle.backing_off):
            unranked.pop(queue, None)
            key = ranked_head(state, queue, cycle, out)[1]
            heapq.heappush(heap, (key, queue, head_stamp(state, queue, cycle)))
        else:
            unranked[queue] = None
    return sorted(unranked)  # (in the cohort's order, as its members are: what trying them tells comes in it)


def ranked_head(state: QuotaState, queue: str, cycle: Cycle, out: Decisions) -> tuple[QuotaJob, tuple[object, ...]]:
    """The ranked queue's head at the start of a cycle and its order key (kept, or found and kept). Finding a
    ranked queue's head tells nobody anything (lent-only: its jobs are all told they wait; nothing backs off)."""
    kept = kept_head(state, queue, cycle)
    if kept is not None:
        return kept
    head = next_head(state, queue, Order(state, queue), cycle, out)
    assert head is not None  # (a waiting queue's order yields its first job: nothing of the cycle holds it yet)
    key = order_key(state, head, cycle)
    if queue not in cycle.passed_inadmissible:
        keep_head(state, queue, cycle, head, key)
    return head, key


def still_in_place(state: QuotaState, entry: RankedEntry, cycle: Cycle) -> bool:
    """Is the entry of the cohort's ranked heap still its queue's place (nothing of the queue changed since)?"""
    _, queue, when = entry
    return when == head_stamp(state, queue, cycle) and queue in state.waiting_in.get(cycle.cohort, {})
