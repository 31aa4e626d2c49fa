"""Quota limits checked against the log alone: every reservation is folded into the same QuotaBook the
quota decider uses, so the auditor and the decider can never disagree about what a limit means."""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, JobPlaced, JobSpec, JobSubmitted, QueuePolicyChanged, QuotaReleased, QuotaReserved
from libs.core.kernel.flavors import reservation_model
from libs.core.kernel.quota_math import ANY, QuotaBook


def quota_violations(events: Iterable[EventBase]) -> list[str]:
    """One line per reservation that left its queue or its cohort above a limit. Each reservation is judged
    by the policy its decider knew: the policy events logged up to its trigger (a change logged between a
    trigger and its decision, which is published after later inputs, came too late to bind it)."""
    book = QuotaBook()
    held: dict[str, tuple[str, str, int, bool]] = {}  # job id -> (queue, flavor, milli, over budget)
    models: dict[str, str] = {}  # job id -> the GPU model its reservation is for (reservation_model)
    placed_unheld: dict[str, str] = {}  # job id -> the model it was placed on holding no reservation
    specs: dict[str, JobSpec] = {}
    position: dict[str, int] = {}
    policy: list[tuple[int, QueuePolicyChanged]] = []  # not yet applied
    out: list[str] = []
    for i, e in enumerate(events):
        position[e.id] = i
        if isinstance(e, QueuePolicyChanged):
            policy.append((i, e))
        elif isinstance(e, JobSubmitted):
            specs[e.job_id] = e.spec
        elif isinstance(e, JobPlaced) and e.job_id in held:
            models[e.job_id] = next((r.model for r in e.placements if r.model), "") or models.get(e.job_id, "")
            queue, key, milli, over = held[e.job_id]
            held[e.job_id] = (queue, book.recharge_placed(queue, key, models[e.job_id], milli, over), milli, over)
        elif isinstance(e, JobPlaced):  # placed as its quota went back: its next reservation is for that model
            placed_unheld[e.job_id] = next((r.model for r in e.placements if r.model), "")
        elif isinstance(e, QuotaReserved):
            trigger = position.get(e.causation_id, i)
            while policy and policy[0][0] <= trigger:
                _apply(book, held, models, policy.pop(0)[1])
            key = e.flavor or ANY
            book.add(e.queue, key, e.gpu_milli, e.over_budget)
            held[e.job_id] = (e.queue, key, e.gpu_milli, e.over_budget)
            models[e.job_id] = reservation_model(key, placed_unheld.pop(e.job_id, ""), specs.get(e.job_id))
            broken = book.violations(e.queue, key)
            if broken:
                out.append(f"{e.job_id} ({e.id}): {'; '.join(broken)}")
        elif isinstance(e, QuotaReleased) and e.job_id in held:
            # The amount reserved, not the event's own figure: a release undoes exactly its reservation.
            queue, key, milli, over = held.pop(e.job_id)
            models.pop(e.job_id, None)
            book.add(queue, key, -milli, over)
    return out


def _apply(book: QuotaBook, held: dict[str, tuple[str, str, int, bool]], models: dict[str, str],
           event: QueuePolicyChanged) -> None:
    """A queue's new policy; its reservations follow its current flavors (QuotaBook.recharge, as the quota
    decider moves them)."""
    name = event.queue.name
    book.set_queue(event.queue)
    for job, (queue, flavor, milli, over) in list(held.items()):
        if queue == name:
            held[job] = (queue, book.recharge(queue, flavor, models.get(job, ""), milli, over), milli, over)
