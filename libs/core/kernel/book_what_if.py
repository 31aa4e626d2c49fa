"""A trial on the live quota book (quota_math.QuotaBook.what_if), rolled back when it ends: the book records
every usage change made while one is open, and the trial restores them."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol

# One usage tally a what-if recorded before changing it: (the tally, its key, its value then; None: absent).
Cell = tuple[dict[Any, int], object, int | None]


class RecordingBook(Protocol):
    """What a trial needs of the book (quota_math.QuotaBook): where it records the cells it changes (None: no
    trial open). A protocol, so this module does not import the book that imports it."""

    _cells: list[Cell] | None


class BookWhatIf:
    """A trial on the live quota book, rolled back when it ends: `with book.what_if():`.

    While it is open, every usage change on the book (`add`, and `recharge` through it) is recorded, whoever
    makes it, as the tallies it changes and their values before. On leaving the block, by its end or by an
    exception, they are restored, last first, so the book ends exactly as it began (no tally left behind at zero
    either); unless `keep()` was called: then the changes stand, and an enclosing what-if records them as its
    own. What-ifs nest; each rolls back only its own changes.

    Only usage is recorded: the queue tree and its limits (set_queues, set_queue) are refused while a what-if is
    open, since they are facts from the log, never trials.

        with book.what_if():
            for job in ending:
                book.add(job.queue, job.flavor, -job.demand)  # the jobs gone...
            room = book.room(queue, flavor)  # ...how much room would the queue have?
        # here the jobs hold their quota again
    """

    __slots__ = ("_book", "_cells", "_kept", "_outer")

    def __init__(self, book: RecordingBook) -> None:
        self._book = book
        self._cells: list[Cell] = []
        self._outer: list[Cell] | None = None
        self._kept = False

    def __enter__(self) -> BookWhatIf:
        self._outer = self._book._cells
        self._book._cells = self._cells
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        cells = self._cells
        if cells:  # (most trials that are not asked to change anything change nothing)
            if self._kept:
                if self._outer is not None:
                    self._outer.extend(cells)
            else:
                for tally, key, value in reversed(cells):
                    if value is None:
                        del tally[key]
                    else:
                        tally[key] = value
            self._cells = []
        self._book._cells = self._outer
        self._kept = False

    def keep(self) -> None:
        """Let the changes made in this what-if stand when it ends (a trial that became the decision)."""
        self._kept = True
