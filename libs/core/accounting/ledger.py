"""Accounting: the read models and the GPU-time ledger, as one fold over the whole log.

It decides nothing; it records. `Ledger` holds its books (accounting/state.py, `state`) with the two things asked
of them:
fold the next event (accounting/fold.py) and read a node's or a queue's view (accounting/read_views.py). The
projector writes what `dirty_*` name to Redis after each batch.
"""

from __future__ import annotations

from contracts import EventBase
from contracts.views import NodeView, QueueView
from libs.core.accounting.fold import fold
from libs.core.accounting.read_views import node_view, queue_view
from libs.core.accounting.state import LedgerState


class Ledger:
    def __init__(self) -> None:
        self.state = LedgerState()

    def fold(self, event: EventBase, seq: int) -> None:
        """Fold the event at position `seq` of the log into the books."""
        fold(self.state, event, seq)

    def node_view(self, name: str) -> NodeView:
        return node_view(self.state, name)

    def queue_view(self, name: str) -> QueueView:
        """The queue's counters with its quota figures as of the last event folded."""
        return queue_view(self.state, name)
