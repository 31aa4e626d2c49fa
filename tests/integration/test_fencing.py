"""Leases and fencing on a real JetStream server: one replica holds a service's lease at a time, loses it when
it stops renewing, and once another replica has started its epoch, the deposed leader's writes are refused by
the server, even a decision the log already holds."""

from __future__ import annotations

import asyncio
import time

import pytest

from contracts import JobPlaced, ReplicaPlacement
from libs.bus.fencing import Deposed, Fence, FencedBus, ensure_fence_subjects
from libs.bus.jetstream import Bus
from libs.bus.lease import Lease, LeaseLost, lease_store
from libs.core.kernel.decider import derived_id


def placed(i: int) -> JobPlaced:
    return JobPlaced(id=derived_id("placement", "trigger", i), ts=1.0, source="placement", job_id=f"job-{i}",
                     placements=(ReplicaPlacement(replica=0, node="n1", gpu_indices=(0,), gpu_milli=1000),))


async def test_a_deposed_leaders_writes_are_refused_once_another_replica_starts_its_epoch(bus: Bus) -> None:
    await ensure_fence_subjects(bus)
    await ensure_fence_subjects(bus)  # idempotent
    info = await bus.js.stream_info(bus.config.stream)
    assert f"{bus.config.subject_prefix}.fence.>" in (info.config.subjects or [])

    old = FencedBus(bus, Fence(bus, "placement"))
    with pytest.raises(Deposed):  # no epoch yet: it may not write at all
        await old.publish([placed(0)])
    first = await old.fence.advance("replica-a", 1, 0.0)
    await old.publish([placed(1), placed(2)])
    stored = await bus.last_seq()

    new = FencedBus(bus, Fence(bus, "placement"))
    second = await new.fence.advance("replica-b", 2, 0.0)
    assert second > first
    for late in ([placed(3)], [placed(2)], [placed(4), placed(5)]):  # new, already stored, a pipelined batch
        old.fence.epoch = first  # as a leader frozen since it wrote its batch, that has learnt nothing
        with pytest.raises(Deposed, match="another replica leads"):
            await old.publish(late)
        assert old.fence.epoch is None  # refused once, it writes no more
    assert await bus.last_seq() == second  # nothing of the old leader's after the new epoch
    assert stored < second

    await new.publish([placed(2), placed(3)])  # the new leader re-derives: the stored one is dropped as duplicate
    assert await bus.last_seq() == second + 1
    other_service = FencedBus(bus, Fence(bus, "quota"))
    await other_service.fence.advance("replica-c", 1, 0.0)
    await new.publish([placed(6)])  # epochs are per service: quota's does not fence placement
    for b in (old, new, other_service):
        await b.close_fence()


async def test_the_epoch_itself_is_taken_by_one_of_two_racing_replicas(bus: Bus) -> None:
    await ensure_fence_subjects(bus)
    a, b = Fence(bus, "quota"), Fence(bus, "quota")
    results = await asyncio.gather(a.advance("a", 1, 0.0), b.advance("b", 1, 0.0), return_exceptions=True)
    assert sum(isinstance(r, Deposed) for r in results) <= 1  # both read the same last marker: one wins
    if not any(isinstance(r, Deposed) for r in results):  # or they did not race (one read after the other wrote)
        assert len({a.epoch, b.epoch}) == 2
    await a.close()
    await b.close()


async def test_one_replica_holds_the_lease_until_it_stops_renewing(bus: Bus) -> None:
    ttl = 1.5
    kv = await lease_store(bus, ttl_s=ttl)
    leader, standby = Lease(kv, "placement", "replica-a"), Lease(kv, "placement", "replica-b")
    assert await leader.try_acquire(0.0)
    assert not await standby.try_acquire(0.0)
    assert await standby.holder_now() == "replica-a"
    renewed = time.monotonic()
    for _ in range(6):  # renewed well within its TTL, for longer than the TTL, it stays the leader's
        await asyncio.sleep(0.3)
        renewed = time.monotonic()
        await leader.renew()
        assert not await standby.try_acquire(0.0)
    # Silent for longer than the TTL, it expires: not before the TTL has run out since its last renewal, and
    # soon after (how soon is the server's business; a loaded machine takes longer).
    while not await standby.try_acquire(0.0):
        assert time.monotonic() - renewed < ttl + 15.0, "the lease never expired"
        await asyncio.sleep(0.1)
    assert time.monotonic() - renewed >= ttl - 0.05
    with pytest.raises(LeaseLost, match="replica-b"):
        await leader.renew()
    assert await leader.holder_now() == "replica-b"

    await standby.release()  # a clean stop hands over at once
    assert await leader.try_acquire(0.0)
    restarted = Lease(kv, "placement", "replica-a")  # the same replica, restarted within the TTL
    assert await restarted.try_acquire(0.0)
