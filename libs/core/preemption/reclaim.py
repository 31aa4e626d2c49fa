"""Reclaim: a queue under its nominal quota takes back the quota its cohort lent to borrowers.

Once the queue's reclaim grace has passed, a waiting job that fits its queue's nominal quota of a flavor may
evict jobs holding borrowed quota of that flavor: whole jobs of the cohort's other queues, each only while its
queue borrows (Kueue's rule, QuotaBook.subtree_may_lose: a queue that does not borrow loses nothing, and a
borrower is left at most one job below its nominal quota, which stays its own to use and reclaim), or while an
ancestor with quota of it that the lender does not share borrows (the borrowing unit is the subtree: a parent
over its nominal gives back whole jobs of its children, each while it still borrows), jobs
admitted over budget (borrowed outright), and, if the queue itself is above its nominal, its own jobs of
lower priority. A victim set is chosen only if the job would then fit its nominal quota, get its room in the
cohort by quota's rules and be placed (see simulation.py); the flavors are tried in the queue's order.

A job that holds quota within its queue's nominal but finds no GPUs (it waits for placement) may reclaim too:
the GPUs its guaranteed quota stands for may be held by borrowers of another flavor of the cohort (a queue of
any model, "*", borrowing beside a queue of one model's quota: the book keeps the two flavors' pools apart, the
GPUs do not). It takes borrowers of any flavor, each only while its queue borrows, until it would be placed.

Borrowers are looked for wherever the queue's quota was lent (QuotaBook.holders_of_lent): its cohort, and up
and across the queue tree (a child's room is bounded by what its parent has left in the parent's cohort, so
the parent's cohort's borrowers hold what the child is owed), and queues that left its cohort while borrowing
from it (they keep the GPUs they took until a lender takes them back). Nobody beyond the cohort is taken while
one within it would do.
"""

from __future__ import annotations

from collections.abc import Callable

from contracts import JobSpec
from libs.core.kernel.queue_policies import ANY_PRIORITY, borrowing_preemption_allows, reclaim_allows
from libs.core.preemption import shortcuts
from libs.core.preemption.candidates import candidates, eligible
from libs.core.preemption.ordering import victim_order
from libs.core.preemption.simulation import Simulation
from libs.core.preemption.state import Running


def borrowers(sim: Simulation, preemptor: JobSpec, flavor: str, preemptor_id: str = "") -> list[Running]:
    """Jobs that hold borrowed quota of `flavor` where the preemptor's queue lent it (QuotaBook.holders_of_lent:
    its cohort's other queues, up and across the tree, and queues that left its cohort while borrowing), of a
    queue above its nominal or admitted over budget, in victim order; of any class (see candidates.eligible):
    the victim set takes them only while their queue borrows."""
    found = [run for run in _lent_holders(sim, preemptor.queue, preemptor_id) if run.flavor == flavor]
    found.sort(key=lambda run: victim_order(run, sim.now))
    return found


def _lent_holders(sim: Simulation, lender: str, preemptor_id: str) -> list[Running]:
    """Running jobs, of any flavor, that hold what the lender's queue lent (QuotaBook.holders_of_lent): of a
    queue or subtree that borrows their flavor, or admitted over budget; each one a reclaim may take now."""
    return [run for run in sim.state.holding_lent(sim.book, lender)
            if eligible(sim.state, sim.policy, run, sim.now, preemptor_id, reclaim=True)]


def gives_back_borrowed(sim: Simulation, lender: str) -> Callable[[Running], bool]:
    """A reclaim for the lender's queue takes a victim only while its queue borrows, or its subtree does at an
    ancestor the lender does not share (Simulation.gives_back_lent, QuotaBook.subtree_may_lose: the same rule at
    each level of the tree)."""
    return lambda run: sim.gives_back_lent(run, lender)


def placement_victims(sim: Simulation, held: tuple[str, str, int, bool], preemptor_id: str) -> list[Running]:
    """The borrowers (of any flavor) to evict so that a job holding `held` quota within its queue's nominal
    is placed; [] when it borrows or none would do."""
    queue, flavor, _, over_budget = held
    book, now = sim.book, sim.now
    lim = book.limits.get(queue, {}).get(flavor)
    cohort = book.cohort.get(queue, "")
    if over_budget or lim is None or book.used.get((queue, flavor), 0) > lim.nominal:
        return []
    others = reclaim_allowed(sim, _lent_holders(sim, queue, preemptor_id))
    if not others:
        return []
    peers = book.members.get(cohort, ())

    def tier(run: Running) -> int:
        """0: a borrower of the queue's own pool; 1: of a flavor no other queue lends; 2: of another lender's
        pool, taken last in the cohort (it would hand GPUs that lender counts on to this queue instead); 3: a
        borrower beyond the cohort, up or across the tree, or one that left the cohort while borrowing."""
        if run.queue not in peers:
            return 3
        if run.flavor == flavor:
            return 0
        mine = book.limits[queue].get(run.flavor)
        return 2 if book.pool.get((cohort, run.flavor), 0) - (mine.lend if mine is not None else 0) > 0 else 1

    tried: list[Running] = []
    for level in range(4):
        tier_of_level = [run for run in others if tier(run) == level]
        if not tier_of_level:
            continue
        tried = sorted([*tried, *tier_of_level], key=lambda run: victim_order(run, now))
        victims = sim.choose(tried, lambda: sim.fits(flavor), gives_back_borrowed(sim, queue), reclaim=True)
        if victims:
            return victims
    return []


