"""A queue under its nominal quota with pending work gets the quota it lent back within a bound: its reclaim
grace (`reclaim_after_s`), plus the longest protection its borrowers have from eviction (their class's minimum
runtime still to run and the checkpoint grace they get when told to stop; for a borrower whose quota is
reserved but which is not placed, the rest of the placement timeout after which it gives its quota back),
plus what the settings and budgets allow on purpose (a job about to end is left to end; an eviction budget
defers evictions to its next window), plus two clock ticks (decisions happen on ticks).

Watched on every clock tick. An episode of a (queue, flavor) begins when first seen: the queue's first job in
turn in the flavor (of its highest priority waiting there, the smallest: the jobs below wait behind it by the
queue's own order; never one backing off, held by its user's limit, that no node present could hold or that its
queue could never hold, which no reclaim would let run: see holds.first_waiting) fits what is left of its nominal
quota but not the room its cohort leaves it, the one rule quota and preemption ask too
(libs/core/kernel/lent_quota.py). It ends when that is no longer so, and breaks the
guarantee once it outlasts its bound. A first job that would have to borrow is owed no reclaim, nor are the
jobs waiting behind it; nor is a queue while taking back what borrowers hold would still leave that job without
room or a place (see reclaimable.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.audit.guarantees.holds import reclaim_due
from libs.audit.guarantees.reclaimable import borrowers, reclaimable
from libs.audit.guarantees.violation import RECLAIM_WITHIN_BOUND, Violation, gpus
from libs.audit.guarantees.world import PLACEMENT, JobState, World
from libs.core.kernel.policy import demand_milli

MAX_JOBS_NAMED = 5


@dataclass(slots=True)
class Episode:
    start: float
    bound: float  # without the two ticks' slack, which is added as the tick interval becomes known
    why: str  # what makes up the bound
    reported: bool = False


def reclaim_bound(world: World, queue: str, running: list[tuple[str, JobState]],
                  unplaced: list[tuple[str, JobState]], start: float) -> tuple[float, str]:
    """The bound a reclaim for the queue is owed within, from `start`, without the two ticks' slack, and what
    makes it up: the queue's grace, the longest protection of the borrowers (`running`, and `unplaced` ones
    reserved but not placed), about-to-end, and a borrower queue's eviction window."""
    policy = world.quota.policy
    spec = policy.queues.get(queue)
    grace = spec.reclaim_after_s if spec is not None else 0.0
    protection, budget_window = 0.0, 0.0
    for _, job in running:
        cls = policy.classes.get(job.spec.priority)
        if cls is not None:
            protection = max(protection, max(0.0, job.since + job.min_runtime_s - start) + cls.checkpoint_grace_s)
        borrower = policy.queues.get(job.spec.queue)
        if borrower is not None and borrower.eviction_budget_gpus is not None:
            budget_window = max(budget_window, borrower.eviction_window_s)
    # A borrower reserved but not placed cannot be evicted; it gives its quota back once placement has not
    # placed it for the settings' placement timeout (when there is one).
    timeout = getattr(policy.settings, "placement_timeout_s", None)
    if timeout is not None:
        for _, job in unplaced:
            protection = max(protection, max(0.0, job.since + timeout - start))
    ending = policy.settings.preempt_min_remaining_s
    why = (f"reclaim_after {grace:g} s + borrowers' protection {protection:g} s + about-to-end {ending:g} s"
           + (f" + eviction window {budget_window:g} s" if budget_window else ""))
    return grace + protection + ending + budget_window, why


@dataclass(slots=True)
class ReclaimWatch:
    episodes: dict[tuple[str, str], Episode] = field(default_factory=dict)
    # (queue, flavor) -> the last tick at which no reclaim could have served it (see reclaimable.py)
    excused: dict[tuple[str, str], float] = field(default_factory=dict)
    last_tick: float | None = None
    tick_s: float = 0.0  # the longest gap between two ticks seen

    def tick(self, seq: int, world: World) -> list[Violation]:
        now = world.now
        previous = self.last_tick
        if previous is not None:
            self.tick_s = max(self.tick_s, now - previous)
        self.last_tick = now
        book = world.quota.book
        waiting = {(q, f) for q, levels in world.quota.pending.items() if levels
                   for f in book.limits.get(q, {}) if reclaim_due(world, q, f)}
        for key in [k for k in self.episodes if k not in waiting]:
            del self.episodes[key]
        for key in [k for k in self.excused if k not in waiting]:
            del self.excused[key]
        out = []
        for key in sorted(waiting):
            if not reclaimable(world, *key):
                self.episodes.pop(key, None)
                self.excused[key] = now
                continue
            episode = self.episodes.get(key)
            if episode is None:
                episode = self.episodes[key] = self._begin(world, *key, previous)
            if not episode.reported and now - episode.start > episode.bound + 2 * self.tick_s:
                episode.reported = True
                out.append(self._broken(seq, world, key, episode))
        return out

    def _begin(self, world: World, queue: str, flavor: str, previous_tick: float | None) -> Episode:
        """An episode seen first on this tick began after the previous one, and not before the queue's
        longest-waiting job began to wait."""
        waits = world.quota.by_wait_in.get(queue)
        start = max(previous_tick if previous_tick is not None else -float("inf"),
                    waits[0][0] if waits else world.now, self.excused.get((queue, flavor), -float("inf")))
        bound, why = reclaim_bound(world, queue, borrowers(world, queue, flavor),
                                   borrowers(world, queue, flavor, PLACEMENT), start)
        return Episode(start, bound, why)

    def _broken(self, seq: int, world: World, key: tuple[str, str], episode: Episode) -> Violation:
        queue, flavor = key
        book = world.quota.book
        waiting = sorted(j for users in world.quota.pending.get(queue, {}).values() for keys in users.values()
                         for _, j in keys)[:MAX_JOBS_NAMED]
        running = borrowers(world, queue, flavor)
        stuck = [j for j, job in running if not world.quota.policy.preemptible(job.spec)]
        unplaced = [j for j, _ in borrowers(world, queue, flavor, PLACEMENT)]
        # An eviction budget smaller than a job protects that job from every reclaim, in every window.
        budgets = world.quota.policy.queues
        shielded = [j for j, job in running if (b := budgets.get(job.spec.queue)) is not None
                    and b.eviction_budget_gpus is not None and b.eviction_budget_gpus * 1000 < demand_milli(job.spec)]
        detail = (f"queue {queue} waited {world.now - episode.start:g} s (since {episode.start:.0f}) for quota "
                  f"lent out (holds {gpus(book.usage(queue, flavor), flavor)} of nominal "
                  f"{book.limits[queue][flavor].nominal / 1000:g}, room {book.room(queue, flavor) / 1000:g}), "
                  f"past its bound of {episode.bound + 2 * self.tick_s:g} s ({episode.why} + two ticks "
                  f"{2 * self.tick_s:g} s); borrowers running: "
                  f"{', '.join(j for j, _ in running[:MAX_JOBS_NAMED]) or 'none'}"
                  + (f"; not preemptible: {', '.join(stuck[:MAX_JOBS_NAMED])}" if stuck else "")
                  + (f"; reserved, waiting for a place: {', '.join(unplaced[:MAX_JOBS_NAMED])}" if unplaced else "")
                  + (f"; larger than their queue's eviction budget: {', '.join(shielded[:MAX_JOBS_NAMED])}"
                     if shielded else ""))
        return Violation(RECLAIM_WITHIN_BOUND, seq, tuple(waiting), detail)
