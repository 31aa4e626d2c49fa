"""A reservation takes the first flavor its queue's flavor fungibility lets it take: quota tries the job's flavors
in the order `libs/core/quota/reserve.py` `flavors_to_try` gives (the queue's order with when_can_borrow borrow;
with try-next-flavor, the flavors whose nominal quota holds the job first; the flavor its last reservation timed
out in last), and reserves in the first with room. A reservation that took a flavor while one tried before it had
room for the job, and no hold of the deciders kept the job from it, broke that order: with try-next-flavor, a job
that borrowed while its queue's own quota of a later flavor held it; with borrow, a job that passed over a flavor
where it could borrow.

Judged on the World (the quota decider's own state, folded by its own fold) just before the reservation, as the
decider saw it: not where something that changes room (a release, a policy or node change) was logged between
the decision's trigger and the decision by another reaction (a live log decides later than it triggers). The
holds the checker can see are respected, each conservatively: a job of higher priority of the queue waiting for
quota (it holds the lower jobs back in the flavors it could use), the cohort's starving job, a nominated
preemptor the reservation would leave without room, a queue under its nominal waiting for lent quota (no
borrower grows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts import EventBase, QueuePolicyChanged, QuotaReleased, QuotaReserved, SchedulingSettingsChanged
from libs.audit.guarantees.holds import higher_priority_hold, lender_waits, starving_quota_hold
from libs.audit.guarantees.violation import FLAVOR_FUNGIBILITY, Violation, gpus
from libs.audit.guarantees.world import QUOTA, World
from libs.core.kernel.quota_math import ANY
from libs.core.kernel.usable_flavors import MODEL_EVENTS
from libs.core.quota.fit import may_borrow
from libs.core.quota.nomination import holding_nominee, nominees
from libs.core.quota.reserve import flavors_to_try
from libs.core.quota.state import Cycle, QuotaJob

# What changes a queue's room or the flavors a job may use, logged by another reaction between a decision's
# trigger and the decision: the decider did not know it, and the decision is not judged.
ROOM_CHANGES = (QuotaReleased, QueuePolicyChanged, SchedulingSettingsChanged, *MODEL_EVENTS)


@dataclass(slots=True)
class FlavorFungibility:
    # (seq, trigger_seq) of each event of ROOM_CHANGES, in log order
    changes: list[tuple[int, int]] = field(default_factory=list)

    def fold(self, seq: int, event: EventBase) -> None:
        if isinstance(event, ROOM_CHANGES):
            self.changes.append((seq, event.trigger_seq))

    def reserved(self, seq: int, event: QuotaReserved, world: World) -> list[Violation]:
        """The reservation, judged on the world before it (call before the world folds it)."""
        # (a decision logged without its trigger is judged where it stands)
        if event.over_budget or self._changed_since(event.trigger_seq or seq):
            return []
        job = world.quota.jobs.get(event.job_id)
        held = world.jobs.get(event.job_id)
        if job is None or held is None or held.phase != QUOTA or not world.quota.book.governed(event.queue):
            return []
        taken = event.flavor or ANY
        tried = flavors_to_try(world.quota, job, Cycle(now=world.now), False)
        if taken not in tried:
            return []  # a flavor the job may not take at all is quota_ceiling's or queue_policy's to judge
        for flavor in tried[:tried.index(taken)]:
            if _had_room(world, job, flavor) and not _held(world, event.job_id, job):
                return [Violation(FLAVOR_FUNGIBILITY, seq, (event.job_id,),
                                  f"job {event.job_id} of queue {event.queue} took flavor {taken} while flavor "
                                  f"{flavor}, tried before it, had room for its {gpus(job.demand)} (queue "
                                  f"{event.queue}'s when_can_borrow "
                                  f"{getattr(world.quota.policy.queues.get(event.queue), 'when_can_borrow', '')})")]
        return []

    def _changed_since(self, trigger_seq: int) -> bool:
        """Did another reaction log a room change after the decision's trigger?"""
        for at, trigger in reversed(self.changes):
            if at <= trigger_seq:
                return False
            if trigger != trigger_seq:
                return True
        return False


def _held(world: World, job_id: str, job: QuotaJob) -> bool:
    """Does a hold the checker sees keep the job from some flavor (conservatively: from every flavor)?"""
    return bool(higher_priority_hold(world, job_id, job.spec) or starving_quota_hold(world, job_id, job.spec))


def _had_room(world: World, job: QuotaJob, flavor: str) -> bool:
    """Could quota have reserved the job in `flavor`: room for it (within its queue's nominal for a job that may
    not borrow), no lender waiting for the flavor's lent quota while it would borrow, no nominee it would leave
    without room?"""
    state = world.quota
    book = state.book
    room = book.room(job.queue, flavor)
    if not may_borrow(state, job):
        room = min(room, book.nominal_left(job.queue, flavor))
    if job.demand > room or lender_waits(world, job.spec, flavor):
        return False
    cohort = book.cohort.get(job.queue, "")
    waiting = nominees(state, book.members.get(cohort, [job.queue]) if cohort else [job.queue], world.now)
    return not waiting or holding_nominee(state, waiting, job, flavor, False) is None
