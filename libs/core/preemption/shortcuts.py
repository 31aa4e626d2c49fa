"""Speed shortcuts of the preemption cycle, apart from its meaning: each skips work whose answer is known, and
tests/unit/core/kernel/test_shortcuts_change_no_decision.py turns each off to prove the decisions the same the
long way."""

from __future__ import annotations

from libs.core.cluster.job_fit import placement_shape
from libs.core.kernel.policy import PolicyBook
from libs.core.kernel.queue_policies import evicts_equal_priority
from libs.core.preemption.candidates import las_level
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import PLACEMENT, PreemptionState, Running

AlikeKey = tuple[object, ...]


def alike_key(state: PreemptionState, policy: PolicyBook, job_id: str, now: float, preemptors: set[str]
              ) -> AlikeKey | None:
    """What the cycle reads of a job waiting for quota besides its id: its queue, class, request (as
    placement sees it), whether its reclaim grace is over, whether it is below its queue's LAS threshold, and
    (in a queue whose jobs may evict newer jobs of their priority) when it was submitted.
    None for one whose id matters too: a preemptor or a victim of earlier evictions (never each other's
    victims again), one waiting for placement (its own reservation and timeout), one not waiting."""
    spec, waiting = state.specs.get(job_id), state.waiting.get(job_id)
    if spec is None or waiting is None or waiting.code == PLACEMENT or job_id in preemptors or (
            job_id in state.preempted_by):
        return None
    queue = policy.queues.get(spec.queue)
    grace_over = state.grace_over(job_id, queue.reclaim_after_s if queue is not None else 0.0, now)
    below_las = las_level(state, policy, spec.queue, job_id, now) is None
    # Where newer jobs of its priority may go, which they are depends on when it was submitted.
    arrived = state.submitted.get(job_id) if evicts_equal_priority(queue) else None
    return (spec.queue, placement_shape(spec, ""), grace_over, below_las, arrived)


class AlikeJobs:
    """Within one tick, waiting jobs alike to the cycle (alike_key) find victims alike: once one found none, with
    nothing decided since, the others would not either (a queue of many alike jobs waits often)."""

    def __init__(self, state: PreemptionState, policy: PolicyBook, now: float) -> None:
        self.state = state
        self.policy = policy
        self.now = now
        self.came_to_nothing: set[AlikeKey] = set()
        # The preemptors of evictions decided before this tick (the tick's own decisions clear the set anyway).
        self.preemptors = {preemptor for preemptors in state.preempted_by.values() for preemptor in preemptors}
        self._last: AlikeKey | None = None

    def skip(self, job_id: str) -> bool:
        """Did a job alike to this one come to nothing, with nothing decided since?"""
        self._last = alike_key(self.state, self.policy, job_id, self.now, self.preemptors)
        return self._last is not None and self._last in self.came_to_nothing

    def tried(self, decided: bool) -> None:
        """The job last asked about (skip) was tried: `decided` whether an eviction was decided for it."""
        if decided:
            self.came_to_nothing.clear()
        elif self._last is not None:
            self.came_to_nothing.add(self._last)


def could_fit_nominal(sim: Simulation, flavor: str, own: list[Running]) -> bool:
    """Could the preemptor fit its queue's nominal quota of the flavor with some victims gone? Only evicting the
    queue's own jobs (`own`) brings its usage down: if it would not fit with all of them gone, no victim set is
    enough, and the search, which would try set after set to find that out, is skipped."""
    return sim.within_nominal(flavor, freed=sum(run.demand for run in own))
