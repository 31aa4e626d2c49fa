"""Views for what-ifs, so that no caller can forget half of an undo: a quota book's overlay, dropped when the
what-if ends, and a statement over a cluster, whose every change is logged as it is made and rolled back at
the end (as KAI Scheduler's statements are: checkpoint, rollback).

Both wrap the kernel's QuotaBook and Cluster through their public fields and methods alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import TracebackType

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.job_fit import Shortfall, place_gang
from libs.core.cluster.model import Cluster
from libs.core.kernel.quota_math import QuotaBook

Placements = tuple[ReplicaPlacement, ...]


def quota_overlay(book: QuotaBook) -> QuotaBook:
    """A quota book to change freely: the queue tree and limits are the book's own (a what-if never changes
    them), the usage tallies (everything QuotaBook.add changes) a copy of its current ones."""
    return dataclasses.replace(book, used=dict(book.used), over=dict(book.over), pool_used=dict(book.pool_used),
                               subtree=dict(book.subtree), subtree_all=dict(book.subtree_all))


class ClusterStatement:
    """Changes to a cluster for a what-if, each logged as it is made. `rollback` undoes them, the last first
    (to a `checkpoint`, or all of them); leaving a `with` block rolls everything back."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        # (True: released, False: allocated; the placements, in the order changed), in the order made.
        self._log: list[tuple[bool, list[Placements]]] = []

    def __enter__(self) -> ClusterStatement:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.rollback()

    def release(self, placements: Iterable[Placements]) -> None:
        """Free the GPUs of each of these placements, in order."""
        batch = list(placements)
        for one in batch:
            self.cluster.release(one)
        self._log.append((True, batch))

    def place_gang(self, spec: JobSpec) -> Placements | Shortfall:
        """Place the job as placement would, all its replicas or none (a shortfall changes nothing)."""
        placed = place_gang(self.cluster, spec)
        if not isinstance(placed, Shortfall):
            self._log.append((False, [placed]))
        return placed

    def checkpoint(self) -> int:
        """A point `rollback` can return to."""
        return len(self._log)

    def rollback(self, to: int = 0) -> None:
        """Undo the changes made since the checkpoint `to` (all of them by default), the last first; each
        change's placements are given back in the order they were taken."""
        while len(self._log) > to:
            released, batch = self._log.pop()
            for one in batch:
                if released:
                    self.cluster.allocate(one)
                else:
                    self.cluster.release(one)
