"""A queue changed in place (QuotaBook.set_queue, incremental) leaves the book exactly as rebuilding it from
every queue would (set_queues): limits, cohorts, members, parents' bounds and the cohorts' pools, with usage
held across the changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import FlavorQuota, QueueSpec
from libs.core.kernel.quota_math import QuotaBook

NAMES = ("a", "b", "c", "d", "p")
MODELS = ("*", "H100", "A100")


@st.composite
def queue_specs(draw: st.DrawFn) -> QueueSpec:
    name = draw(st.sampled_from(NAMES))
    parent = draw(st.sampled_from(("", "p"))) if name != "p" else ""
    cohort = "" if parent else draw(st.sampled_from(("", "x", "y")))
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2))
    flavors = tuple(FlavorQuota(model=m, nominal_gpus=draw(st.integers(0, 8)),
                                borrowing_limit_gpus=draw(st.none() | st.integers(0, 4)),
                                lending_limit_gpus=draw(st.none() | st.integers(0, 8))) for m in models)
    return QueueSpec(name=name, team=name, parent=parent, cohort=cohort, flavors=flavors)


def comparable(book: QuotaBook) -> tuple[object, ...]:
    return (book.queues, book.limits, book.cohort, book.members, book.children, book.bounds,
            {k: v for k, v in book.pool.items() if v or book.pool_used.get(k)},
            {k: v for k, v in book.pool_used.items() if v or book.pool.get(k)},
            {k: v for k, v in book.subtree.items() if v}, {k: v for k, v in book.subtree_all.items() if v})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(queue_specs(), st.sampled_from(NAMES), st.sampled_from(MODELS), st.integers(-2, 4)),
                min_size=1, max_size=12))
def test_changing_one_queue_in_place_equals_rebuilding_the_book(steps: list[tuple[QueueSpec, str, str, int]]
                                                                ) -> None:
    book = QuotaBook()
    for spec, queue, model, gpus in steps:
        book.set_queue(spec)
        if queue in book.queues and book.usage(queue, model) + gpus * 1000 >= 0:
            book.add(queue, model, gpus * 1000)
        rebuilt = QuotaBook(used=dict(book.used), over=dict(book.over))
        rebuilt.set_queues(book.queues.values())
        assert comparable(book) == comparable(rebuilt)
