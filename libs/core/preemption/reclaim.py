"""Reclaim: a queue under its nominal quota takes back the quota its cohort lent to borrowers.

Once the queue's reclaim grace has passed, a waiting job that fits its queue's nominal quota of a flavor may
evict jobs holding borrowed quota of that flavor: whole jobs of the cohort's other queues, each only while its
queue borrows (Kueue's rule, QuotaBook.reclaim_may_take: a queue that does not borrow loses nothing, and a
borrower is left at most one job below its nominal quota, which stays its own to use and reclaim), jobs
admitted over budget (borrowed outright), and, if the queue itself is above its nominal, its own jobs of
lower priority. A victim set is chosen only if the job would then fit its nominal quota, get its room in the
cohort by quota's rules and be placed (see simulation.py); the flavors are tried in the queue's order.

A job that holds quota within its queue's nominal but finds no GPUs (it waits for placement) may reclaim too:
the GPUs its guaranteed quota stands for may be held by borrowers of another flavor of the cohort (a queue of
any model, "*", borrowing beside a queue of one model's quota: the book keeps the two flavors' pools apart, the
GPUs do not). It takes borrowers of any flavor, each only while its queue borrows, until it would be placed.
"""

from __future__ import annotations

from contracts import JobSpec
from libs.core.preemption import shortcuts
from libs.core.preemption.candidates import candidates, eligible
from libs.core.preemption.ordering import victim_order
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import Running


def borrowers(sim: Simulation, preemptor: JobSpec, flavor: str, preemptor_id: str = "") -> list[Running]:
    """Jobs of other queues of the preemptor's cohort that hold borrowed quota of `flavor` (their queue is
    above its nominal, or they were admitted over budget), in victim order; of any class (see
    candidates.eligible): the victim set takes them only while their queue borrows."""
    book, state, now = sim.book, sim.state, sim.now
    cohort = book.cohort.get(preemptor.queue, "")
    if not cohort:
        return []
    peers = [q for q in book.members[cohort] if q != preemptor.queue]
    borrowing = {q for q in peers if book.borrowed(q, flavor) > 0}
    found = [run for q in peers for run in state.by_queue.get(q, {}).values()
             if run.flavor == flavor and (q in borrowing or run.over_budget)
             and eligible(state, sim.policy, run, now, preemptor_id, reclaim=True)]
    found.sort(key=lambda run: victim_order(run, now))
    return found


def placement_victims(sim: Simulation, held: tuple[str, str, int, bool], preemptor_id: str) -> list[Running]:
    """The borrowers (of any flavor) to evict so that a job holding `held` quota within its queue's nominal
    is placed; [] when it borrows or none would do."""
    queue, flavor, _, over_budget = held
    book, state, now = sim.book, sim.state, sim.now
    lim = book.limits.get(queue, {}).get(flavor)
    cohort = book.cohort.get(queue, "")
    if over_budget or lim is None or not cohort or book.used.get((queue, flavor), 0) > lim.nominal:
        return []
    others = [run for q in book.members[cohort] if q != queue for run in state.by_queue.get(q, {}).values()
              if (run.over_budget or book.borrowed(q, run.flavor) > 0)
              and eligible(state, sim.policy, run, now, preemptor_id, reclaim=True)]
    if not others:
        return []

    def tier(run: Running) -> int:
        """0: a borrower of the queue's own pool; 1: of a flavor no other queue lends; 2: of another lender's
        pool, taken last (it would hand GPUs that lender counts on to this queue instead)."""
        if run.flavor == flavor:
            return 0
        mine = book.limits[queue].get(run.flavor)
        return 2 if book.pool.get((cohort, run.flavor), 0) - (mine.lend if mine is not None else 0) > 0 else 1

    tried: list[Running] = []
    for level in range(3):
        tier_of_level = [run for run in others if tier(run) == level]
        if not tier_of_level:
            continue
        tried = sorted([*tried, *tier_of_level], key=lambda run: victim_order(run, now))
        victims = sim.choose(tried, lambda: sim.fits(flavor), sim.takes_only_while_borrowing, reclaim=True)
        if victims:
            return victims
    return []


def reclaim_victims(sim: Simulation, flavors: list[str], preemptor_id: str) -> list[Running]:
    """The victims of the first flavor a reclaim can serve the preemptor in; [] when none can."""
    spec, now = sim.spec, sim.now
    for flavor in flavors:
        lim = sim.book.limits.get(spec.queue, {}).get(flavor)
        if lim is None or sim.demand > lim.nominal:
            continue
        # The queue's own jobs come after the borrowers': needed only where the queue is above its nominal.
        own = [run for run in candidates(sim.state, sim.policy, spec, preemptor_id, now) if run.flavor == flavor]
        if not shortcuts.could_fit_nominal(sim, flavor, own):
            continue
        others = borrowers(sim, spec, flavor, preemptor_id)
        if not others:
            continue

        def reclaimed(flavor: str = flavor) -> bool:
            return sim.within_nominal(flavor) and sim.admits(flavor) and sim.fits(flavor)

        def placed(flavor: str = flavor) -> bool:
            return sim.fits(flavor)

        victims = sim.choose(others + own, reclaimed, sim.takes_only_while_borrowing, placed, reclaim=True)
        if victims:
            return victims
    return []
