"""The ledger's fold: one event of the log into its books, by one small handler per event type. The events about
one job go to the job fold (accounting/job_fold.py); queues, nodes and preemptions are handled here. It decides
nothing: it records what the deciders decided and the executors reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contracts import (
    EventBase,
    GpuHealthChanged,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PreemptionDecided,
    QueuePolicyChanged,
    QuotaReleased,
    QuotaReserved,
)
from libs.core.accounting.job_books import touch
from libs.core.accounting.job_fold import fold_job
from libs.core.accounting.state import LedgerState
from libs.core.kernel.gpu_time import GpuRun

# (the books, the event, its position in the log, the GPU runs the event ended)
Fold = Callable[[LedgerState, Any, int, list[GpuRun]], None]


def fold(books: LedgerState, event: EventBase, seq: int) -> None:
    """Fold one event into the books:
    1. the log's position and clock move on, whatever the event;
    2. a report about a run already over stops here: it neither ends the job's current run nor charges its time;
    3. the books every event may move: the current runs, the GPU time (first, as the handlers charge the runs
       this event ended), and the quota mirror;
    4. the event's own handler (an event about one job that has none is still the job's latest)."""
    books.last_seq = max(books.last_seq, seq)
    books.last_ts = max(books.last_ts, event.ts)
    if books.runs.is_stale(event):
        return
    books.runs.fold(event)
    ended = books.usage.fold(event)
    books.quota.fold(event)
    FOLDS.get(type(event), fold_job)(books, event, seq, ended)


def _queue_policy_changed(books: LedgerState, event: QueuePolicyChanged, seq: int, ended: list[GpuRun]) -> None:
    counters = books.queue(event.queue.name)
    counters.team, counters.seq = event.queue.team, seq
    books.dirty_queues.update(dict.fromkeys(books.quota.policy.queues))  # nominal sums and pools change


def _quota_moved(books: LedgerState, event: QuotaReserved | QuotaReleased, seq: int, ended: list[GpuRun]) -> None:
    """A reservation taken or given back changes what its cohort's other queues may borrow: all are written again."""
    cohort = books.quota.book.cohort.get(event.queue, "")
    books.dirty_queues.update(dict.fromkeys(books.quota.book.members.get(cohort, []) if cohort else []))
    fold_job(books, event, seq, ended)


def _node_registered(books: LedgerState, event: NodeRegistered, seq: int, ended: list[GpuRun]) -> None:
    books.cluster.register(event.node)
    books.removed_nodes.discard(event.node.name)
    books.dirty_nodes[event.node.name] = None


def _node_lost(books: LedgerState, event: NodeLost, seq: int, ended: list[GpuRun]) -> None:
    books.cluster.set_online(event.node, False)
    if event.removed:  # out of the views; the cluster keeps it offline for the runs still charged to it
        books.removed_nodes.add(event.node)
        books.cordons.pop(event.node, None)
    books.dirty_nodes[event.node] = None


def _gpu_health_changed(books: LedgerState, event: GpuHealthChanged, seq: int, ended: list[GpuRun]) -> None:
    books.cluster.set_gpu_health(event.node, event.index, event.healthy)
    books.dirty_nodes[event.node] = None


def _node_cordoned(books: LedgerState, event: NodeCordoned, seq: int, ended: list[GpuRun]) -> None:
    books.cordons[event.node] = ("draining" if event.drain else "cordoned", event.reason)
    books.dirty_nodes[event.node] = None


def _node_uncordoned(books: LedgerState, event: NodeUncordoned, seq: int, ended: list[GpuRun]) -> None:
    books.cordons.pop(event.node, None)
    books.dirty_nodes[event.node] = None


def _preemption_decided(books: LedgerState, event: PreemptionDecided, seq: int, ended: list[GpuRun]) -> None:
    """Each victim known to the ledger is being preempted, for the reason the decision gives."""
    for victim in event.victims:
        view = books.jobs.get(victim.job_id)
        if view is not None:
            view.phase, view.reason = "preempting", victim.reason
            touch(books, view, seq)


FOLDS: dict[type[EventBase], Fold] = {
    QueuePolicyChanged: _queue_policy_changed,
    QuotaReserved: _quota_moved,
    QuotaReleased: _quota_moved,
    NodeRegistered: _node_registered,
    NodeLost: _node_lost,
    GpuHealthChanged: _gpu_health_changed,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    PreemptionDecided: _preemption_decided,
}
