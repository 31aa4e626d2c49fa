"""Could a reclaim serve a waiting lender? The reclaim bound is owed while borrowers hold what the lender
lent and taking them back would give its first waiting job room and a place: a reclaim takes whole jobs of a
borrowing queue, each while the queue still borrows, or of any queue under a parent with quota that the lender
does not share, each while that parent borrows (libs/core/kernel/queue_limits.py subtree_taken_while_borrowing,
the rule preemption takes victims by), so it can always take back all that a queue or subtree borrows, and no
borrower shields the lender's quota by the size of its jobs.

Tried on the checker's own world, always undone: the borrower jobs that may go together (jobs admitted over
budget, and of each borrowing queue its smaller jobs while it still borrows, then its largest: see `_may_go`)
are taken out of quota and capacity together; a reclaim could serve the lender if its first waiting job then
has room in its queue and fits the free capacity (if it does not fit, what holds it back is capacity no
borrower's quota stands for: not a reclaim's to give). A borrower that cannot be preempted is one of them: a
reclaim takes it whatever its class (libs/core/preemption/candidates.py eligible), and the violation names it.
Borrowers waiting for a place keep the bound owed: they hold the quota against the guarantee (one gives it back
at its placement timeout, which the bound allows, or without one as soon as a lender waits), and the violation
says so; owed only while a node present could hold the lender's first waiting job, and its reservation given back
(with the running jobs that may go) would give that job room (QuotaBook.room, the room quota and preemption ask:
under a parent with quota, what the parent's other children hold within their nominal may leave none)."""

from __future__ import annotations

from libs.audit.guarantees.holds import first_waiting, fits_now, holdable
from libs.audit.guarantees.queue_policies import reclaim_allowed
from libs.audit.guarantees.world import PLACEMENT, RUNNING, JobState, World
from libs.core.kernel.policy import demand_milli


def reclaimable(world: World, queue: str, flavor: str) -> bool:
    first = first_waiting(world, queue, flavor)
    if first is None:
        return False
    demand = world.quota.jobs[first].demand
    running = borrowers(world, queue, flavor)
    unplaced = borrowers(world, queue, flavor, PLACEMENT)
    if not running and not unplaced:
        # Nobody borrows, here nor up the tree (borrowers looks there too): a shortfall is owed, unless the
        # queue's parent's quota, held by queues within their own nominal, is what leaves it no room (no reclaim
        # could serve it: a child's nominal is guaranteed only as far as its parent's quota reaches).
        return world.quota.book.parent_room(queue, flavor) >= demand
    # Borrowers its queue's reclaim_within_cohort keeps a reclaim from taking owe it nothing.
    running = reclaim_allowed(world, queue, first, running)
    victims = _may_go(world, running, flavor, queue) if running else []
    if unplaced:
        # Giving a reservation back needs no room on the GPUs, but a lender whose job no node present could
        # hold is owed nothing: quota keeps no quota for such a job (it holds nobody, and nobody reclaims for
        # it), as a reclaim from running borrowers is owed only where the job would then fit. Nor is one that
        # every borrower's quota back would still leave without room (its parent's quota, held by queues within
        # their own nominal, bounds it: QuotaBook.room, as quota and preemption ask it).
        return holdable(world, first) and _served_without(world, queue, flavor, first, [*victims, *unplaced],
                                                          placed=False)
    return bool(victims) and _served_without(world, queue, flavor, first, victims, placed=True)


def _served_without(world: World, queue: str, flavor: str, first: str, gone: list[tuple[str, JobState]],
                    placed: bool) -> bool:
    """With the borrower jobs `gone` out of quota (and, running ones, out of capacity), would the queue's first
    waiting job have room in its queue, and (`placed`) fit the free capacity? Tried on the checker's own world,
    always undone."""
    book, cluster, live = world.quota.book, world.capacity.cluster, world.capacity.live
    for _, job in gone:
        book.add(job.spec.queue, flavor, -demand_milli(job.spec), job.over_budget)
    freed = [live[j].placements for j, _ in gone if j in live]
    for placements in freed:
        cluster.release(placements)
    try:
        waiting = world.quota.jobs[first]
        return book.room(queue, flavor) >= waiting.demand and (not placed or fits_now(world, waiting.spec, flavor))
    finally:
        for placements in freed:
            cluster.allocate(placements)
        for _, job in gone:
            book.add(job.spec.queue, flavor, demand_milli(job.spec), job.over_budget)


