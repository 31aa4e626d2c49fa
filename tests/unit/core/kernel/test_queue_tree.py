"""The queue tree's part of the quota book (kernel/queue_tree.py): a parent uses in its cohort what its subtree
holds, a queue without quota is bounded by its capped parent, and who holds what a queue lent, up and across the
tree and after a cohort move."""

from __future__ import annotations

import copy

from contracts import QueueSpec
from libs.core.kernel.quota_math import ANY, UNLIMITED, QuotaBook


def tree() -> QuotaBook:
    """p (4) and q (0) share cohort c; a (4) is p's child; p2 (0) in c too, with children b (0) and b2 (2)."""
    book = QuotaBook()
    book.set_queues([QueueSpec(name="p", team="p", cohort="c", nominal_gpus=4),
                     QueueSpec(name="q", team="q", cohort="c", nominal_gpus=0),
                     QueueSpec(name="a", team="a", parent="p", nominal_gpus=4),
                     QueueSpec(name="p2", team="p", cohort="c", nominal_gpus=0),
                     QueueSpec(name="b", team="b", parent="p2", nominal_gpus=0),
                     QueueSpec(name="b2", team="b", parent="p2", nominal_gpus=2)])
    return book


def test_what_a_parents_subtree_holds_is_what_the_parent_uses_in_its_cohort() -> None:
    book = tree()
    assert book.room("q", ANY) == 4000  # p's quota lies idle: lent
    book.add("a", ANY, 3000)
    assert book.held("p", ANY) == 3000 and book.pool_used[("c", ANY)] == 3000  # p lends all 4: its child draws 3
    assert book.room("q", ANY) == 1000
    book.add("a", ANY, 1000)
    assert book.room("q", ANY) == 0
    assert book.lent("p", ANY) == 0 and book.borrowed("p", ANY) == 0


def test_a_childs_room_is_bounded_by_what_its_parent_has_left_in_its_cohort() -> None:
    book = tree()
    book.add("q", ANY, 4000)  # q borrows p's idle 4
    assert book.parent_room("a", ANY) == 0 and book.room("a", ANY) == 0
    book.add("q", ANY, -1000)
    assert book.room("a", ANY) == 1000


def test_a_borrower_up_the_tree_holds_what_a_child_lent_while_its_parent_lends() -> None:
    book = tree()
    assert "q" in book.holders_of_lent("a") and "b" in book.holders_of_lent("a")  # up, and across the tree
    assert "a" not in book.holders_of_lent("a") and "p" not in book.holders_of_lent("a")
    book.add("a", ANY, 4000)  # p holds its nominal: it lends nothing its cohort could hold
    assert book.holders_of_lent("a") == []


def test_a_reclaim_takes_from_a_subtree_only_while_its_parent_borrows() -> None:
    book = tree()
    book.add("b", ANY, 2000)  # b borrows b2's 2, so p2 (nominal 0) borrows 2 from c
    assert book.borrowed("p2", ANY) == 2000 and book.room("a", ANY) == 2000
    assert book.subtree_may_lose("b", ANY, 2000, "a")
    book.set_queue(QueueSpec(name="p2", team="p", cohort="c", nominal_gpus=1))
    assert book.subtree_may_lose("b", ANY, 2000, "a")  # p2 borrows: the whole job may go, below its nominal 1
    book.set_queue(QueueSpec(name="p2", team="p", cohort="c", nominal_gpus=2))
    # p2 holds its nominal, borrows nothing: its subtree loses nothing, though b borrows (from b2, within p2)
    assert not book.subtree_may_lose("b", ANY, 2000, "a") and book.subtree_borrows("b", ANY, "a")
    assert not book.subtree_may_lose("b", ANY, 1000, "a", taken=[("b", 1000)])  # nor a second job at nominal
    assert book.subtree_may_lose("b", ANY, 2000, "b2")  # what p2 gives, p2 gets back: b's own borrowing decides


