"""The queue tree's part of the quota book (QuotaBook, kernel/quota_math.py, inherits it): how a parent's quota
counts its subtree, and who may hold what a queue lent.

A parent queue with quota is one queue of its own cohort like any other, and what its subtree holds is what it
uses there: its descendants' usage of a flavor counts as the parent's usage of the flavor covering it (the same
flavor, else its quota of any model, "*"), in its room, in what it borrows and lends, and in its cohort's pool.
So a parent's quota is never lent while its children use it, and what the subtree holds beyond the parent's
guaranteed part draws on the parent's cohort's pool, which bounds the subtree as the parent's own limits do
(`parent_room`, applied to every room below it).

What a queue lent may be held anywhere that draws on a pool it lends into: its own cohort's (its peers and
their subtrees) and, up the tree, the cohort of each ancestor with quota while that ancestor holds less than
its nominal (what a parent lends, its children lent: the parent's peers and their subtrees, the parent's own
subtree apart; a parent at or above its nominal lends nothing); and at each level by a queue that
left that cohort while borrowing from it and still borrows (`moved_from`): it took the lenders' GPUs with it.
`holders_of_lent` names them, for preemption's reclaim and the guarantee checker alike."""

from __future__ import annotations

from collections.abc import Sequence

from contracts import QueueSpec
from libs.core.kernel.book_what_if import Cell
from libs.core.kernel.queue_limits import ANY, UNLIMITED, Limits, subtree_cap, subtree_taken_while_borrowing


