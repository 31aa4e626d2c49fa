"""The preemption simulation: evictions tried on the preemption decider's own quota book and cluster, and judged
by the rules quota and placement apply, so that a decision evicts only when the preemptor would then really be
admitted and placed. The book and cluster come out unchanged: the simulation runs inside the book's what-if
(`with Simulation(...) as sim:`, QuotaBook.what_if), and each placement question inside a cluster what-if
(Cluster.what_if), each of which rolls back every change made while it is open.
A simulation's world is the one the evictions already decided will leave behind: victims chosen for other
preemptors (not yet evicted) no longer count in their queues' usage, and what they free is their
preemptors': a preemptor still waiting for quota holds its claim in the book, and the victims' GPUs stay
taken. So two preemptors deciding one after the other never both count on the same room, and a queue's
borrowing is what it will be once the evictions decided are done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from types import TracebackType

import msgspec

from contracts import JobSpec, ReplicaPlacement
from libs.core.cluster.job_fit import Shortfall, fits, place_gang
from libs.core.cluster.model import Cluster
from libs.core.kernel.flavors import flavor_matches
from libs.core.kernel.lent_quota import Waiter, waits_for_lent_quota
from libs.core.kernel.policy import PolicyBook, demand_milli
from libs.core.kernel.queue_policies import flavors_in_turn, fungible
from libs.core.kernel.quota_math import ANY, QuotaBook
from libs.core.kernel.usable_flavors import ModelCounts, usable_flavors
from libs.core.preemption.candidates import budget_left
from libs.core.preemption.state import PLACEMENT, PreemptionState, Running
from libs.core.preemption.victim_sets import choose_victims


class Simulation:
    """One preemptor's what-if world (see above); `applied` holds the victims tried, in the order taken. Asked
    only inside its `with` block: entering opens the book's what-if and counts the decided evictions in it,
    leaving rolls back everything the simulation changed in the book."""

    def __init__(self, state: PreemptionState, policy: PolicyBook, cluster: Cluster, spec: JobSpec,
                 leaving: list[Running], now: float = 0.0, job_id: str = "", models: ModelCounts | None = None
                 ) -> None:
        self.state = state
        self.policy = policy
        self.book = policy.quotas  # changed only inside the simulation's what-if (rolled back on leaving)
        self.cluster = cluster  # changed only inside a what-if of each question (fits)
        # The GPU models the nodes serve: which flavors a job can use (none known: every flavor it may use).
        self.models = ModelCounts() if models is None else models
        self.spec = spec
        self.job_id = job_id
        self.demand = demand_milli(spec)
        self.leaving = leaving  # on their way out already, claimed by nobody: their GPUs count as free
        self.applied: list[Running] = []
        self.now = now
        self._in_turn: dict[str, dict[str, list[Waiter]]] = {}  # flavor -> queue -> its jobs waiting there
        # (queue, flavor) -> what preemptors still waiting for quota claim there: room they will take, not
        # quota their queue holds, so never quota a reclaim could count as borrowed.
        self._claims: dict[tuple[str, str], int] = {}
        self._trial = self.book.what_if()

    def __enter__(self) -> Simulation:
        self._trial.__enter__()
        try:
            self._settle()
        except BaseException as error:
            self._trial.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._trial.__exit__(kind, error, trace)

    # --- the world the decided evictions leave --------------------------------------------------------

    def _settle(self) -> None:
        """Count the evictions decided as done in the book (inside the simulation's what-if), and what ended as
        released."""
        state, book = self.state, self.book
        for victim in sorted(state.victim_of):
            held = state.reserved.get(victim)
            if held is not None and victim in state.running:
                book.add(held[0], held[1], -held[2], held[3])
        for preemptor in sorted(state.in_flight):
            spec = state.specs.get(preemptor)
            if spec is None or preemptor == self.job_id or preemptor in state.reserved or preemptor in state.running:
                continue
            flavor = self._claimed_flavor(preemptor, spec)
            book.add(spec.queue, flavor, demand_milli(spec), False)
            self._claims[(spec.queue, flavor)] = self._claims.get((spec.queue, flavor), 0) + demand_milli(spec)
        for job in sorted(state.ended):  # runs over whose quota is not released yet: that quota is leaving
            held = state.reserved.get(job)
            if held is not None:
                book.add(held[0], held[1], -held[2], held[3])

    def _claimed_flavor(self, preemptor: str, spec: JobSpec) -> str:
        """The flavor a preemptor waiting for quota will get: that of its first victim it may use (a reclaim's
        victims all hold the flavor reclaimed), else the first its queue's quota would reserve it in."""
        flavors = usable_flavors(self.book, self.models, spec, demand_milli(spec))
        for victim in self.state.in_flight[preemptor]:
            run = self.state.running.get(victim)
            if run is not None and run.flavor in flavors:
                return run.flavor
        return flavors[0] if flavors else ANY

    # --- evictions ---------------------------------------------------------------------------------------

    def evict(self, victim: Running, at: int | None = None) -> None:
        """Take the victim: its quota leaves the book until the simulation ends (its GPUs leave in `fits`)."""
        self.book.add(victim.queue, victim.flavor, -victim.demand, victim.over_budget)
        self.applied.insert(len(self.applied) if at is None else at, victim)

    def restore(self, victim: Running) -> None:
        """Give a victim taken back."""
        self.book.add(victim.queue, victim.flavor, victim.demand, victim.over_budget)
        self.applied.remove(victim)

    def choose(self, candidates: list[Running], enough: Callable[[], bool],
               may_take: Callable[[Running], bool] | None = None, placed: Callable[[], bool] | None = None,
               reclaim: bool = False) -> list[Running]:
        """The best minimal victim set among `candidates` (see victim_sets), [] when none is needed or none
        is enough. `may_take` besides the blast-radius budget; `placed`: does placement alone succeed? In a
        reclaim (`reclaim`) neither the budget nor the slack binds the borrowers of other queues: taking back
        lent quota is what a lender is promised, and a budget smaller than a borrower's job, or a borrower's job
        larger than the need plus the slack, would otherwise shield it for ever. The slack still binds the
        queue's own victims, and a set within it goes first."""
        limit = self.demand + self.policy.settings.preemption_slack_gpus * 1000

        def allowed(candidate: Running) -> bool:
            return ((reclaim and candidate.queue != self.spec.queue) or self.within_budget(candidate)) and (
                may_take is None or may_take(candidate))

        def within_slack(victims: list[Running]) -> bool:
            return sum(victim.demand for victim in victims) <= limit

        def own_within_slack(victims: list[Running]) -> bool:
            return sum(victim.demand for victim in victims if victim.queue == self.spec.queue) <= limit

        if not reclaim:
            return choose_victims(self, candidates, enough, allowed, placed or enough, within_slack, None)
        return choose_victims(self, candidates, enough, allowed, placed or enough, own_within_slack,
                              self.spec.queue, within_slack)

    # --- the rules ---------------------------------------------------------------------------------------

    def within_budget(self, candidate: Running) -> bool:
        """Would taking `candidate` too keep its queue within its blast-radius budget?"""
        left = budget_left(self.state, self.policy, candidate.queue, self.now)
        taken = sum(victim.demand for victim in self.applied if victim.queue == candidate.queue)
        return left is None or candidate.demand + taken <= left

    def takes_only_while_borrowing(self, candidate: Running) -> bool:
        """A reclaim takes another queue's jobs only while that queue borrows (QuotaBook.reclaim_may_take): with
        the victims already taken from it gone and this one too, it still borrows with the largest of them back.
        What preemptors of that queue still waiting for quota claim is room they will take, not quota the queue
        holds, so it is no borrowing a reclaim may take."""
        queue, flavor = candidate.queue, candidate.flavor
        if queue == self.spec.queue:
            return True
        if candidate.over_budget:
            return self.book.reclaim_may_take(queue, flavor, candidate.demand, candidate.demand, over_budget=True)
        largest = max([candidate.demand, *(victim.demand for victim in self.applied if not victim.over_budget
                                           and (victim.queue, victim.flavor) == (queue, flavor))])
        claimed = self._claims.get((queue, flavor), 0)
        return self.book.reclaim_may_take(queue, flavor, candidate.demand + claimed, largest)

    def gives_back_lent(self, candidate: Running, lender: str) -> bool:
        """A reclaim for the lender takes another queue's job only while that queue, or its subtree at an
        ancestor the lender does not share, borrows (QuotaBook.subtree_may_lose), with the victims of the flavor
        already taken gone; what preemptors of the queue still waiting claim counts as going too (as
        `takes_only_while_borrowing`). Usage admitted over budget is borrowed outright."""
        if candidate.queue == self.spec.queue or candidate.over_budget:
            return self.takes_only_while_borrowing(candidate)
        taken = [(victim.queue, victim.demand) for victim in self.applied
                 if victim.flavor == candidate.flavor and not victim.over_budget]
        return self.book.subtree_may_lose(candidate.queue, candidate.flavor, candidate.demand, lender, taken,
                                          self._claims.get((candidate.queue, candidate.flavor), 0))

    def fits(self, flavor: str) -> bool:
        """Would placement find the preemptor room now (on GPUs of `flavor`), beside the room of the other
        preemptors whose victims are leaving (each placed, in id order, where its victims leave)?"""
        cluster = self.cluster
        with cluster.what_if():
            cluster.release(_all(run.placements for run in self.leaving))
            self._place_claims()  # before its own victims leave: their room is the preemptor's
            cluster.release(_all(victim.placements for victim in self.applied))
            return fits(cluster, _on_flavor(self.spec, flavor))

    def _place_claims(self) -> None:
        """Place, for the simulation, every other preemptor not running yet on the room its victims leave (and
        any free room it needs besides): two preemptors never count on the same free GPUs. Called inside the
        what-if of `fits`, which takes every claim back."""
        state, cluster = self.state, self.cluster
        for preemptor in sorted(state.in_flight):
            spec = state.specs.get(preemptor)
            if preemptor == self.job_id or spec is None or preemptor in state.running:
                continue
            held = state.reserved.get(preemptor)
            with cluster.what_if() as claim:
                cluster.release(_all(state.running[victim].placements for victim in state.in_flight[preemptor]
                                     if victim in state.running))
                placed = place_gang(cluster, _on_flavor(spec, held[1] if held is not None else ANY))
                if not isinstance(placed, Shortfall):
                    claim.keep()  # placed: it holds that room until `fits` ends
                # else no room for it: its victims' GPUs stay as they are

    def within_nominal(self, flavor: str, freed: int = 0) -> bool:
        """Would the preemptor fit its queue's nominal quota of the flavor (a reclaim borrows nothing), with
        `freed` more of the queue's usage gone?"""
        lim = self.book.limits.get(self.spec.queue, {}).get(flavor)
        return lim is not None and self.book.usage(self.spec.queue, flavor) - freed + self.demand <= lim.nominal

    def admits(self, flavor: str) -> bool:
        """Would quota reserve the preemptor in this flavor now? Its queue and cohort must have room for it,
        and where it must borrow, it must be a job that may borrow (one that can be preempted), and no queue of its
        cohort may wait for quota lent out: while one does, quota lets no borrower grow."""
        book, queue = self.book, self.spec.queue
        if book.room(queue, flavor) < self.demand:
            return False
        if self.demand <= book.nominal_left(queue, flavor):
            return True
        if not self.policy.preemptible(self.spec):
            return False  # a job that cannot be preempted never borrows
        cohort = book.cohort.get(queue, "")
        if not cohort:
            return True
        waiting = self._waiting_in_turn(flavor)
        return not any(q in waiting and waits_for_lent_quota(book, q, flavor, waiting[q]) for q in book.members[cohort])

    def quota_flavor(self, flavors: list[str]) -> str | None:
        """The flavor quota would reserve the preemptor in now: the first it admits it in, in the order its
        queue's flavor fungibility tries them (kernel/queue_policies.py; placement then runs it on that flavor's
        GPUs alone); None: quota would refuse it."""
        spec, book, queue = self.policy.queues.get(self.spec.queue), self.book, self.spec.queue
        if fungible(spec):
            flavors = list(flavors_in_turn(spec, flavors, self.demand,
                                           lambda f: (book.nominal_left(queue, f), book.room(queue, f)),
                                           self.policy.priority_of(self.spec),
                                           lambda f: self.state.lent_to(book, queue, f)))
        return next((f for f in flavors if self.admits(f)), None)

    def _waiting_in_turn(self, flavor: str) -> dict[str, list[Waiter]]:
        """waiting_in_turn, found once per flavor: waiting does not change during a simulation."""
        waiting = self._in_turn.get(flavor)
        if waiting is None:
            waiting = self._in_turn[flavor] = waiting_in_turn(self.state, self.book, self.models, flavor)
        return waiting


def waiting_in_turn(state: PreemptionState, book: QuotaBook, models: ModelCounts,
                    flavor: str) -> dict[str, list[Waiter]]:
    """Per queue, its jobs waiting for quota that may use the flavor (kernel/usable_flavors.py), preemptors
    whose claim the book holds excepted: what quota asks of each queue to know whether it waits for quota lent
    out (the kernel's rule, kernel/lent_quota.py). Jobs held by their user limit, backing off or that no node
    present could hold wait for other reasons, told so: preemption does not count them as waiting."""
    waiting_in: dict[str, list[Waiter]] = {}
    for job_id, waiting in state.waiting.items():
        spec = state.specs.get(job_id)
        if waiting.code == PLACEMENT or spec is None or not flavor_matches(flavor, spec) or (
                job_id in state.in_flight and job_id not in state.reserved):
            continue
        milli = demand_milli(spec)
        if flavor in usable_flavors(book, models, spec, milli):
            waiting_in.setdefault(spec.queue, []).append((waiting.priority, milli, job_id))
    return waiting_in


def _all(placements: Iterable[tuple[ReplicaPlacement, ...]]) -> tuple[ReplicaPlacement, ...]:
    """The jobs' placements as one change, in order: released and given back (rolled back) in that same order,
    job after job."""
    return tuple(chain.from_iterable(placements))


def _on_flavor(spec: JobSpec, flavor: str) -> JobSpec:
    """The job as placement runs it in a flavor: on that flavor's GPU model alone (any model: as it asks)."""
    return spec if flavor == ANY else msgspec.structs.replace(spec, gpu_models=(flavor,))