def test_a_borrowing_parent_gives_back_whole_jobs_of_children_within_their_nominal() -> None:
    book = tree()
    book.add("b2", ANY, 2000)  # b2 within its nominal 2, but p2 (nominal 0) borrows those 2 from c
    assert book.borrowed("b2", ANY) == 0 and book.subtree_borrows("b2", ANY, "a")
    assert book.subtree_may_lose("b2", ANY, 2000, "a")  # p2's subtree borrows: a whole job of it goes
    book.add("b2", ANY, -2000)
    book.add("b2", ANY, 1000)
    book.set_queue(QueueSpec(name="p2", team="p", cohort="c", nominal_gpus=1))
    assert not book.subtree_borrows("b2", ANY, "a") and not book.subtree_may_lose("b2", ANY, 1000, "a")
    assert not book.subtree_borrows("b2", ANY, "b")  # a lender sharing p2 is owed nothing p2 borrows


def test_a_queue_without_quota_is_bounded_by_its_capped_parent() -> None:
    book = QuotaBook()
    book.set_queues([QueueSpec(name="org", team="org"),
                     QueueSpec(name="m", team="m", parent="org", nominal_gpus=2, borrowing_limit_gpus=0),
                     QueueSpec(name="leaf", team="leaf", parent="m"),
                     QueueSpec(name="free", team="free")])
    assert book.room("free", ANY) == UNLIMITED
    assert book.room("leaf", ANY) == 2000
    book.add("leaf", ANY, 2000)
    assert book.room("leaf", ANY) == 0


def test_a_queue_moved_away_while_borrowing_holds_what_its_old_cohort_lent() -> None:
    book = QuotaBook()
    book.set_queues([QueueSpec(name="l", team="l", cohort="c1", nominal_gpus=4),
                     QueueSpec(name="m", team="m", cohort="c1", nominal_gpus=0)])
    book.add("m", ANY, 4000)
    book.set_queue(QueueSpec(name="m", team="m", cohort="c2", nominal_gpus=0))
    assert book.room("l", ANY) == 4000  # c1's pool no longer counts m...
    assert book.holders_of_lent("l") == ["m"]  # ...but m keeps l's GPUs: l may take them back
    book.add("m", ANY, -4000)
    assert book.holders_of_lent("l") == []  # it borrows no more
    book.add("m", ANY, 4000)
    book.set_queue(QueueSpec(name="m", team="m", cohort="c1", nominal_gpus=0))
    assert book.holders_of_lent("l") == ["m"]  # back in c1, a peer again


def test_a_what_if_rolls_back_the_pools_above() -> None:
    book = tree()
    book.add("a", ANY, 2000)
    before = copy.deepcopy((book.used, book.pool_used, book.subtree, book.subtree_all))
    with book.what_if():
        book.add("a", ANY, 2000)
        book.add("b", ANY, 2000)
        assert book.room("q", ANY) == 0
    assert (book.used, book.pool_used, book.subtree, book.subtree_all) == before


def kueue_tree() -> QuotaBook:
    """root -> sub -> (g: 0, gq: 3) and root -> be (0): root and sub have no quota of their own."""
    book = QuotaBook()
    book.set_queues([QueueSpec(name="root", team="t"), QueueSpec(name="sub", team="t", parent="root"),
                     QueueSpec(name="g", team="t", parent="sub", nominal_gpus=0),
                     QueueSpec(name="gq", team="t", parent="sub", nominal_gpus=3),
                     QueueSpec(name="be", team="t", parent="root", nominal_gpus=0)])
    return book


def test_parents_without_quota_pool_their_children_in_the_cohort_above() -> None:
    book = kueue_tree()
    assert book.cohort["g"] == book.cohort["be"] == "root"
    assert book.room("be", ANY) == 3000  # gq's quota, across the tree
    book.set_queue(QueueSpec(name="sub", team="t", parent="root", nominal_gpus=3))  # sub gets quota: a level
    assert book.cohort["g"] == "sub" and book.cohort["sub"] == "root"


def test_a_job_within_what_its_subtree_lends_reclaims_beyond_it() -> None:
    book = kueue_tree()
    book.add("be", ANY, 3000)
    assert book.lending_branch("g", ANY, 3000) == "sub"  # sub's queues have 3 of nominal, none used
    assert book.lending_branch("g", ANY, 4000) is None
    assert book.lending_branch("be", ANY, 1000) is None  # root is the top of the pool: no level below it