def _may_go(world: World, running: list[tuple[str, JobState]], flavor: str, lender: str) -> list[tuple[str, JobState]]:
    """The borrower jobs one reclaim for the lender may take together: every job admitted over budget, and of
    each queue its smaller jobs, smallest first, then its largest (taken last, it may leave the queue below its
    nominal), each as far as the reclaim rule lets it go with those before it gone (QuotaBook.subtree_may_lose:
    while the queue borrows, its largest counted as going too, or while its subtree borrows at each ancestor
    with quota that the lender does not share)."""
    book = world.quota.book
    out = [(j, job) for j, job in running if job.over_budget]
    by_queue: dict[str, list[tuple[int, str, JobState]]] = {}
    for j, job in running:
        if not job.over_budget:
            by_queue.setdefault(job.spec.queue, []).append((demand_milli(job.spec), j, job))
    taken: list[tuple[str, int]] = []
    try:
        for q, jobs in sorted(by_queue.items()):
            *smaller, (largest, last, last_job) = sorted(jobs, key=lambda t: (t[0], t[1]))
            for demand, j, job in smaller:
                if not book.subtree_may_lose(q, flavor, demand, lender, taken, claimed=largest):
                    break
                book.add(q, flavor, -demand, False)
                taken.append((q, demand))
                out.append((j, job))
            if book.subtree_may_lose(q, flavor, largest, lender, taken):
                book.add(q, flavor, -largest, False)
                taken.append((q, largest))
                out.append((last, last_job))
    finally:
        for q, demand in taken:
            book.add(q, flavor, demand, False)
    return out


def borrowers(world: World, queue: str, flavor: str | None, phase: str = RUNNING) -> list[tuple[str, JobState]]:
    """Jobs that hold borrowed quota where the queue lent it (QuotaBook.holders_of_lent: its cohort's other queues,
    up and across the tree, queues that left its cohort while borrowing), of the flavor (of any flavor: None, the
    GPUs a job of the queue holding quota within its nominal is owed may be held by any of them): admitted over
    budget, or of a queue or subtree that borrows their flavor; running ones (by default), or ones whose quota is
    reserved while they wait for a place (`phase` PLACEMENT)."""
    book = world.quota.book
    holders = set(book.holders_of_lent(queue))
    if not holders:
        return []
    borrowing: dict[tuple[str, str], bool] = {}  # (queue, flavor) -> does it borrow there (asked once each)
    out = []
    for j in sorted(world.capacity.live) if phase == RUNNING else sorted(world.placing):
        job = world.jobs.get(j)
        if (job is None or job.phase != phase or job.spec.queue not in holders
                or (flavor is not None and job.flavor != flavor)):
            continue
        key = (job.spec.queue, job.flavor)
        if key not in borrowing:
            borrowing[key] = book.subtree_borrows(*key, queue)
        if job.over_budget or borrowing[key]:
            out.append((j, job))
    return out


def placeable_without(world: World, job_id: str) -> bool:
    """Would the job, holding quota within its queue's nominal and waiting for a place, fit the free capacity
    with the borrower jobs that may go (of each flavor, as `_may_go`; only those its queue's
    reclaim_within_cohort lets a reclaim take, as preemption's `placement_victims` asks) gone? Tried on the
    checker's own cluster, always undone."""
    job = world.jobs[job_id]
    running = reclaim_allowed(world, job.spec.queue, job_id, borrowers(world, job.spec.queue, None))
    victims = [v for f in sorted({b.flavor for _, b in running})
               for v in _may_go(world, [(j, b) for j, b in running if b.flavor == f], f, job.spec.queue)]
    if not victims:
        return False
    cluster = world.capacity.cluster
    gone = [world.capacity.live[j].placements for j, _ in victims]
    for placements in gone:
        cluster.release(placements)
    try:
        return fits_now(world, job.spec, job.flavor)
    finally:
        for placements in gone:
            cluster.allocate(placements)
