"""Quota limits folded from the log into the core's own QuotaBook (so a limit means here exactly what it means
to the quota decider): each reservation within its queue's nominal plus borrowing limit, each cohort
borrowing no more than its queues lend, each parent queue's quota bounding its subtree, and each reclaim taking
a queue's jobs only while it borrows (at most one job below its nominal, none from a queue that does not borrow).

A decision is judged by the policy its decider knew: the policy events logged up to its trigger (a change
logged between a trigger and its decision came too late to bind it)."""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass, field, replace

from contracts import JobPlaced, JobSpec, PreemptionDecided, QueuePolicyChanged, QuotaReleased, QuotaReserved
from libs.audit.guarantees.violation import (
    LENDING_LIMIT,
    PARENT_QUOTA,
    QUOTA_CEILING,
    RECLAIM_ONLY_WHILE_BORROWING,
    Violation,
    gpus,
)
from libs.core.kernel.flavors import reservation_model
from libs.core.kernel.queue_limits import Limits, subtree_taken_while_borrowing, taken_while_borrowing
from libs.core.kernel.quota_math import ANY, UNLIMITED, QuotaBook

UNBOUNDED = sys.maxsize


@dataclass(frozen=True, slots=True)
class Held:
    queue: str
    flavor: str
    milli: int
    over_budget: bool
    model: str = ""  # the GPU model it is for (libs/core/kernel/flavors.py reservation_model): its flavor follows it


def _gpus(milli: int) -> str:
    return f"{milli / 1000:g}"


