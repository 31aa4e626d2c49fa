"""Preemption: whom to evict so that a waiting job can run.

Triggered when quota or placement defers a job for a reason eviction can cure, and re-considered on clock
ticks. Two kinds of victims:
  - reclaim (libs/core/preemption/reclaim.py): a queue under its nominal quota takes back quota its cohort lent to
    borrowers, once the queue's reclaim grace has passed, and a job holding quota within its nominal takes
    back the GPUs borrowers of the cohort hold (of any flavor) when it finds none. Whole jobs, each while its
    queue borrows: a queue that does not borrow loses nothing, a borrower at most one job below its nominal.
  - within the queue: jobs of lower priority in the preemptor's own queue.
Jobs of non-preemptible classes, jobs that have not yet run their class's minimum runtime, and jobs expected
to end within the settings' preempt_min_remaining_s anyway are never victims (quota lets a job that cannot be
preempted use only its queue's nominal quota, so no lender waits for one), except that a reclaim may take a
borrower whatever its class: one that borrows though it cannot be preempted became so through a policy change
after it started (its class made non-preemptible, its queue's nominal quota lowered under it). A queue's
blast-radius budget (`eviction_budget_gpus` per `eviction_window_s`) caps the evictions for priority within
that queue; a reclaim of lent quota is neither limited by it nor counted against it. The victims are a minimal set,
the least harm first (victim_sets.py), that a simulation (simulation.py) says makes
room by quota's and placement's own rules, counting the evictions already decided as done. No fit in
simulation, no eviction.

A job waiting for quota behind a job of higher priority of its queue is served only in the flavors no such job
waits for (holds.py): quota gives what is freed in the others to the higher job first.

A clock tick looks again (circumstances change without a new deferral): when anything changed, in each queue
at the first waiting job of each priority for each flavor quota does not hold that priority back from (and
the first there that may reclaim), the jobs quota would give what is freed there to first; at every job
whose reclaim grace just ended; and, when a protection ran out with time (a running job's minimum runtime,
a queue's eviction budget growing back), at every waiting job that could evict there. So a queue inside its
nominal quota waits for borrowers no longer than its reclaim grace plus the longest minimum runtime that
protects them (and the tick after).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from contracts import (
    ClockTick,
    EventBase,
    GpuHealthChanged,
    JobCancelled,
    JobCheckpointed,
    JobEvicted,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PlacementDeferred,
    PriorityClassesChanged,
    QueuePolicyChanged,
    QuotaDeferred,
    QuotaReleased,
    QuotaReserved,
    SchedulingSettingsChanged,
)
from libs.core.cluster.model import Cluster
from libs.core.kernel.decider import Chain, Decisions, Trigger
from libs.core.kernel.dependencies import PassDependencies, Reads
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.runs import CurrentRuns
from libs.core.preemption.cycle import consider, may_evict_for, tick
from libs.core.preemption.fold import fold
from libs.core.preemption.state import PreemptionState, World

__all__ = ["SERVICE", "PreemptionDecider"]

SERVICE = "preemption"
_NEXT_TICK = "looked at on the next tick: every fold but a tick's marks the world changed (fold.py), and the tick " \
             "tries again, in each queue, the first waiting job of each priority for each flavor quota does not " \
             "hold that priority back from, and the first there that may reclaim: the jobs quota would give what " \
             "is freed there to first (tick_jobs.first_of_each_priority)"
# What a preemption pass reads; a deferral asks about its job at once, the clock about every job a change may
# serve (libs/core/kernel/dependencies.py).
PASS = PassDependencies(
    reads=(Reads.QUEUES | Reads.CLASSES | Reads.SETTINGS | Reads.NODES | Reads.FREED | Reads.SUBMISSIONS
           | Reads.HELD | Reads.RESERVED | Reads.DEFERRALS | Reads.NOMINATIONS | Reads.RUNS | Reads.CLOCK),
    not_triggered=dict.fromkeys((Reads.QUEUES, Reads.CLASSES, Reads.SETTINGS, Reads.NODES, Reads.FREED,
                                 Reads.SUBMISSIONS, Reads.HELD, Reads.RESERVED, Reads.NOMINATIONS, Reads.RUNS),
                                _NEXT_TICK))


class PreemptionDecider:
    """The preemption service's decider: the fold (fold.py) and the cycle (cycle.py) over one World (state.py);
    `state`, `policy` and `cluster` are the world's, for those who read them."""

    name = SERVICE

    def __init__(self) -> None:
        self.chain = Chain()
        self.runs = CurrentRuns()  # executors' reports about runs that are over never reach it (run_decider)
        self.world = World()

    @property
    def state(self) -> PreemptionState:
        return self.world.state

    @property
    def policy(self) -> PolicyBook:
        return self.world.policy

    @property
    def cluster(self) -> Cluster:
        return self.world.cluster

    def input_types(self) -> Iterable[type[EventBase]]:
        return (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned, QueuePolicyChanged,
                PriorityClassesChanged, SchedulingSettingsChanged, JobSubmitted, QuotaReserved, QuotaReleased,
                QuotaDeferred, JobPlaced, PlacementDeferred, JobCancelled, JobFinished, JobFailed, JobEvicted,
                JobCheckpointed, ClockTick)

    def fold(self, event: EventBase) -> None:
        fold(self.world, event)

    def reacts_to(self) -> tuple[type[EventBase], ...]:
        """The inputs `react` may decide something about (PASS); to any other it answers [] and changes nothing."""
        return PASS.triggers(self.input_types())

    def react(self, trigger: Trigger) -> list[EventBase]:
        event = trigger.event
        if isinstance(event, QuotaDeferred | PlacementDeferred):
            if not may_evict_for(self.world, event.job_id):
                return []  # the common answer: no decision (and no need to prepare any)
            out = Decisions(SERVICE, trigger, self.fold, self.chain)
            consider(self.world, event.job_id, event.ts, out)
        elif isinstance(event, ClockTick):
            out = Decisions(SERVICE, trigger, self.fold, self.chain)
            tick(self.world, event.ts, out)
        else:
            return []  # nothing else is reacted to
        return out.out

    def snapshot(self) -> bytes:
        state, book = self.world.state, self.world.policy.quotas
        return msgspec.json.encode({"running": sorted(state.running), "in_flight": state.in_flight,
                                    "used": {f"{q}/{f}": u for (q, f), u in sorted(book.used.items()) if u},
                                    "waiting": {j: w.code for j, w in sorted(state.waiting.items())}})