class QueueTree:
    """The tree's questions and tallies of the book; the fields are QuotaBook's (see there)."""

    queues: dict[str, QueueSpec]
    limits: dict[str, dict[str, Limits]]
    cohort: dict[str, str]
    members: dict[str, list[str]]
    children: dict[str, list[str]]
    used: dict[tuple[str, str], int]
    over: dict[tuple[str, str], int]
    pool: dict[tuple[str, str], int]
    pool_used: dict[tuple[str, str], int]
    bounds: dict[str, tuple[str, ...]]
    subtree: dict[tuple[str, str], int]
    subtree_all: dict[str, int]
    moved_from: dict[str, tuple[str, ...]]
    _cells: list[Cell] | None

    def usage(self, queue: str, flavor: str) -> int:
        raise NotImplementedError  # QuotaBook's

    def borrowed(self, queue: str, flavor: str) -> int:
        raise NotImplementedError  # QuotaBook's

    def _ancestors(self, queue: str) -> list[str]:
        """The queue's parents, nearest first (a cycle, which check_tree refuses, ends the walk)."""
        out: list[str] = []
        spec = self.queues.get(queue)
        while spec is not None and spec.parent and spec.parent not in out and spec.parent != queue:
            out.append(spec.parent)
            spec = self.queues.get(spec.parent)
        return out

    def pooled_in(self, spec: QueueSpec) -> str:
        """The cohort whose pool the queue lends into and borrows from: its `cohort`, else its parent; a parent
        without quota of its own is no level of the tree's quota (it neither bounds, lends nor borrows), so the
        cohort it names is the one that parent is pooled in, up to a parent with quota or the top."""
        cohort = spec.cohort or spec.parent
        seen = {spec.name}
        while cohort in self.queues and cohort not in seen and not self.limits.get(cohort):
            seen.add(cohort)
            above = self.queues[cohort].cohort or self.queues[cohort].parent
            if not above:
                break
            cohort = above
        return cohort

    def held(self, queue: str, flavor: str) -> int:
        """The queue's usage of its flavor within its quota (over-budget usage apart): its own reservations
        and, for a parent with quota, what its subtree holds that the flavor covers."""
        own = self.used.get((queue, flavor), 0)
        if queue not in self.children or not self.limits.get(queue):
            return own
        return own + self._below(queue, flavor)

    def _below(self, queue: str, flavor: str) -> int:
        """What the subtree of the queue (a parent with quota) holds that its flavor `flavor` covers: of that
        flavor; for "*", of every flavor the parent has no quota of its own."""
        if flavor != ANY:
            return self.subtree.get((queue, flavor), 0)
        return self.subtree_all.get(queue, 0) - sum(self.subtree.get((queue, f), 0)
                                                    for f in self.limits[queue] if f != ANY)

    def covering(self, ancestor: str, flavor: str) -> str | None:
        """The ancestor's flavor its descendants' usage of `flavor` counts as (None: none covers it)."""
        limits = self.limits.get(ancestor, {})
        return flavor if flavor in limits else ANY if ANY in limits else None

    def parent_room(self, queue: str, flavor: str) -> int:
        """How much more the queue's subtree-bounding ancestors let it take of this flavor (UNLIMITED: none):
        each ancestor's own limits for its subtree, and the room its cohort's pool leaves it."""
        room = UNLIMITED
        for ancestor in self.bounds.get(queue, ()):
            limits = self.limits[ancestor]
            cohort = self.cohort.get(ancestor, "")
            lim = limits.get(flavor) if flavor != ANY else None
            if lim is not None:  # its quota of the flavor bounds the subtree's usage of that flavor
                held = self.usage(ancestor, flavor) + self.subtree.get((ancestor, flavor), 0)
                room = min(room, subtree_cap(lim, bool(cohort)) - held)
            every = limits.get(ANY)
            if every is not None:  # its quota of any model bounds the subtree's usage of every flavor together
                held = sum(self.usage(ancestor, f) for f in limits) + self.subtree_all.get(ancestor, 0)
                room = min(room, subtree_cap(every, bool(cohort)) - held)
            covered = self.covering(ancestor, flavor) if cohort else None
            if covered is not None:  # beyond its guaranteed part the subtree borrows from the ancestor's cohort
                key = (cohort, covered)
                guaranteed_left = max(0, limits[covered].guaranteed - self.held(ancestor, covered))
                room = min(room, guaranteed_left + self.pool[key] - self.pool_used[key])
        return max(0, room)

    def _parent_ceiling(self, queue: str, flavor: str) -> int:
        """The most the queue's ancestors ever let its subtree hold of the flavor (UNLIMITED: no bound)."""
        most = UNLIMITED
        for ancestor in self.bounds.get(queue, ()):
            for lim in (self.limits[ancestor].get(flavor), self.limits[ancestor].get(ANY)):
                if lim is not None:
                    most = min(most, subtree_cap(lim, bool(self.cohort.get(ancestor))))
        return most

    def nominal_of(self, queue: str) -> int:
        """The queue's nominal quota over all flavors, summed over its subtree for a parent."""
        limits = self.limits.get(queue)
        own = sum(lim.nominal for lim in limits.values()) if limits else 0
        children = self.children.get(queue)
        return own + sum(self.nominal_of(c) for c in children) if children else own

    def holders_of_lent(self, queue: str) -> list[str]:
        """The queues that may hold what the queue lent (see the module doc), nearest level first, each once:
        its cohort's other queues and their subtrees, then those of each ancestor's cohort (its own branch
        apart), each level with the queues that left that cohort while borrowing and still borrow. Whether
        one of them borrows, and what (over its nominal, or admitted over budget), its jobs tell."""
        out: dict[str, None] = {}
        for branch in (queue, *self.bounds.get(queue, ())):
            cohort = self.cohort.get(branch, "")
            if not cohort or (branch != queue and not self._lends(branch)):
                continue  # an ancestor at or above its nominal lends nothing its cohort could hold
            left = sorted(q for q, cs in self.moved_from.items() if cohort in cs and q != branch and self.borrows(q))
            for member in (*self.members.get(cohort, ()), *left):
                if member != branch:
                    for q in self.subtree_of(member):
                        if q != queue:
                            out.setdefault(q, None)
        return list(out)

    def holds_lent(self, lender: str, queue: str, flavor: str, over_budget: bool) -> bool:
        """Does a job of `queue` (one of `holders_of_lent(lender)`) holding quota of the flavor hold what the lender
        lent: admitted over budget (borrowed outright), or its queue or its subtree borrows the flavor
        (`subtree_borrows`)?"""
        return over_budget or self.subtree_borrows(queue, flavor, lender)

    def lending_branch(self, queue: str, flavor: str, demand: int) -> str | None:
        """The nearest parent without quota of the queue, below the top of its pool, whose subtree would hold no
        more of the flavor than its queues' nominal quota of it with `demand` more: a job beyond its own queue's
        nominal fits what its subtree lends there, and may take that back from borrowers beyond the subtree (as a
        cohort of Kueue's hierarchical cohorts does). None: no such parent."""
        top = self.cohort.get(queue, "")
        for ancestor in self._ancestors(queue):
            if ancestor == top or self.limits.get(ancestor):
                return None
            inside = self.subtree_of(ancestor)
            nominal = sum(lim.nominal for q in inside if (lim := self.limits.get(q, {}).get(flavor)) is not None)
            if sum(self.used.get((q, flavor), 0) for q in inside) + demand <= nominal:
                return ancestor
        return None

    def _lends(self, queue: str) -> bool:
        """Does the queue (a parent with quota) hold less than its nominal quota of some flavor, lending the rest?"""
        return any(self.held(queue, f) < lim.nominal for f, lim in self.limits.get(queue, {}).items())

    def borrows(self, queue: str) -> bool:
        """Does the queue hold more than its nominal quota of some flavor (or quota admitted over budget)?"""
        return any(max(0, self.held(queue, f) - lim.nominal) + self.over.get((queue, f), 0) > 0
                   for f, lim in self.limits.get(queue, {}).items())

    def unshared_levels(self, queue: str, flavor: str, lender: str) -> list[tuple[str, str]]:
        """The queue's ancestors with quota covering the flavor that the lender does not share, nearest first,
        each with the flavor its subtree's usage counts as there: the levels at which the queue's subtree may
        borrow what the lender lent (the ancestors both share get back what the lender takes)."""
        shared = {lender, *self.bounds.get(lender, ())}
        return [(ancestor, covered) for ancestor in self.bounds.get(queue, ())
                if ancestor not in shared and (covered := self.covering(ancestor, flavor)) is not None]

    def subtree_borrows(self, queue: str, flavor: str, lender: str) -> bool:
        """Does the queue hold borrowed quota of the flavor that a reclaim for the lender may look to: it borrows
        itself, or one of its unshared levels (`unshared_levels`) borrows, its subtree's jobs giving that back?"""
        return self.borrowed(queue, flavor) > 0 or any(
            self.held(ancestor, covered) > self.limits[ancestor][covered].nominal
            for ancestor, covered in self.unshared_levels(queue, flavor, lender))

    def subtree_may_lose(self, victim_queue: str, flavor: str, milli: int, lender: str,
                         taken: Sequence[tuple[str, int]] = (), claimed: int = 0) -> bool:
        """May a reclaim for the lender take a victim job of `milli` of the queue's usage of the flavor, `taken`
        (queue, GPUs) of the flavor already gone from the book? By queue_limits.subtree_taken_while_borrowing:
        at the victim's queue (its usage with `claimed`, its waiting preemptors' claims, counted as going too)
        and at each of its unshared levels, the largest of the victims under each taken last."""
        lim = self.limits.get(victim_queue, {}).get(flavor)
        own = None
        if lim is not None:
            largest = max([milli, *(demand for queue, demand in taken if queue == victim_queue)])
            own = (self.used.get((victim_queue, flavor), 0), milli + claimed, largest, lim.nominal)
        branch = []
        for ancestor, covered in self.unshared_levels(victim_queue, flavor, lender):
            largest = max([milli, *(demand for queue, demand in taken if ancestor in self.bounds.get(queue, ()))])
            branch.append((self.held(ancestor, covered), milli, largest, self.limits[ancestor][covered].nominal))
        return subtree_taken_while_borrowing(own, branch)

    def subtree_of(self, queue: str) -> list[str]:
        """The queue and its descendants, depth first in name order."""
        out, stack = [], [queue]
        while stack:
            q = stack.pop()
            if q in out:
                continue  # (a cycle, which check_tree refuses)
            out.append(q)
            stack.extend(reversed(self.children.get(q, [])))
        return out

    def _note_move(self, name: str, old_cohort: str, new_cohort: str) -> None:
        """The queue moves from `old_cohort` to `new_cohort`: while it borrows, what it borrowed from the old
        one is held by it, and the old cohort's lenders may take it back (holders_of_lent). Every cohort it left
        so is kept, not the last only: a queue that borrowed in one cohort, moved on and borrowed in the next,
        then moved again, still holds the first one's GPUs. A cohort it comes back to counts its usage again."""
        if old_cohort == new_cohort:
            return
        left = tuple(c for c in self.moved_from.get(name, ()) if c != new_cohort)
        if old_cohort and old_cohort not in left and self.borrows(name):
            left = (*left, old_cohort)
        if left:
            self.moved_from[name] = left
        else:
            self.moved_from.pop(name, None)

    def _charge_ancestors(self, queue: str, flavor: str, milli: int) -> None:
        """The queue's usage of the flavor changes by `milli`: so does its bounding ancestors' subtree usage,
        and, for each in a cohort, its usage in its cohort's pool."""
        for ancestor in self.bounds.get(queue, ()):
            cohort = self.cohort.get(ancestor, "")
            covered = self.covering(ancestor, flavor) if cohort else None
            if covered is not None:
                guaranteed = self.limits[ancestor][covered].guaranteed
                before = self.held(ancestor, covered)
                self.pool_used[(cohort, covered)] += max(0, before + milli - guaranteed) - max(0, before - guaranteed)
        for ancestor in self.bounds.get(queue, ()):
            key = (ancestor, flavor)
            self.subtree[key] = self.subtree.get(key, 0) + milli
            self.subtree_all[ancestor] = self.subtree_all.get(ancestor, 0) + milli

    def _record_ancestors(self, queue: str, flavor: str) -> None:
        """Record, for the open what-if, the tallies _charge_ancestors is about to change."""
        cells = self._cells
        assert cells is not None
        for ancestor in self.bounds.get(queue, ()):
            sub_key = (ancestor, flavor)
            cells.append((self.subtree, sub_key, self.subtree.get(sub_key)))
            cells.append((self.subtree_all, ancestor, self.subtree_all.get(ancestor)))
            cohort = self.cohort.get(ancestor, "")
            covered = self.covering(ancestor, flavor) if cohort else None
            if covered is not None:
                pool_key = (cohort, covered)
                cells.append((self.pool_used, pool_key, self.pool_used[pool_key]))