@dataclass(slots=True)
class QuotaLimits:
    book: QuotaBook = field(default_factory=QuotaBook)
    held: dict[str, Held] = field(default_factory=dict)
    # Policy events logged but not yet binding on any decision: (seq, event).
    policy: list[tuple[int, QueuePolicyChanged]] = field(default_factory=list)
    # (ancestor queue, flavor) -> what its subtree holds of the flavor (over-budget usage included).
    subtree: dict[tuple[str, str], int] = field(default_factory=dict)
    # Victims chosen by a reclaim and not released yet: they leave their queue, whatever comes next.
    leaving: dict[str, None] = field(default_factory=dict)
    # The sequence being folded, and per (queue, flavor) what a reclaim could take from it over time, as
    # (seq, milli) at each change: a reclaim is judged by what its queue held at the decision's trigger (what
    # the decider knew), not after jobs that ended meanwhile (a live log decides later than it triggers).
    seq: int = 0
    takeable: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)
    # Jobs placed while holding no reservation (placed as their quota went back): the model their next
    # reservation is for, as the quota decider keeps it.
    placed_unheld: dict[str, str] = field(default_factory=dict)

    # --- folding -----------------------------------------------------------------------------------

    def queue_policy(self, seq: int, event: QueuePolicyChanged) -> None:
        self.policy.append((seq, event))

    def bind_policy(self, trigger_seq: int) -> None:
        """Apply the policy events logged up to `trigger_seq` (the decision's trigger)."""
        applied = False
        while self.policy and self.policy[0][0] <= trigger_seq:
            at, event = self.policy.pop(0)
            self.book.set_queue(event.queue)
            self._recharge(event.queue.name, at)
            applied = True
        if applied:
            self._recount_subtrees()

    def _recharge(self, queue: str, at: int) -> None:
        """The queue's reservations follow its current flavors, through the core's own QuotaBook.recharge (as the
        quota decider moves them), from the policy event's sequence `at` on."""
        for job, held in list(self.held.items()):
            if held.queue != queue:
                continue
            target = self.book.recharge(queue, held.flavor, held.model, held.milli, held.over_budget)
            if target != held.flavor:
                self.held[job] = replace(held, flavor=target)
                self._record(queue, held.flavor, at)
                self._record(queue, target, at)

    def placed(self, event: JobPlaced) -> None:
        """The job's reservation is for the model it was placed on from now on; charged to a flavor its queue no
        longer has, it moves to that model's, through the core's own QuotaBook.recharge_placed."""
        held = self.held.get(event.job_id)
        model = next((r.model for r in event.placements if r.model), "")
        if held is None:
            if model:
                self.placed_unheld[event.job_id] = model
            return
        if not model:
            return
        target = self.book.recharge_placed(held.queue, held.flavor, model, held.milli, held.over_budget)
        self.held[event.job_id] = replace(held, model=model, flavor=target)
        if target != held.flavor:
            self._record(held.queue, held.flavor)
            self._record(held.queue, target)
            self._recount_subtrees()

    def reserved(self, seq: int, event: QuotaReserved, spec: JobSpec | None = None) -> list[Violation]:
        self.bind_policy(event.trigger_seq or seq)
        flavor = event.flavor or ANY
        placed = self.placed_unheld.pop(event.job_id, "")
        held = Held(event.queue, flavor, event.gpu_milli, event.over_budget, reservation_model(flavor, placed, spec))
        borrowed_before = self.book.pool_used.get((self.book.cohort.get(held.queue, ""), held.flavor), 0)
        if event.job_id in self.held:  # reserved twice: the second replaces the first
            self._take(event.job_id, -1)
        self.held[event.job_id] = held
        self._take(event.job_id, +1)
        return [*self._ceiling(seq, event.job_id, held), *self._lending(seq, event.job_id, held, borrowed_before),
                *self._parents(seq, event.job_id, held)]

    def released(self, event: QuotaReleased) -> None:
        if event.job_id in self.held:
            # The amount reserved, not the event's own figure: a release undoes exactly its reservation.
            self._take(event.job_id, -1)
            held = self.held.pop(event.job_id)
            self.leaving.pop(event.job_id, None)
            self._record(held.queue, held.flavor)
        self.leaving.pop(event.job_id, None)
        self.placed_unheld.pop(event.job_id, None)

    def preemption(self, seq: int, event: PreemptionDecided, specs: dict[str, JobSpec]) -> list[Violation]:
        """A reclaim takes another queue's jobs only while it borrows: with every victim of it but the largest
        gone, the queue still holds more than its nominal, or its subtree does so at each of its ancestors with
        quota that the lender does not share (libs/core/kernel/queue_limits.py subtree_taken_while_borrowing,
        the rule preemption takes victims by)."""
        self.bind_policy(event.trigger_seq or seq)
        preemptor = specs.get(event.preemptor_id)
        own_queue = preemptor.queue if preemptor is not None else ""
        taken: dict[tuple[str, str], list[str]] = {}
        for v in event.victims:
            held = self.held.get(v.job_id)
            if v.queue == own_queue or held is None or held.over_budget or v.job_id in self.leaving:
                continue  # within its own queue, not holding quota, borrowed outright, or leaving already
            taken.setdefault((held.queue, held.flavor), []).append(v.job_id)
        out = []
        at = event.trigger_seq or seq
        for (queue, flavor), victims in sorted(taken.items()):
            lim = self.book.limits.get(queue, {}).get(flavor)
            branch = self._branch_levels(queue, flavor, own_queue, taken, at)
            if lim is None and not branch:
                continue
            now = self._takeable_at(queue, flavor, at)
            gone = sum(self.held[v].milli for v in victims)
            largest = max(self.held[v].milli for v in victims)
            own = None if lim is None else (now, gone, largest, lim.nominal)
            if subtree_taken_while_borrowing(own, [level for _, level in branch]):
                continue
            out.append(Violation(
                RECLAIM_ONLY_WHILE_BORROWING, seq, (event.preemptor_id, *victims),
                f"reclaim for {event.preemptor_id} ({own_queue or 'unknown queue'}) evicts {', '.join(victims)} "
                f"of queue {queue}, taking it from {_gpus(now)} to {gpus(now - gone, flavor)}, "
                f"{_not_borrowing(own, branch)}"))
        for v in event.victims:
            if v.queue != own_queue:
                self.leaving[v.job_id] = None
                if (held := self.held.get(v.job_id)) is not None:
                    self._record(held.queue, held.flavor)
        return out

    def _branch_levels(self, queue: str, flavor: str, lender: str, taken: dict[tuple[str, str], list[str]],
                       at: int) -> list[tuple[str, tuple[int, int, int, int]]]:
        """The victims' queue's ancestors that the lender does not share (QuotaBook.unshared_levels), each with
        its level as the reclaim rule reads it: what its subtree held of the flavor it counts the victims' flavor
        as, as of sequence `at`, the decision's victims under it of those flavors, the largest of them, and its
        nominal."""
        book, levels = self.book, []
        for ancestor, covered in book.unshared_levels(queue, flavor, lender):
            inside = set(book.subtree_of(ancestor))
            counted = {key for key in (*self.takeable, *taken)
                       if key[0] in inside and book.covering(ancestor, key[1]) == covered}
            held = sum(self._takeable_at(q, f, at) for q, f in counted)
            milli = [self.held[v].milli for key in counted for v in taken.get(key, ())]
            levels.append((ancestor, (held, sum(milli), max(milli), book.limits[ancestor][covered].nominal)))
        return levels

    # --- checks ------------------------------------------------------------------------------------

    def _ceiling(self, seq: int, job: str, held: Held) -> list[Violation]:
        queue, flavor = held.queue, held.flavor
        if not self.book.governed(queue):
            return []
        lim = self.book.limits[queue].get(flavor)
        if lim is None:
            return [Violation(QUOTA_CEILING, seq, (job,),
                              f"job {job} reserved {gpus(held.milli, flavor)} of queue {queue}, which has no quota "
                              "of that flavor")]
        used = self.book.usage(queue, flavor)
        cap = _cap(lim, bool(self.book.cohort.get(queue)))
        if used <= cap:
            return []
        return [Violation(QUOTA_CEILING, seq, (job,),
                          f"job {job} took queue {queue} to {gpus(used, flavor)}, above nominal + borrowing limit "
                          f"{_gpus(cap)}")]

    def _lending(self, seq: int, job: str, held: Held, borrowed_before: int) -> list[Violation]:
        """The reservation added to its cohort's borrowing and left it above what the cohort's queues lend.
        A reservation that adds nothing to it (within its queue's guaranteed part, or of a queue without quota)
        breaks nothing, even while the cohort borrows above the limit: that happens when a lending limit is
        lowered, or a queue holding quota joins the cohort, while quota is lent, and it is no reservation's
        doing (what was lent stays out until its borrowers give it back)."""
        cohort = self.book.cohort.get(held.queue, "")
        key = (cohort, held.flavor)
        if not cohort or key not in self.book.pool:
            return []
        borrowed = self.book.pool_used[key]
        if borrowed <= self.book.pool[key] or borrowed <= borrowed_before:
            return []
        members = self.book.members.get(cohort, [])
        lenders = [f"{q} lends {_gpus(lim.lend)} of {_gpus(lim.nominal)}" for q in members
                   if (lim := self.book.limits.get(q, {}).get(held.flavor)) is not None]
        return [Violation(LENDING_LIMIT, seq, (job,),
                          f"job {job} made cohort {cohort} borrow {gpus(borrowed, held.flavor)}, above the "
                          f"{_gpus(self.book.pool[key])} its queues may lend ({'; '.join(lenders)}; it borrowed "
                          f"{_gpus(borrowed_before)} before)")]

    def _parents(self, seq: int, job: str, held: Held) -> list[Violation]:
        out = []
        for ancestor in self._ancestors(held.queue):
            for flavor, lim in self.book.limits.get(ancestor, {}).items():
                if flavor not in (ANY, held.flavor):
                    continue
                used = self._subtree_usage(ancestor, flavor)
                cap = _cap(lim, bool(self.book.cohort.get(ancestor)))
                if used > cap:
                    out.append(Violation(PARENT_QUOTA, seq, (job,),
                                         f"job {job} took the subtree of {ancestor} to {gpus(used, flavor)}, above "
                                         f"its quota {_gpus(cap)}"))
        return out

    # --- bookkeeping -------------------------------------------------------------------------------

    def _take(self, job: str, sign: int) -> None:
        held = self.held[job]
        self.book.add(held.queue, held.flavor, sign * held.milli, held.over_budget)
        self._record(held.queue, held.flavor)
        for ancestor in self._ancestors(held.queue):
            key = (ancestor, held.flavor)
            self.subtree[key] = self.subtree.get(key, 0) + sign * held.milli

    def _record(self, queue: str, flavor: str, at: int | None = None) -> None:
        """What a reclaim could take from the queue's flavor now: its usage within quota, less victims leaving;
        as of sequence `at` (a policy event bound late), else the one being folded."""
        leaving = sum(h.milli for j, h in self.held.items() if j in self.leaving
                      and (h.queue, h.flavor) == (queue, flavor) and not h.over_budget)
        history = self.takeable.setdefault((queue, flavor), [])
        value = self.book.used.get((queue, flavor), 0) - leaving
        seq = self.seq if at is None else at
        if history:
            seq = max(seq, history[-1][0])  # the history stays in order
        if history and history[-1][0] == seq:
            history[-1] = (seq, value)
        else:
            history.append((seq, value))

    def _takeable_at(self, queue: str, flavor: str, seq: int) -> int:
        """What the queue's flavor held as of `seq` (its last change at or before it; 0 before any)."""
        history = self.takeable.get((queue, flavor), [])
        i = bisect.bisect_right(history, (seq, UNBOUNDED)) - 1
        return history[i][1] if i >= 0 else 0

    def _recount_subtrees(self) -> None:
        self.subtree = {}
        for job in self.held:
            held = self.held[job]
            for ancestor in self._ancestors(held.queue):
                key = (ancestor, held.flavor)
                self.subtree[key] = self.subtree.get(key, 0) + held.milli

    def _ancestors(self, queue: str) -> list[str]:
        """The queue's parents, nearest first (a cycle, which admission refuses, ends the walk)."""
        out: list[str] = []
        spec = self.book.queues.get(queue)
        while spec is not None and spec.parent and spec.parent not in out and spec.parent != queue:
            out.append(spec.parent)
            spec = self.book.queues.get(spec.parent)
        return out

    def _subtree_usage(self, ancestor: str, flavor: str) -> int:
        own = self.book.usage(ancestor, flavor) if flavor != ANY else sum(
            u for (q, _), u in self.book.used.items() if q == ancestor) + sum(
            u for (q, _), u in self.book.over.items() if q == ancestor)
        if flavor != ANY:
            return own + self.subtree.get((ancestor, flavor), 0)
        return own + sum(u for (a, _), u in self.subtree.items() if a == ancestor)


