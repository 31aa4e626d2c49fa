"""QuotaBook.what_if: a trial of usage changes on the live quota book, rolled back as a whole."""

from __future__ import annotations

import copy

import pytest

from contracts import FlavorQuota, QueueSpec
from libs.core.kernel.quota_math import ANY, QuotaBook


def tallies(book: QuotaBook) -> object:
    """Every usage tally of the book, keys and insertion order included (a rollback leaves no zero behind)."""
    return copy.deepcopy([list(t.items()) for t in (book.used, book.over, book.pool_used, book.subtree,
                                                    book.subtree_all)])


def cohort_book() -> QuotaBook:
    """Two queues of a cohort under a parent with quota (so that pool and subtree tallies move too)."""
    book = QuotaBook()
    book.set_queues([QueueSpec(name="org", team="org", nominal_gpus=8),
                     QueueSpec(name="a", team="a", parent="org", nominal_gpus=4, lending_limit_gpus=2),
                     QueueSpec(name="b", team="b", parent="org", nominal_gpus=4, lending_limit_gpus=2)])
    book.add("a", ANY, 3000)
    return book


def test_every_usage_change_inside_a_what_if_is_rolled_back() -> None:
    book = cohort_book()
    before = tallies(book)
    room = book.room("b", ANY)
    with book.what_if():
        book.add("a", ANY, -3000)
        book.add("b", ANY, 5000)
        book.add("b", ANY, 1000, over_budget=True)
        assert book.usage("b", ANY) == 6000 and book.room("b", ANY) != room
    assert tallies(book) == before
    assert book.room("b", ANY) == room


def test_a_tally_the_what_if_created_is_gone_afterwards() -> None:
    book = cohort_book()
    with book.what_if():
        book.add("b", ANY, 1000, over_budget=True)
        book.add("b", ANY, -1000, over_budget=True)
    assert ("b", ANY) not in book.over and ("b", ANY) not in book.used


def test_nested_what_ifs_each_roll_back_their_own_changes() -> None:
    book = cohort_book()
    before = tallies(book)
    with book.what_if():
        book.add("a", ANY, -1000)
        middle = tallies(book)
        with book.what_if():
            book.add("b", ANY, 2000)
        assert tallies(book) == middle
        with book.what_if() as inner:
            book.add("b", ANY, 1000)
            inner.keep()  # stands until the outer what-if ends
        assert book.usage("b", ANY) == 1000
    assert tallies(book) == before


def test_an_exception_rolls_the_what_if_back() -> None:
    book = cohort_book()
    before = tallies(book)
    with pytest.raises(ValueError), book.what_if():
        book.add("a", ANY, 1000)
        raise ValueError("trial failed")
    assert tallies(book) == before
    book.add("b", ANY, 1000)  # nothing records any more: a change outside a what-if stands
    assert book.usage("b", ANY) == 1000


def test_a_recharge_inside_a_what_if_is_rolled_back() -> None:
    book = QuotaBook()
    book.set_queues([QueueSpec(name="a", team="a", flavors=(FlavorQuota(model="a100", nominal_gpus=4),))])
    book.add("a", "h100", 2000)  # a flavor the queue no longer has
    before = tallies(book)
    with book.what_if():
        assert book.recharge("a", "h100", "a100", 2000) == "a100"
        assert book.usage("a", "a100") == 2000
    assert tallies(book) == before


def test_the_queue_tree_cannot_change_inside_a_what_if() -> None:
    book = cohort_book()
    with book.what_if(), pytest.raises(RuntimeError):
        book.set_queue(QueueSpec(name="c", team="c", nominal_gpus=1))
    with book.what_if(), pytest.raises(RuntimeError):
        book.set_queues([])
