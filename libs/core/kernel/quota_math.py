"""Quota arithmetic of the queue tree: nominal quota, borrowing and lending per GPU model ("flavor") and
cohort. One implementation serves the quota decider, the preemption simulation, admission's checks, the
read models and the auditor's violation count, so they can never disagree about what a limit means.

The cohort model (as Kueue's): each queue's nominal N splits into a guaranteed part G = N - L, never lent,
and a lendable part L (the lending limit). The cohort's pool is the sum of L; every queue's usage above its
own G draws on the pool. A queue may take d more when
  - U + d <= N + B (its borrowing limit, when it has one), and
  - the pool still covers everyone: sum over queues of max(0, U - G) <= sum of L.
That is the same as "total borrowed <= total idle lendable quota", i.e. no queue lends beyond its limit.

A parent queue with quota bounds its whole subtree: what its descendants (and itself) hold of a flavor stays
within the parent's nominal (plus its borrowing limit when the parent is itself in a cohort), so every room
below is also bounded by what each such ancestor has left. A parent's "*" flavor bounds the subtree's usage of
every flavor together; a parent's flavor of one model bounds that model. Children's nominal quotas may add up
to more than their parent's: a child's nominal is then guaranteed only as far as its parent's quota reaches.
A parent in a cohort uses there what its subtree holds (U above counts it), and a queue without quota of its
own under a parent with quota is bounded by that parent all the same: kernel/queue_tree.py.
All amounts are in thousandths of a GPU. A queue's own limits, as its spec states them, are kernel/queue_limits.py.

What-ifs ("when would the starving job's quota free up?", "would the preemptor be admitted with these victims
gone?") change the live book inside `QuotaBook.what_if()`, which records every usage change made meanwhile, by
anyone, and rolls them all back at the end (as `Cluster.what_if()` does for capacity): no caller undoes a trial
by hand, and no caller copies the usage.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts import JobSpec, QueueSpec
from libs.core.kernel import queue_limits
from libs.core.kernel.book_what_if import BookWhatIf, Cell
from libs.core.kernel.flavors import charged_flavor, flavor_matches
from libs.core.kernel.queue_limits import ANY, UNLIMITED, Limits, flavor_quotas, limits_of
from libs.core.kernel.queue_tree import QueueTree


@dataclass(slots=True)
class QuotaBook(QueueTree):
    """The queue tree's limits and usage per (queue, flavor); usage changes in O(1)."""

    queues: dict[str, QueueSpec] = field(default_factory=dict)
    limits: dict[str, dict[str, Limits]] = field(default_factory=dict)  # queue -> flavor -> limits (ordered)
    cohort: dict[str, str] = field(default_factory=dict)  # queue -> cohort ("" none)
    members: dict[str, list[str]] = field(default_factory=dict)  # cohort -> queues (sorted)
    children: dict[str, list[str]] = field(default_factory=dict)
    used: dict[tuple[str, str], int] = field(default_factory=dict)
    # Usage admitted over budget: borrowed outright, never drawn from the queue's own nominal.
    over: dict[tuple[str, str], int] = field(default_factory=dict)
    pool: dict[tuple[str, str], int] = field(default_factory=dict)  # (cohort, flavor) -> sum of lendable
    pool_used: dict[tuple[str, str], int] = field(default_factory=dict)
    # queue -> its ancestors that have quota, nearest first: each bounds the queue's room (see the module doc)
    bounds: dict[str, tuple[str, ...]] = field(default_factory=dict)
    subtree: dict[tuple[str, str], int] = field(default_factory=dict)  # (ancestor, flavor) -> its descendants' usage
    subtree_all: dict[str, int] = field(default_factory=dict)  # ancestor -> its descendants' usage, every flavor
    # queue -> the cohorts it left while borrowing, in the order it left them (queue_tree.py holders_of_lent)
    moved_from: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The tallies the innermost open what-if records (None: no what-if open, nothing recorded).
    _cells: list[Cell] | None = field(default=None, repr=False, compare=False)

    def what_if(self) -> BookWhatIf:
        """A trial of usage changes, all rolled back at the end of the `with` block (see BookWhatIf)."""
        return BookWhatIf(self)

    def _refuse_in_trial(self) -> None:
        if self._cells is not None:
            raise RuntimeError("the queue tree changes the book's limits, which a what-if does not roll back")

    def set_queues(self, queues: Iterable[QueueSpec]) -> None:
        self._refuse_in_trial()
        self.queues = {q.name: q for q in queues}
        self.limits = {name: {f.model: limits_of(f) for f in flavor_quotas(q)} for name, q in self.queues.items()}
        self.children = {}
        for name in sorted(self.queues):
            parent = self.queues[name].parent
            if parent:
                self.children.setdefault(parent, []).append(name)
        self.cohort = {name: self.pooled_in(q) for name, q in self.queues.items()}
        self.members = {}
        for name in sorted(self.queues):
            if self.cohort[name]:
                self.members.setdefault(self.cohort[name], []).append(name)
        self.bounds = {name: tuple(a for a in self._ancestors(name) if self.limits.get(a)) for name in self.queues}
        self._recount()

    def set_queue(self, spec: QueueSpec) -> None:
        """One queue added or changed, in time independent of the number of queues where the tree's shape
        stays (same parent, still governed or not, no queue naming it as parent before it existed): its
        limits, its cohort's membership and its cohort's pool change; anything else rebuilds the book."""
        self._refuse_in_trial()
        name = spec.name
        old = self.queues.get(name)
        limits = {f.model: limits_of(f) for f in flavor_quotas(spec)}
        reshaped = (old is None and name in self.children) or (old is not None and old.parent != spec.parent) or (
            name in self.children and (bool(limits) != bool(self.limits.get(name))
                                       or (old is not None and old.cohort != spec.cohort)))
        if old is not None:
            self._note_move(name, self.cohort.get(name, ""), self.pooled_in(spec))
        if reshaped:
            self.set_queues([*(q for n, q in self.queues.items() if n != name), spec])
            return
        if old is not None:
            self._pool_share(name, -1)
            cohort = self.cohort[name]
            if cohort:
                self.members[cohort].remove(name)
                if not self.members[cohort]:
                    del self.members[cohort]
        else:
            if spec.parent:
                bisect.insort(self.children.setdefault(spec.parent, []), name)
        self.queues[name] = spec
        self.limits[name] = limits
        cohort = self.cohort[name] = self.pooled_in(spec)
        if cohort:
            bisect.insort(self.members.setdefault(cohort, []), name)
        if old is None:
            self.bounds[name] = tuple(a for a in self._ancestors(name) if self.limits.get(a))
        self._pool_share(name, 1)

    def _pool_share(self, name: str, sign: int) -> None:
        """Add (sign 1) or take away (-1) the queue's part of its cohort's pool: what it lends, and what of
        the pool its usage draws on."""
        cohort = self.cohort.get(name, "")
        if not cohort:
            return
        for flavor, lim in self.limits[name].items():
            key = (cohort, flavor)
            self.pool[key] = self.pool.get(key, 0) + sign * lim.lend
            self.pool_used[key] = self.pool_used.get(key, 0) + sign * (
                self.over.get((name, flavor), 0) + max(0, self.held(name, flavor) - lim.guaranteed))
            if sign < 0 and not any(flavor in self.limits[q] for q in self.members[cohort] if q != name):
                del self.pool[key], self.pool_used[key]  # no queue of the cohort has the flavor any more

    def _recount(self) -> None:
        self.pool, self.pool_used = {}, {}
        self.subtree, self.subtree_all = {}, {}
        for usage in (self.used, self.over):
            for (queue, flavor), milli in usage.items():
                for ancestor in self.bounds.get(queue, ()):
                    self.subtree[(ancestor, flavor)] = self.subtree.get((ancestor, flavor), 0) + milli
                    self.subtree_all[ancestor] = self.subtree_all.get(ancestor, 0) + milli
        for name, flavors in self.limits.items():
            cohort = self.cohort[name]
            if not cohort:
                continue
            for flavor, lim in flavors.items():
                key = (cohort, flavor)
                self.pool[key] = self.pool.get(key, 0) + lim.lend
                self.pool_used[key] = (self.pool_used.get(key, 0) + self.over.get((name, flavor), 0)
                                       + max(0, self.held(name, flavor) - lim.guaranteed))

    # --- questions -------------------------------------------------------------------------------

    def is_leaf(self, queue: str) -> bool:
        return queue in self.queues and queue not in self.children

    def governed(self, queue: str) -> bool:
        """Does the queue have quota at all? A queue without flavors is unlimited."""
        return bool(self.limits.get(queue))

    def flavors_for(self, queue: str, spec: JobSpec) -> list[str]:
        """The queue's flavors the job may use, in the queue's preference order."""
        return [f for f in self.limits.get(queue, {}) if flavor_matches(f, spec)]

    def usage(self, queue: str, flavor: str) -> int:
        """What the queue holds of this flavor, over-budget usage included."""
        return self.used.get((queue, flavor), 0) + self.over.get((queue, flavor), 0)

    def borrow_only_room(self, queue: str, flavor: str) -> int:
        """What the queue may take purely from its peers' idle lendable quota (over budget): the pool's free
        part without the queue's own idle lendable quota, within its borrowing limit."""
        lim = self.limits.get(queue, {}).get(flavor)
        cohort = self.cohort.get(queue, "")
        if lim is None or not cohort:
            return 0
        own_used = self.held(queue, flavor)
        own_idle = max(0, lim.lend - max(0, own_used - lim.guaranteed))
        key = (cohort, flavor)
        room = self.pool[key] - self.pool_used[key] - own_idle
        if lim.borrow is not None:
            room = min(room, lim.nominal + lim.borrow - self.usage(queue, flavor))
        if self.bounds.get(queue):
            room = min(room, self.parent_room(queue, flavor))
        return max(0, room)

    def room(self, queue: str, flavor: str) -> int:
        """How much more the queue may take of this flavor now (own limits and its cohort's pool)."""
        flavors = self.limits.get(queue)
        lim = flavors.get(flavor) if flavors else None
        if lim is None:  # no quota at all: unlimited (see governed) but for its ancestors' bound
            if flavors:
                return 0
            return self.parent_room(queue, flavor) if self.bounds.get(queue) else UNLIMITED
        key = (queue, flavor)
        held = self.held(queue, flavor)
        used = held + self.over.get(key, 0)
        own = UNLIMITED if lim.borrow is None else lim.nominal + lim.borrow - used
        cohort = self.cohort.get(queue, "")
        if not cohort:
            room = min(own, lim.nominal - used)
        else:
            key = (cohort, flavor)
            room = min(own, max(0, lim.guaranteed - held) + self.pool[key] - self.pool_used[key])
        if self.bounds.get(queue):
            room = min(room, self.parent_room(queue, flavor))
        return max(0, room)

    def room_within_nominal(self, queue: str, flavor: str) -> int:
        """The room a job that may not borrow can use: what the queue has room for and is left of its own
        nominal quota (a job that cannot be preempted could never give borrowed quota back)."""
        return min(self.room(queue, flavor), self.nominal_left(queue, flavor))

    def nominal_left(self, queue: str, flavor: str) -> int:
        """What is left of the queue's own nominal quota, lent out or not (over-budget jobs do not use it)."""
        flavors = self.limits.get(queue)
        if not flavors:  # not governed
            return UNLIMITED
        lim = flavors.get(flavor)
        return 0 if lim is None else max(0, lim.nominal - self.held(queue, flavor))

    def ceiling(self, queue: str, flavor: str, borrows: bool = True) -> int:
        """The most the queue could ever hold of this flavor: nominal plus what it may borrow (`borrows`
        False: a job that may not borrow), within what its ancestors' quota lets its subtree hold."""
        lim = self.limits.get(queue, {}).get(flavor)
        if lim is None:
            return UNLIMITED if not self.governed(queue) else 0
        cohort = self.cohort.get(queue, "")
        if not cohort or not borrows:
            most = lim.nominal
        else:
            lendable = self.pool[(cohort, flavor)] - lim.lend
            most = lim.nominal + (lendable if lim.borrow is None else min(lim.borrow, lendable))
        return min(most, self._parent_ceiling(queue, flavor)) if self.bounds.get(queue) else most

    def borrowed(self, queue: str, flavor: str) -> int:
        lim = self.limits.get(queue, {}).get(flavor)
        if lim is None:
            return 0
        return max(0, self.held(queue, flavor) - lim.nominal) + self.over.get((queue, flavor), 0)

    def reclaim_may_take(self, queue: str, flavor: str, milli: int, largest: int, over_budget: bool = False) -> bool:
        """May a reclaim take another `milli` of the queue's usage (its victims still counted in the book), the
        largest of its victims there holding `largest`? Only while the queue borrows (see
        `taken_while_borrowing`); usage admitted over budget is borrowed outright and may always go."""
        key = (queue, flavor)
        if over_budget:
            return self.over.get(key, 0) >= milli
        lim = self.limits.get(queue, {}).get(flavor)
        used = self.used.get(key, 0)
        return lim is not None and queue_limits.taken_while_borrowing(used, milli, largest, lim.nominal)

    def waits_for_lent_quota(self, queue: str, flavor: str, milli: int) -> bool:
        """Would a job of `milli` fit what is left of the queue's own nominal quota of the flavor, but not the
        room its cohort leaves it? Then that quota is lent out, and while such a job waits no borrower of the
        flavor may grow."""
        return self.nominal_left(queue, flavor) >= milli > self.room(queue, flavor)

    def lent(self, queue: str, flavor: str) -> int:
        """The share of this queue's idle lendable quota that borrowers of its cohort use now. Each
        borrower's borrowing is attributed to the other queues' idle lendable quota in name order, so the
        figure is deterministic and a queue never lends to itself (over budget, it borrows)."""
        cohort = self.cohort.get(queue, "")
        if not cohort or flavor not in self.limits.get(queue, {}):
            return 0
        peers = [q for q in self.members[cohort] if flavor in self.limits[q]]
        idle = {q: min(self.limits[q][flavor].lend,
                       max(0, self.limits[q][flavor].nominal - self.held(q, flavor))) for q in peers}
        lent = dict.fromkeys(peers, 0)
        for borrower in peers:
            need = self.borrowed(borrower, flavor)
            for lender in peers:
                if need <= 0:
                    break
                if lender == borrower:
                    continue
                take = min(need, idle[lender] - lent[lender])
                lent[lender] += take
                need -= take
        return lent[queue]

    def violations(self, queue: str, flavor: str) -> list[str]:
        """Limits broken right now by the queue's usage of this flavor or by its cohort's borrowing."""
        lim = self.limits.get(queue, {}).get(flavor)
        if lim is None:
            return [] if not self.governed(queue) else [f"{queue} uses flavor {flavor or ANY} it has no quota of"]
        out = []
        used = self.usage(queue, flavor)
        cap = lim.nominal + (lim.borrow if lim.borrow is not None else UNLIMITED)
        if not self.cohort.get(queue):
            cap = lim.nominal
        if used > cap:
            out.append(f"{queue} uses {used / 1000:g} {flavor} GPUs, above nominal + borrowing limit "
                       f"{cap / 1000:g}")
        cohort = self.cohort.get(queue, "")
        if cohort and self.pool_used[(cohort, flavor)] > self.pool[(cohort, flavor)]:
            out.append(f"cohort {cohort} borrows {self.pool_used[(cohort, flavor)] / 1000:g} {flavor} GPUs, "
                       f"above what its queues lend ({self.pool[(cohort, flavor)] / 1000:g})")
        return out

    # --- changes ---------------------------------------------------------------------------------

    def add(self, queue: str, flavor: str, milli: int, over_budget: bool = False) -> None:
        """Usage of (queue, flavor) changes by `milli` (negative: released). Over-budget usage is borrowed
        outright: it draws on the cohort's pool in full, never on the queue's own nominal."""
        key = (queue, flavor)
        lim = self.limits.get(queue, {}).get(flavor)
        cohort = self.cohort.get(queue, "")
        if self._cells is not None:
            self._record(key, lim is not None and bool(cohort), cohort, over_budget)
        if self.bounds.get(queue):
            self._charge_ancestors(queue, flavor, milli)
        if over_budget:
            self.over[key] = self.over.get(key, 0) + milli
            if lim is not None and cohort:
                self.pool_used[(cohort, flavor)] += milli
            return
        before = self.used.get(key, 0)
        self.used[key] = before + milli
        if lim is not None and cohort:
            g = lim.guaranteed
            if queue in self.children:  # a parent: what its subtree holds counts too (queue_tree.py)
                before += self._below(queue, flavor)
            self.pool_used[(cohort, flavor)] += max(0, before + milli - g) - max(0, before - g)

    def _record(self, key: tuple[str, str], pooled: bool, cohort: str, over_budget: bool) -> None:
        """Record, for the open what-if, the tallies `add` is about to change for (queue, flavor) `key`, with
        their values now: the usage, the cohort's pool use (`pooled`), the usage of each bounding ancestor."""
        cells = self._cells
        assert cells is not None
        usage = self.over if over_budget else self.used
        cells.append((usage, key, usage.get(key)))
        queue, flavor = key
        if pooled:
            pool_key = (cohort, flavor)
            cells.append((self.pool_used, pool_key, self.pool_used[pool_key]))
        self._record_ancestors(queue, flavor)

    def recharge(self, queue: str, flavor: str, model: str, milli: int, over_budget: bool = False) -> str:
        """A reservation of the queue follows the queue's current flavors (after a policy change): its usage moves
        to the flavor that covers it now (charged_flavor), which is returned. Every fold of reservations (the
        quota and preemption deciders, the guarantee checker) moves them through here, so that a lender can
        always reclaim what a queue borrows, whichever flavor its policy names."""
        target = charged_flavor(self.limits.get(queue, {}), flavor, model)
        if target != flavor:
            self.add(queue, flavor, -milli, over_budget)
            self.add(queue, target, milli, over_budget)
        return target

    def recharge_placed(self, queue: str, flavor: str, placed_model: str, milli: int,
                        over_budget: bool = False) -> str:
        """A reservation of the queue was placed on GPU model `placed_model`: one charged to a flavor the queue
        no longer has (a policy change found no model for it: unplaced, its job asks for any model) moves to
        the flavor that covers that model now, which is returned; one charged to a flavor the queue has stays.
        Every fold of placements runs it, so that what the queue borrows stays where a lender can reclaim it."""
        if not placed_model or flavor in self.limits.get(queue, {}):
            return flavor
        return self.recharge(queue, flavor, placed_model, milli, over_budget)
