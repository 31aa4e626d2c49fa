"""The quota side of the starvation rule (libs/core/starvation.py), as arithmetic on the quota book: when the
starving job's quota frees up, and what another reservation would do to the room it could use. Each answer
changes the book only while it is asked, and leaves it as it was."""

from __future__ import annotations

from libs.core.quota_state import QuotaJob
from libs.core.quotas import QuotaBook
from libs.core.starvation import RoomEffect, Shadow, find_shadow


def _release(book: QuotaBook, job: QuotaJob) -> None:
    book.add(job.queue, job.flavor, -job.demand, job.over_budget)


def _restore(book: QuotaBook, job: QuotaJob) -> None:
    book.add(job.queue, job.flavor, job.demand, job.over_budget)


def _fits(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...]) -> bool:
    return any(book.room(starving.queue, f) >= starving.demand for f in flavors)


def reservations_shadow(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...], holding: list[QuotaJob],
                        now: float) -> Shadow[QuotaJob] | None:
    """When the starving job's quota (of `flavors`) frees up, by the declared runtimes of the reservations
    `holding` it; None when it would not fit even with all of them gone."""
    declared = sorted(((j.reserved_at + j.spec.duration_s, j.job_id), j) for j in holding
                      if j.spec.duration_s is not None)
    return find_shadow(now, [(end, j) for (end, _), j in declared], [j for j in holding if j.spec.duration_s is None],
                       release=lambda j: _release(book, j), restore=lambda j: _restore(book, j),
                       fits=lambda: _fits(book, starving, flavors))


def reservation_effect(book: QuotaBook, starving: QuotaJob, flavors: tuple[str, ...], ending: tuple[QuotaJob, ...],
                       job: QuotaJob, flavor: str, over_budget: bool) -> RoomEffect:
    """Would reserving `job` in `flavor` shrink the room the starving job could use (in any of its
    `flavors`), and would the starving job still fit beside it at its shadow time (the reservations `ending`
    by then gone)?"""
    for j in ending:
        _release(book, j)
    try:
        before = [book.room(starving.queue, f) for f in flavors]
        book.add(job.queue, flavor, job.demand, over_budget)
        after = [book.room(starving.queue, f) for f in flavors]
        book.add(job.queue, flavor, -job.demand, over_budget)
    finally:
        for j in ending:
            _restore(book, j)
    return (any(a < b for a, b in zip(after, before, strict=True)), any(a >= starving.demand for a in after))
