"""Could a reclaim serve a waiting lender without breaking nominal_protected? The reclaim bound is owed only
while one could: with whole jobs, a borrower that borrows 1 GPU with a 5-GPU job cannot give the GPU back
without dropping below its nominal quota, and a lender whose job needs a node that only such a job frees
must wait for it to end.

Tried on the checker's own world, always undone: every borrower job that may go (jobs admitted over budget,
and of each borrowing queue its smallest jobs while the queue stays at or above its nominal) is taken out of
quota and capacity together; a reclaim could serve the lender if its first waiting job then has room in its
queue and fits the free capacity. Non-preemptible borrowers and borrowers waiting for a place keep the bound
owed: they hold the quota against the guarantee (one waiting for a place gives it back at its placement
timeout, which the bound allows, or without one as soon as a lender waits), and the violation says so;
one waiting for a place only while a node present could hold the lender's first waiting job."""

from __future__ import annotations

from libs.audit.guarantees.holds import first_waiting, fits_now, holdable
from libs.audit.guarantees.queue_policies import reclaim_allowed
from libs.audit.guarantees.world import PLACEMENT, RUNNING, JobState, World
from libs.core.kernel.policy import demand_milli


def reclaimable(world: World, queue: str, flavor: str) -> bool:
    running = borrowers(world, queue, flavor)
    first = first_waiting(world, queue)
    if borrowers(world, queue, flavor, PLACEMENT):
        # Giving a reservation back needs no room on the GPUs, but a lender whose job no node present could
        # hold is owed nothing: quota keeps no quota for such a job (it holds nobody, and nobody reclaims for
        # it), as a reclaim from running borrowers is owed only where the job would then fit.
        return first is None or holdable(world, first)
    if not running:
        # Nobody borrows, here nor up the tree (borrowers looks there too): a shortfall is owed, unless the
        # queue's parent's quota, held by queues within their own nominal, is what leaves it no room (no reclaim
        # could serve it: a child's nominal is guaranteed only as far as its parent's quota reaches).
        return first is None or world.quota.book.parent_room(queue, flavor) >= world.quota.jobs[first].demand
    # Borrowers its queue's reclaim_within_cohort keeps a reclaim from taking owe it nothing.
    running = reclaim_allowed(world, queue, first, running)
    if not running:
        return False
    if any(not world.quota.policy.preemptible(job.spec) for _, job in running):
        return True
    if first is None:
        return False
    victims = _may_go(world, running, flavor)
    if not victims:
        return False
    book, cluster = world.quota.book, world.capacity.cluster
    for _, job in victims:
        book.add(job.spec.queue, flavor, -demand_milli(job.spec), job.over_budget)
    gone = [world.capacity.live[j].placements for j, _ in victims]
    for placements in gone:
        cluster.release(placements)
    try:
        waiting = world.quota.jobs[first]
        return book.room(queue, flavor) >= waiting.demand and fits_now(world, waiting.spec, flavor)
    finally:
        for placements in gone:
            cluster.allocate(placements)
        for _, job in victims:
            book.add(job.spec.queue, flavor, demand_milli(job.spec), job.over_budget)


def _may_go(world: World, running: list[tuple[str, JobState]], flavor: str) -> list[tuple[str, JobState]]:
    """The borrower jobs a reclaim may take while keeping every queue at or above its nominal quota."""
    book = world.quota.book
    out = [(j, job) for j, job in running if job.over_budget]
    by_queue: dict[str, list[tuple[int, str, JobState]]] = {}
    for j, job in running:
        if not job.over_budget:
            by_queue.setdefault(job.spec.queue, []).append((demand_milli(job.spec), j, job))
    for q, jobs in sorted(by_queue.items()):
        lim = book.limits.get(q, {}).get(flavor)
        if lim is None:
            continue
        spare = book.used.get((q, flavor), 0) - lim.nominal
        for demand, j, job in sorted(jobs, key=lambda t: (t[0], t[1])):
            if demand > spare:
                break
            spare -= demand
            out.append((j, job))
    return out


def borrowers(world: World, queue: str, flavor: str, phase: str = RUNNING) -> list[tuple[str, JobState]]:
    """Jobs that hold borrowed quota of the flavor where the queue lent it (QuotaBook.holders_of_lent: its cohort's
    other queues, up and across the tree, queues that left its cohort while borrowing): running ones (by default),
    or ones whose quota is reserved while they wait for a place (`phase` PLACEMENT)."""
    book = world.quota.book
    holders = set(book.holders_of_lent(queue))
    if not holders:
        return []
    borrowing = {q for q in holders if book.borrowed(q, flavor) > 0}
    held = sorted(world.capacity.live) if phase == RUNNING else sorted(world.placing)
    return [(j, job) for j in held if (job := world.jobs.get(j)) is not None and job.phase == phase
            and job.flavor == flavor and job.spec.queue in holders and (job.spec.queue in borrowing or job.over_budget)]


def gpu_borrowers(world: World, queue: str) -> list[tuple[str, JobState]]:
    """Running jobs of any flavor that hold borrowed quota where the queue lent it (as `borrowers`): the GPUs a
    job of the queue holding quota within its nominal is owed may be held by any of them."""
    book = world.quota.book
    holders = set(book.holders_of_lent(queue))
    return [(j, job) for j in sorted(world.capacity.live) if (job := world.jobs.get(j)) is not None
            and job.phase == RUNNING and job.spec.queue in holders
            and (job.over_budget or book.borrowed(job.spec.queue, job.flavor) > 0)]


def placeable_without(world: World, job_id: str) -> bool:
    """Would the job, holding quota within its queue's nominal and waiting for a place, fit the free capacity
    with the borrower jobs that may go (of each flavor, as `_may_go`) gone? Tried on the checker's own
    cluster, always undone."""
    job = world.jobs[job_id]
    running = gpu_borrowers(world, job.spec.queue)
    victims = [v for f in sorted({b.flavor for _, b in running})
               for v in _may_go(world, [(j, b) for j, b in running if b.flavor == f], f)]
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