def _cap(lim: Limits, in_cohort: bool) -> int:
    """The most a queue may hold of a flavor: its nominal, plus its borrowing limit inside a cohort."""
    if not in_cohort:
        return lim.nominal
    return UNLIMITED if lim.borrow is None else lim.nominal + lim.borrow


def _not_borrowing(own: tuple[int, int, int, int] | None,
                   branch: list[tuple[str, tuple[int, int, int, int]]]) -> str:
    """Why the reclaim rule (queue_limits.subtree_taken_while_borrowing) refused the victims."""
    parts = []
    if own is not None and not branch:
        now, gone, largest, nominal = own
        parts.append(f"which does not borrow (nominal {_gpus(nominal)})" if now <= nominal else
                     f"more than one job below its nominal {_gpus(nominal)} (its victims but the largest "
                     f"leave it {_gpus(now - gone + largest)}: it no longer borrows)")
    for ancestor, (held, gone, largest, nominal) in branch:
        if not taken_while_borrowing(held, gone, largest, nominal):
            parts.append(f"its parent {ancestor}, which the lender does not share, holding {_gpus(held)} of nominal "
                         f"{_gpus(nominal)}, would be left {_gpus(held - gone + largest)} with its victims but the "
                         f"largest gone: it does not borrow so much")
    return "; ".join(parts)
