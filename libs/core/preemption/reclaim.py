"""Reclaim: a queue under its nominal quota takes back the quota its cohort lent to borrowers.

Once the queue's reclaim grace has passed, a waiting job that fits its queue's nominal quota of a flavor may
evict jobs holding borrowed quota of that flavor: jobs of the cohort's other queues while they are above
their nominal quota, and only as far as they borrow (a reclaim never takes a queue below its nominal quota),
jobs admitted over budget (borrowed outright), and, if the queue itself is above its nominal, its own jobs of
lower priority. A victim set is chosen only if the job would then fit its nominal quota, get its room in the
cohort by quota's rules and be placed (see preemption_sim); the flavors are tried in the queue's order.

A job that holds quota within its queue's nominal but finds no GPUs (it waits for placement) may reclaim too:
the GPUs its guaranteed quota stands for may be held by borrowers of another flavor of the cohort (a queue of
any model, "*", borrowing beside a queue of one model's quota: the book keeps the two flavors' pools apart, the
GPUs do not). It takes borrowers of any flavor, only as far as they borrow, until it would be placed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contracts import JobSpec
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import Running

if TYPE_CHECKING:
    from libs.core.preemption.decider import PreemptionDecider


def borrowers(d: PreemptionDecider, preemptor: JobSpec, flavor: str, now: float, preemptor_id: str = ""
              ) -> list[Running]:
    """Jobs of other queues of the preemptor's cohort that hold borrowed quota of `flavor` (their queue is
    above its nominal, or they were admitted over budget), in victim order; of any class (see
    PreemptionDecider.eligible): the victim set takes from them only what they borrow."""
    book = d.book
    cohort = book.cohort.get(preemptor.queue, "")
    if not cohort:
        return []
    peers = [q for q in book.members[cohort] if q != preemptor.queue]
    borrowing = {q for q in peers if book.borrowed(q, flavor) > 0}
    cands = [r for q in peers for r in d.s.by_queue.get(q, {}).values()
             if r.flavor == flavor and (q in borrowing or r.over_budget)
             and d.eligible(r, now, preemptor_id, reclaim=True)]
    cands.sort(key=lambda r: r.victim_key(now))
    return cands


def placement_victims(d: PreemptionDecider, sim: Simulation, held: tuple[str, str, int, bool], preemptor_id: str
                      ) -> list[Running]:
    """The borrowers (of any flavor) to evict so that a job holding `held` quota within its queue's nominal
    is placed; [] when it borrows or none would do."""
    queue, flavor, _, over_budget = held
    lim = d.book.limits.get(queue, {}).get(flavor)
    cohort = d.book.cohort.get(queue, "")
    if over_budget or lim is None or not cohort or d.book.used.get((queue, flavor), 0) > lim.nominal:
        return []
    book, now = d.book, sim.now
    others = [r for q in book.members[cohort] if q != queue for r in d.s.by_queue.get(q, {}).values()
              if (r.over_budget or book.borrowed(q, r.flavor) > 0) and d.eligible(r, now, preemptor_id, reclaim=True)]
    if not others:
        return []

    def tier(r: Running) -> int:
        """0: a borrower of the queue's own pool; 1: of a flavor no other queue lends; 2: of another lender's
        pool, taken last (it would hand GPUs that lender counts on to this queue instead)."""
        if r.flavor == flavor:
            return 0
        mine = book.limits[queue].get(r.flavor)
        return 2 if book.pool.get((cohort, r.flavor), 0) - (mine.lend if mine is not None else 0) > 0 else 1

    tried: list[Running] = []
    for level in range(3):
        tier_of_level = [r for r in others if tier(r) == level]
        if not tier_of_level:
            continue
        tried = sorted([*tried, *tier_of_level], key=lambda r: r.victim_key(now))
        victims = sim.choose(tried, lambda: sim.fits(flavor), sim.gives_back_only_borrowed, reclaim=True)
        if victims:
            return victims
    return []


def could_fit_nominal(sim: Simulation, flavor: str, own: list[Running]) -> bool:
    """Could the preemptor fit its queue's nominal quota of the flavor with some victims gone? Only evicting the
    queue's own jobs (`own`) brings its usage down: if it would not fit with all of them gone, no victim set is
    enough, and the search, which would try set after set to find that out, is skipped."""
    return sim.within_nominal(flavor, freed=sum(r.demand for r in own))


def reclaim_victims(d: PreemptionDecider, sim: Simulation, flavors: list[str], preemptor_id: str) -> list[Running]:
    """The victims of the first flavor a reclaim can serve the preemptor in; [] when none can."""
    spec, now = sim.spec, sim.now
    for flavor in flavors:
        lim = d.book.limits.get(spec.queue, {}).get(flavor)
        if lim is None or sim.demand > lim.nominal:
            continue
        # The queue's own jobs come after the borrowers': needed only where the queue is above its nominal.
        own = [r for r in d.candidates(spec, preemptor_id, now) if r.flavor == flavor]
        if not could_fit_nominal(sim, flavor, own):
            continue
        others = borrowers(d, spec, flavor, now, preemptor_id)
        if not others:
            continue

        def reclaimed(flavor: str = flavor) -> bool:
            return sim.within_nominal(flavor) and sim.admits(flavor) and sim.fits(flavor)

        def placed(flavor: str = flavor) -> bool:
            return sim.fits(flavor)

        victims = sim.choose(others + own, reclaimed, sim.gives_back_only_borrowed, placed, reclaim=True)
        if victims:
            return victims
    return []
