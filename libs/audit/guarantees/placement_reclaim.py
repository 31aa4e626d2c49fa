"""A job holding quota within its queue's nominal that waits for a place is owed the GPUs its quota stands for
within the same bound as a reclaim of quota (reclaim.py `reclaim_bound`): the GPUs may be held by borrowers its
queue's quota never counted against it (a borrower of another flavor of the cohort, one up or across the queue
tree, one that left the cohort while borrowing), and preemption takes them back once the job's grace is over
(libs/core/preemption/reclaim.py `placement_victims`).

Watched on every clock tick, per job. An episode begins when first seen: the job waits for a place holding
quota within its queue's nominal (not over budget, its queue at or below its nominal of the flavor) and does not
fit the free capacity. It is owed only while a reclaim that keeps nominal_protected could place it: the borrower
jobs that may go (reclaimable.py `placeable_without`) gone, it would fit. It ends when that is no longer so, and
breaks the guarantee once it outlasts its bound."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.audit.guarantees.holds import fits_now
from libs.audit.guarantees.reclaim import MAX_JOBS_NAMED, Episode, reclaim_bound
from libs.audit.guarantees.reclaimable import borrowers, placeable_without
from libs.audit.guarantees.violation import RECLAIM_WITHIN_BOUND, Violation, gpus
from libs.audit.guarantees.world import PLACEMENT, World


@dataclass(slots=True)
class PlacementReclaimWatch:
    episodes: dict[str, Episode] = field(default_factory=dict)
    excused: dict[str, float] = field(default_factory=dict)  # job -> the last tick no reclaim could place it

    def tick(self, seq: int, world: World, previous_tick: float | None, tick_s: float) -> list[Violation]:
        waiting = {j for j in world.placing if _owed_gpus(world, j)}
        for gone in [j for j in self.episodes if j not in waiting]:
            del self.episodes[gone]
        for gone in [j for j in self.excused if j not in world.placing]:
            del self.excused[gone]
        out = []
        for job_id in sorted(waiting):
            if not placeable_without(world, job_id):
                self.episodes.pop(job_id, None)
                self.excused[job_id] = world.now
                continue
            episode = self.episodes.get(job_id)
            if episode is None:
                episode = self.episodes[job_id] = self._begin(world, job_id, previous_tick)
            if not episode.reported and world.now - episode.start > episode.bound + 2 * tick_s:
                episode.reported = True
                out.append(self._broken(seq, world, job_id, episode, tick_s))
        return out

    def _begin(self, world: World, job_id: str, previous_tick: float | None) -> Episode:
        """Seen first on this tick: it began after the previous one, not before the job began to wait."""
        job = world.jobs[job_id]
        waits = job.place_wait_since if job.place_wait_since is not None else job.since
        start = max(previous_tick if previous_tick is not None else -float("inf"), waits,
                    self.excused.get(job_id, -float("inf")))
        bound, why = reclaim_bound(world, job.spec.queue, borrowers(world, job.spec.queue, None), [], start)
        return Episode(start, bound, why)

    def _broken(self, seq: int, world: World, job_id: str, episode: Episode, tick_s: float) -> Violation:
        job = world.jobs[job_id]
        queue, book = job.spec.queue, world.quota.book
        running = [j for j, _ in borrowers(world, queue, None)]
        detail = (f"job {job_id} of queue {queue} holds quota within its nominal (queue holds "
                  f"{gpus(book.usage(queue, job.flavor), job.flavor)} of nominal "
                  f"{book.limits[queue][job.flavor].nominal / 1000:g}) and waited {world.now - episode.start:g} s "
                  f"(since {episode.start:.0f}) for GPUs borrowers hold, past its bound of "
                  f"{episode.bound + 2 * tick_s:g} s ({episode.why} + two ticks {2 * tick_s:g} s); borrowers "
                  f"running: {', '.join(running[:MAX_JOBS_NAMED]) or 'none'}")
        return Violation(RECLAIM_WITHIN_BOUND, seq, (job_id,), detail)


def _owed_gpus(world: World, job_id: str) -> bool:
    """Does the job wait for a place holding quota within its queue's nominal, not fitting the free capacity?"""
    job = world.jobs.get(job_id)
    if job is None or job.phase != PLACEMENT or job.over_budget:
        return False
    book = world.quota.book
    lim = book.limits.get(job.spec.queue, {}).get(job.flavor)
    return (lim is not None and book.used.get((job.spec.queue, job.flavor), 0) <= lim.nominal
            and not fits_now(world, job.spec, job.flavor))
