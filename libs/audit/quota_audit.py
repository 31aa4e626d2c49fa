"""Quota limits checked against the log alone: every reservation is folded into the same QuotaBook the
quota decider uses, so the auditor and the decider can never disagree about what a limit means."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, QueuePolicyChanged, QuotaReleased, QuotaReserved
from libs.core.quotas import ANY, QuotaBook


def quota_violations(events: Iterable[EventBase]) -> list[str]:
    """One line per reservation that left its queue or its cohort above a limit. Each reservation is judged
    by the policy its decider knew: the policy events logged up to its trigger (a change logged between a
    trigger and its decision, which is published after later inputs, came too late to bind it)."""
    book = QuotaBook()
    held: dict[str, tuple[str, str, int, bool]] = {}  # job id -> (queue, flavor, milli, over budget)
    position: dict[str, int] = {}
    policy: list[tuple[int, QueuePolicyChanged]] = []  # not yet applied
    out: list[str] = []
    for i, e in enumerate(events):
        position[e.id] = i
        if isinstance(e, QueuePolicyChanged):
            policy.append((i, e))
        elif isinstance(e, QuotaReserved):
            trigger = position.get(e.causation_id, i)
            while policy and policy[0][0] <= trigger:
                book.set_queue(policy.pop(0)[1].queue)
            key = e.flavor or ANY
            book.add(e.queue, key, e.gpu_milli, e.over_budget)
            held[e.job_id] = (e.queue, key, e.gpu_milli, e.over_budget)
            broken = book.violations(e.queue, key)
            if broken:
                out.append(f"{e.job_id} ({e.id}): {'; '.join(broken)}")
        elif isinstance(e, QuotaReleased) and e.job_id in held:
            # The amount reserved, not the event's own figure: a release undoes exactly its reservation.
            queue, key, milli, over = held.pop(e.job_id)
            book.add(queue, key, -milli, over)
    return out
