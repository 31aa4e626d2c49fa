"""Whom to evict: the least harm that the simulation says makes room.

A victim set comes from a greedy pass over the candidates in some order: each candidate the rules let go
(`allowed`, asked with the victims taken so far gone) is taken until the simulation says the preemptor would
be admitted and placed (`enough`); then each victim, last taken first, is given back while the others still
suffice, so that no victim in the set is unneeded. Passes are made in victim order, then once per node with
that node's candidates first: the work of one node may make room where cheaper victims spread over many
nodes cannot, or cost less than the many victims of another node. Likewise once per interconnect group of a
node whose candidates sit in several (an Ascend 910's HCCS rings): a replica of NPUs needs its devices free
inside one ring, and the cheapest victims of a node, spread over both rings, free none. (Past the node's or
group's own candidates a pass goes on only when placement already succeeds, i.e. quota still lacks: such a
pass is never a second search of the whole cluster.) In a reclaim, one more pass takes the largest candidates
first: a borrower queue gives back whole jobs only while it borrows with the largest of them back
(kernel/queue_limits.py taken_while_borrowing), so a small job taken first, not enough by itself, can bar the
queue's larger job that alone would make room (a queue borrowing one GPU, holding jobs of one and four GPUs,
where only the four GPUs' node can hold the preemptor); its largest job a borrowing queue always gives back.

Of the sets found within the need plus the slack (`acceptable`), the best is, in this order:
  1. in a reclaim, the fewest GPUs taken from the preemptor's own queue: borrowers give back first; then a set
     within the need plus the slack (`preferred`: a reclaim may take a borrower's jobs beyond the slack, or
     whole jobs larger than the need plus the slack would keep a lender's quota for ever);
  2. the lowest priority of its highest-priority victim;
  3. the least work lost (GPU-time since each victim's last checkpoint or start);
  4. the fewest victims, then the fewest GPUs;
  5. the victims in victim order (lowest priority, least lost, most recently started, id) compared one by
     one: among equals, the set of the first victim in victim order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

from libs.core.cluster.device_groups import groups_held
from libs.core.cluster.model import Cluster
from libs.core.preemption.ordering import VictimOrder, victim_order
from libs.core.preemption.state import Running

VictimSetKey = tuple[int, int, float, int, int, tuple[VictimOrder, ...]]


class Trial(Protocol):
    """The what-if the victims are tried in (simulation.Simulation): `applied` holds the victims taken, in the
    order taken; `evict` takes one (at a place in that order), `restore` gives one back."""

    now: float
    applied: list[Running]
    cluster: Cluster

    def evict(self, victim: Running, at: int | None = None) -> None: ...

    def restore(self, victim: Running) -> None: ...


def choose_victims(sim: Trial, candidates: list[Running], enough: Callable[[], bool],
                   allowed: Callable[[Running], bool], placed: Callable[[], bool],
                   acceptable: Callable[[list[Running]], bool], own_queue: str | None,
                   preferred: Callable[[list[Running]], bool] | None = None) -> list[Running]:
    """The best minimal victim set, [] when nothing needs to go or no acceptable set is enough. The
    simulation is left as it was found."""
    if enough():
        return []
    found: dict[tuple[str, ...], list[Running]] = {}
    for first, rest in _orders(candidates, sim.cluster, largest_first=own_queue is not None):
        victims = _greedy(sim, first, rest, enough, allowed, placed)
        if victims is not None and acceptable(victims):
            found.setdefault(tuple(sorted(v.job_id for v in victims)), victims)
    if not found:
        return []

    def best_first(victims: list[Running]) -> tuple[int, bool, VictimSetKey]:
        key = set_key(victims, sim.now, own_queue)
        return key[0], preferred is not None and not preferred(victims), key

    return min(found.values(), key=best_first)


def set_key(victims: list[Running], now: float, own_queue: str | None) -> VictimSetKey:
    own = sum(v.demand for v in victims if v.queue == own_queue) if own_queue is not None else 0
    return (own, max(v.priority for v in victims), sum(v.lost(now) for v in victims), len(victims),
            sum(v.demand for v in victims), tuple(sorted(victim_order(v, now) for v in victims)))


def _orders(candidates: list[Running], cluster: Cluster, largest_first: bool = False
            ) -> list[tuple[list[Running], list[Running]]]:
    """(taken first, then the rest) per pass: victim order, then (`largest_first`: in a reclaim) the largest
    candidates first (in victim order among equals), then each node's candidates first (nodes in the order
    their first candidate comes), then each interconnect group's of a node with candidates in several."""
    orders: list[tuple[list[Running], list[Running]]] = [(candidates, [])]
    if largest_first:
        largest = sorted(candidates, key=lambda candidate: -candidate.demand)  # (stable: victim order kept)
        if largest != candidates:
            orders.append((largest, []))
    by_node: dict[str, list[Running]] = {}
    by_group: dict[tuple[str, int], list[Running]] = {}
    for candidate in candidates:
        for node in candidate.nodes():
            by_node.setdefault(node, []).append(candidate)
        for key in _groups(candidate, cluster):
            by_group.setdefault(key, []).append(candidate)
    places = list(by_node.values()) if len(by_node) > 1 else []  # one node: its pass is the victim order's
    groups_per_node = Counter(node for node, _ in by_group)
    split = {node for node, groups in groups_per_node.items() if groups > 1}
    places += [on_group for (node, _), on_group in by_group.items() if node in split]
    for on_place in places:
        chosen = {candidate.job_id for candidate in on_place}
        orders.append((on_place, [other for other in candidates if other.job_id not in chosen]))
    return orders


def _groups(candidate: Running, cluster: Cluster) -> list[tuple[str, int]]:
    """The (node, group) of each strict interconnect group the candidate's devices sit in, in replica order."""
    held: list[tuple[str, int]] = []
    for placement in candidate.placements:
        node = cluster.nodes.get(placement.node)
        if node is not None:
            held += [(placement.node, g) for g in sorted(groups_held(node, placement.gpu_indices))]
    return list(dict.fromkeys(held))


def _greedy(sim: Trial, first: list[Running], rest: list[Running], enough: Callable[[], bool],
            allowed: Callable[[Running], bool], placed: Callable[[], bool]) -> list[Running] | None:
    """Take `first`, then (while placement succeeds) `rest`, in order until enough; then minimise. None when
    not enough; the simulation is left as it was found either way."""
    try:
        if _take(sim, first, enough, allowed) or (rest and sim.applied and placed()
                                                  and _take(sim, rest, enough, allowed)):
            _minimise(sim, enough)
            return list(sim.applied)
        return None
    finally:
        for victim in list(sim.applied):
            sim.restore(victim)


def _take(sim: Trial, order: list[Running], enough: Callable[[], bool], allowed: Callable[[Running], bool]
          ) -> bool:
    for candidate in order:
        if allowed(candidate):
            sim.evict(candidate)
            if enough():
                return True
    return False


def _minimise(sim: Trial, enough: Callable[[], bool]) -> None:
    """Give back each victim, last taken first, that the others make unneeded."""
    for victim in reversed(list(sim.applied)):
        at = sim.applied.index(victim)
        sim.restore(victim)
        if sim.applied and enough():
            continue
        sim.evict(victim, at)