def reclaim_victims(sim: Simulation, flavors: list[str], preemptor_id: str) -> list[Running]:
    """The victims of the first flavor a reclaim can serve the preemptor in; [] when none can. A job within its
    queue's nominal reclaims from every queue that holds what its queue lent; one beyond its queue's nominal but
    within the quota its subtree lends (under a parent without quota: QuotaBook.lending_branch) reclaims from
    the borrowers beyond that subtree (a queue of a hierarchical cohort taking back what its cohort lent)."""
    for flavor in flavors:
        victims = _within_nominal(sim, flavor, preemptor_id) or _within_branch(sim, flavor, preemptor_id)
        if victims:
            return victims
    return []


def _within_nominal(sim: Simulation, flavor: str, preemptor_id: str) -> list[Running]:
    spec, now = sim.spec, sim.now
    lim = sim.book.limits.get(spec.queue, {}).get(flavor)
    if lim is None or sim.demand > lim.nominal:
        return []
    # The queue's own jobs come after the borrowers': needed only where the queue is above its nominal.
    own = [run for run in candidates(sim.state, sim.policy, spec, preemptor_id, now) if run.flavor == flavor]
    if not shortcuts.could_fit_nominal(sim, flavor, own):
        return []
    others = reclaim_allowed(sim, borrowers(sim, spec, flavor, preemptor_id))
    if not others:
        return []

    def reclaimed() -> bool:
        return sim.within_nominal(flavor) and sim.admits(flavor) and sim.fits(flavor)

    return sim.choose(others + own, reclaimed, gives_back_borrowed(sim, spec.queue), lambda: sim.fits(flavor),
                      reclaim=True)


def _within_branch(sim: Simulation, flavor: str, preemptor_id: str) -> list[Running]:
    spec = sim.spec
    branch = sim.book.lending_branch(spec.queue, flavor, sim.demand)
    if branch is None:
        return []
    inside = set(sim.book.subtree_of(branch))
    others = [run for run in reclaim_allowed(sim, borrowers(sim, spec, flavor, preemptor_id))
              if run.queue not in inside]
    if not others:
        return []
    return sim.choose(others, lambda: sim.admits(flavor) and sim.fits(flavor), gives_back_borrowed(sim, spec.queue),
                      lambda: sim.fits(flavor), reclaim=True)


def reclaim_allowed(sim: Simulation, runs: list[Running]) -> list[Running]:
    """The borrowers the preemptor's queue's reclaim_within_cohort lets a reclaim take (kernel/queue_policies.py)."""
    spec = sim.policy.queues.get(sim.spec.queue)
    if spec is None or spec.reclaim_within_cohort == ANY_PRIORITY:
        return runs
    priority = sim.policy.priority_of(sim.spec)
    return [run for run in runs if reclaim_allows(spec, priority, run.priority)]


def borrowing_victims(sim: Simulation, flavors: list[str], preemptor_id: str, own: list[Running]) -> list[Running]:
    """For a job that must borrow to fit, in a queue whose borrow_within_cohort allows it: the victims of the
    first flavor (in the order quota tries them) where evicting borrowers of the cohort's other queues that the
    setting lets it take (of lower priority, at most its threshold, preemptible), with its own queue's
    candidates `own`, lets quota admit it and placement place it; only as far as those queues borrow."""
    spec = sim.policy.queues.get(sim.spec.queue)
    priority = sim.policy.priority_of(sim.spec)
    for flavor in flavors:
        mine = [run for run in own if run.flavor == flavor]
        if sim.within_nominal(flavor, freed=sum(run.demand for run in mine)):
            continue  # it need not borrow here: a reclaim (after its grace) or its own queue makes its room
        others = [run for run in borrowers(sim, sim.spec, flavor, preemptor_id)
                  if run.preemptible and borrowing_preemption_allows(spec, priority, run.priority)]
        if not others:
            continue

        def admitted(flavor: str = flavor) -> bool:
            return sim.quota_flavor(flavors) == flavor and sim.fits(flavor)

        def placed(flavor: str = flavor) -> bool:
            return sim.fits(flavor)

        candidates = sorted([*others, *mine], key=lambda run: victim_order(run, sim.now))
        victims = sim.choose(candidates, admitted, sim.takes_only_while_borrowing, placed)
        if victims:
            return victims
    return []
