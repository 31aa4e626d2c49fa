"""The preemption simulation: evictions tried on the preemption decider's own quota book and cluster, and
judged by the rules quota and placement apply, so that a decision evicts only when the preemptor would
then really be admitted and placed. Every change is undone before the simulation ends.

Inside `with Simulation(...)` the world is the one the evictions already decided will leave behind:
victims chosen for other preemptors (not yet evicted) no longer count in their queues' usage, and what they
free is their preemptors': a preemptor still waiting for quota holds its claim in the book, and the victims'
GPUs stay taken. So two preemptors deciding one after the other never both count on the same room, and a
queue's borrowing is what it will be once the evictions decided are done.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import msgspec

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.job_fit import fits, place_gang
from libs.core.cluster.shortfall import Shortfall
from libs.core.kernel.policy import demand_milli
from libs.core.kernel.quota_math import ANY, flavor_matches
from libs.core.preemption.state import PLACEMENT, PreemptionState, Running
from libs.core.preemption.victim_sets import choose_victims

if TYPE_CHECKING:
    from libs.core.preemption.decider import PreemptionDecider

UsageChange = tuple[str, str, int, bool]  # (queue, flavor, milli, over budget)


class Simulation:
    """One preemptor's what-if world (see above); `applied` holds the victims tried, in the order taken."""

    def __init__(self, decider: PreemptionDecider, spec: JobSpec, leaving: list[Running], now: float = 0.0,
                 job_id: str = "") -> None:
        self.d = decider
        self.spec = spec
        self.job_id = job_id
        self.demand = demand_milli(spec)
        self.leaving = leaving  # on their way out already, claimed by nobody: their GPUs count as free
        self.applied: list[Running] = []
        self.now = now
        self._settled: list[UsageChange] = []
        self._smallest: dict[str, dict[str, int]] = {}  # flavor -> queue -> smallest waiting demand
        # (queue, flavor) -> what preemptors still waiting for quota claim there: room they will take, not
        # quota their queue holds, so never quota a reclaim could count as borrowed.
        self._claims: dict[tuple[str, str], int] = {}

    # --- the world the decided evictions leave --------------------------------------------------------

    def __enter__(self) -> Simulation:
        s, book = self.d.s, self.d.book
        changes: list[UsageChange] = []
        for victim in sorted(s.victim_of):
            held = s.reserved.get(victim)
            if held is not None and victim in s.running:
                changes.append((held[0], held[1], -held[2], held[3]))
        for preemptor in sorted(s.in_flight):
            spec = s.specs.get(preemptor)
            if spec is None or preemptor == self.job_id or preemptor in s.reserved or preemptor in s.running:
                continue
            flavor = self._claimed_flavor(preemptor, spec)
            changes.append((spec.queue, flavor, demand_milli(spec), False))
            self._claims[(spec.queue, flavor)] = self._claims.get((spec.queue, flavor), 0) + demand_milli(spec)
        for job in sorted(s.ended):  # runs over whose quota is not released yet: that quota is leaving
            held = s.reserved.get(job)
            if held is not None:
                changes.append((held[0], held[1], -held[2], held[3]))
        for queue, flavor, milli, over_budget in changes:
            book.add(queue, flavor, milli, over_budget)
        self._settled = changes
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for v in list(self.applied):
            self.restore(v)
        for queue, flavor, milli, over_budget in reversed(self._settled):
            self.d.book.add(queue, flavor, -milli, over_budget)
        self._settled = []

    def _claimed_flavor(self, preemptor: str, spec: JobSpec) -> str:
        """The flavor a preemptor waiting for quota will get: that of its first victim it may use (a reclaim's
        victims all hold the flavor reclaimed), else its queue's first."""
        flavors = self.d.book.flavors_for(spec.queue, spec)
        for victim in self.d.s.in_flight[preemptor]:
            run = self.d.s.running.get(victim)
            if run is not None and run.flavor in flavors:
                return run.flavor
        return flavors[0] if flavors else ANY

    # --- evictions ---------------------------------------------------------------------------------------

    def evict(self, v: Running, at: int | None = None) -> None:
        self.d.book.add(v.queue, v.flavor, -v.demand, v.over_budget)
        self.applied.insert(len(self.applied) if at is None else at, v)

    def restore(self, v: Running) -> None:
        self.d.book.add(v.queue, v.flavor, v.demand, v.over_budget)
        self.applied.remove(v)

    def choose(self, candidates: list[Running], enough: Callable[[], bool],
               may_take: Callable[[Running], bool] | None = None, placed: Callable[[], bool] | None = None,
               reclaim: bool = False) -> list[Running]:
        """The best minimal victim set among `candidates` (see victim_sets), [] when none is needed or none
        is enough. `may_take` besides the blast-radius budget; `placed`: does placement alone succeed? In a
        reclaim (`reclaim`) the budget does not bind the borrowers of other queues: taking back lent quota is
        what a lender is promised, and a budget smaller than a borrower's job would otherwise shield it for ever."""
        slack = self.d.policy.settings.preemption_slack_gpus * 1000

        def allowed(c: Running) -> bool:
            return ((reclaim and c.queue != self.spec.queue) or self.within_budget(c)) and (
                may_take is None or may_take(c))

        return choose_victims(self, candidates, enough, allowed, placed or enough,
                              lambda vs: sum(v.demand for v in vs) <= self.demand + slack,
                              self.spec.queue if reclaim else None)

    # --- the rules ---------------------------------------------------------------------------------------

    def within_budget(self, c: Running) -> bool:
        """Would taking `c` too keep its queue within its blast-radius budget?"""
        left = self.d.budget_left(c.queue, self.now)
        return left is None or c.demand + sum(v.demand for v in self.applied if v.queue == c.queue) <= left

    def gives_back_only_borrowed(self, c: Running) -> bool:
        """A reclaim takes from another queue only quota it borrows, never any of its nominal quota."""
        claimed = 0 if c.over_budget else self._claims.get((c.queue, c.flavor), 0)
        return c.queue == self.spec.queue or self.d.book.gives_back_only_borrowed(c.queue, c.flavor,
                                                                                  c.demand + claimed, c.over_budget)

    def fits(self, flavor: str) -> bool:
        """Would placement find the preemptor room now (on GPUs of `flavor`), beside the room of the other
        preemptors whose victims are leaving (each placed, in id order, where its victims leave)?"""
        spec = _on_flavor(self.spec, flavor)
        cluster = self.d.cluster
        for v in self.leaving:
            cluster.release(v.placements)
        claims = self._place_claims()  # before its own victims leave: their room is the preemptor's
        for v in self.applied:
            cluster.release(v.placements)
        try:
            return fits(cluster, spec)
        finally:
            for v in self.applied:
                cluster.allocate(v.placements)
            for victims, placed in reversed(claims):
                cluster.release(placed)
                for v in victims:
                    cluster.allocate(v.placements)
            for v in self.leaving:
                cluster.allocate(v.placements)

    def _place_claims(self) -> list[tuple[list[Running], tuple[ReplicaPlacement, ...]]]:
        """Place, for the simulation, every other preemptor not running yet on the room its victims leave (and
        any free room it needs besides): two preemptors never count on the same free GPUs."""
        s, cluster = self.d.s, self.d.cluster
        claims: list[tuple[list[Running], tuple[ReplicaPlacement, ...]]] = []
        for preemptor in sorted(s.in_flight):
            spec = s.specs.get(preemptor)
            if preemptor == self.job_id or spec is None or preemptor in s.running:
                continue
            held = s.reserved.get(preemptor)
            victims = [s.running[v] for v in s.in_flight[preemptor] if v in s.running]
            for v in victims:
                cluster.release(v.placements)
            placed = place_gang(cluster, _on_flavor(spec, held[1] if held is not None else ANY))
            if isinstance(placed, Shortfall):
                for v in victims:
                    cluster.allocate(v.placements)
                continue
            claims.append((victims, placed))
        return claims

    def within_nominal(self, flavor: str, freed: int = 0) -> bool:
        """Would the preemptor fit its queue's nominal quota of the flavor (a reclaim borrows nothing), with
        `freed` more of the queue's usage gone?"""
        lim = self.d.book.limits.get(self.spec.queue, {}).get(flavor)
        return lim is not None and self.d.book.usage(self.spec.queue, flavor) - freed + self.demand <= lim.nominal

    def admits(self, flavor: str) -> bool:
        """Would quota reserve the preemptor in this flavor now? Its queue and cohort must have room for it,
        and where it must borrow, it must be a job that may borrow (one that can be preempted), and no queue of its
        cohort may wait for quota lent out: while one does, quota lets no borrower grow."""
        book, queue = self.d.book, self.spec.queue
        if book.room(queue, flavor) < self.demand:
            return False
        if self.demand <= book.nominal_left(queue, flavor):
            return True
        if not self.d.policy.preemptible(self.spec):
            return False  # a job that cannot be preempted never borrows
        cohort = book.cohort.get(queue, "")
        if not cohort:
            return True
        smallest = self._smallest_waiting(flavor)
        return not any(q in smallest and book.waits_for_lent_quota(q, flavor, smallest[q])
                       for q in book.members[cohort])

    def quota_flavor(self, flavors: list[str]) -> str | None:
        """The flavor quota would reserve the preemptor in now: the first of its queue's order it admits it in
        (placement then runs it on that flavor's GPUs alone); None: quota would refuse it."""
        return next((f for f in flavors if self.admits(f)), None)

    def _smallest_waiting(self, flavor: str) -> dict[str, int]:
        """Per queue, the smallest job waiting for quota that the flavor could serve (preemptors whose claim
        the book holds excepted): what quota asks of each queue to know whether it waits for quota lent out.
        Jobs held by their user limit or backing off wait for other reasons, so they are not among them.
        Waiting does not change during a simulation: found once per flavor."""
        smallest = self._smallest.get(flavor)
        if smallest is None:
            smallest = self._smallest[flavor] = smallest_waiting(self.d.s, flavor)
        return smallest


def smallest_waiting(s: PreemptionState, flavor: str) -> dict[str, int]:
    """Per queue, the smallest job waiting for quota that the flavor could serve, preemptors whose claim the
    book holds excepted (see Simulation._smallest_waiting)."""
    smallest: dict[str, int] = {}
    for job_id, w in s.waiting.items():
        spec = s.specs.get(job_id)
        if w.code == PLACEMENT or spec is None or not flavor_matches(flavor, spec) or (
                job_id in s.in_flight and job_id not in s.reserved):
            continue
        milli = demand_milli(spec)
        if milli < smallest.get(spec.queue, milli + 1):
            smallest[spec.queue] = milli
    return smallest


def _on_flavor(spec: JobSpec, flavor: str) -> JobSpec:
    """The job as placement runs it in a flavor: on that flavor's GPU model alone (any model: as it asks)."""
    return spec if flavor == ANY else msgspec.structs.replace(spec, gpu_models=(flavor,))
