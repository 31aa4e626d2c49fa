"""Builders shared by the quota scenario tests: queues in a cohort, jobs of a queue's own team, a quota (or
whole-pipeline) feed with plain settings, and the shapes of the decisions the tests compare."""

from __future__ import annotations

from typing import Any

from contracts import EventBase, QueueSpec, QuotaDeferred, QuotaReserved, SchedulingSettings, SchedulingSettingsChanged
from libs.core.accounting.ledger import Ledger
from libs.core.quota.decider import QuotaDecider
from tests.unit.builders import EventFeed, Job, brief, job, of, pipeline

DAY = 86_400.0
D = 100 * DAY  # 1970-04-11 00:00 UTC, a Saturday


def q(name: str, nominal: int | None = None, cohort: str = "c", **fields: Any) -> QueueSpec:
    return QueueSpec(name=name, team=name, nominal_gpus=nominal, cohort=cohort, **fields)


def on(queue: str, gpus: int = 1, **fields: Any) -> Job:
    """A job of `queue` (its own team) asking `gpus` whole GPUs."""
    return job(queue, queue, **fields).gpus(gpus)


def settings(feed: EventFeed, half_life_s: float = 0.0, starvation_after_s: float | None = None,
             placement_timeout_s: float | None = 300.0) -> None:
    """Unless a test says otherwise: current usage only in the fair order, nothing starves, and a reservation
    not placed in 300 s goes back (the default)."""
    feed.send(SchedulingSettingsChanged, version=1, settings=SchedulingSettings(
        fair_share_half_life_s=half_life_s, starvation_after_s=starvation_after_s,
        placement_timeout_s=placement_timeout_s))


def quota(*queues: QueueSpec, half_life_s: float = 0.0, starvation_after_s: float | None = None, t0: float = D,
          ledger: Ledger | None = None) -> EventFeed:
    feed = EventFeed(QuotaDecider(), ledger=ledger, t0=t0)
    settings(feed, half_life_s, starvation_after_s)
    feed.queues(*queues)
    return feed


def cluster(*queues: QueueSpec, starvation_after_s: float | None = None,
            placement_timeout_s: float | None = 300.0) -> EventFeed:
    """The whole pipeline (admission, quota, placement, preemption)."""
    feed = pipeline()
    settings(feed, starvation_after_s=starvation_after_s, placement_timeout_s=placement_timeout_s)
    feed.queues(*queues)
    return feed


def run(feed: EventFeed, *jobs: tuple[str, Job]) -> None:
    """Admit jobs that must each get quota at once."""
    for job_id, j in jobs:
        assert brief(feed.admit(job_id, j)) == [("QuotaReserved", job_id)], job_id


def wait(feed: EventFeed, *jobs: tuple[str, Job]) -> None:
    """Admit jobs that must each wait."""
    for job_id, j in jobs:
        assert [kind for kind, _ in brief(feed.admit(job_id, j))][:1] == ["QuotaDeferred"], job_id


def outcome(decisions: list[EventBase], job_id: str) -> tuple[Any, ...]:
    """("reserved", borrowed GPUs, flavor) or ("deferred", code) for the job: its last quota decision."""
    mine = [d for d in decisions if isinstance(d, QuotaReserved | QuotaDeferred) and d.job_id == job_id]
    if not mine:
        return ("nothing",)
    last = mine[-1]
    if isinstance(last, QuotaReserved):
        return ("reserved", last.borrowed_milli / 1000, last.flavor)
    return ("deferred", last.code)


def reserved(decisions: list[EventBase]) -> list[str]:
    return [d.job_id for d in of(decisions, QuotaReserved)]
