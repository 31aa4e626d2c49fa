"""Snapshots on a real JetStream server: a service restarted from a snapshot holds exactly the state, and
makes exactly the decisions, of one that replayed the whole log; a snapshot that is corrupt, of other code,
ahead of the consumer or otherwise wrong is ignored (logged, counted) and the log replayed instead."""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
import pytest
from prometheus_client import REGISTRY

from contracts import EventBase, SubmitJob
from libs.bus.jetstream import Bus
from libs.bus.snapshot_store import Manifest, SnapshotStore, sha256_hex
from libs.core.admission.decider import AdmissionDecider
from libs.core.kernel.decider import Decider, run_decider
from libs.core.placement.decider import PlacementDecider
from libs.core.preemption.decider import PreemptionDecider
from libs.core.quota.decider import QuotaDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.reactor import Reactor
from libs.runtime.settings import DEFAULT_CLUSTER
from libs.runtime.snapshots import SnapshotPolicy, Snapshotter
from libs.sim.pipeline import run_virtual
from libs.sim.workload import synthetic_inputs

JOBS = 150
SNAPSHOT_EVERY = 100  # events: several snapshots over the first part of the log


@functools.cache
def history() -> list[EventBase]:
    """A realistic log: jobs submitted, admitted, reserved, placed, preempted, run and finished, with ticks."""
    return [e for _, e in run_virtual(synthetic_inputs(DEFAULT_CLUSTER, JOBS), tick_s=5.0).log]


class Observed(DeciderHandler):
    """The decider on the reactor, counting the events it replays and remembering the decisions it makes live
    (one class for every reactor here: the handler's code is part of a snapshot's code fingerprint)."""

    def __init__(self, decider: Decider) -> None:
        super().__init__(decider)
        self.replayed = 0
        self.made: list[EventBase] = []

    def replay(self, seq: int, event: EventBase) -> None:
        self.replayed += 1
        super().replay(seq, event)

    def on_event(self, seq: int, event: EventBase) -> list[EventBase]:
        out = super().on_event(seq, event)
        self.made += out
        return out


async def run_to_end(reactor: Reactor) -> None:
    """Handle everything the log holds for the service (the log does not grow meanwhile)."""
    while await reactor.step():
        pass


def snapshotter(bus: Bus, handler: Observed, every: int = SNAPSHOT_EVERY) -> Snapshotter:
    return Snapshotter(bus, handler, SnapshotPolicy(every_events=every, every_s=3600.0))


def rejected(service: str, reason: str) -> float:
    return REGISTRY.get_sample_value("gpusched_snapshots_rejected_total", {"service": service, "reason": reason}) or 0


async def handled_with_snapshots(bus: Bus, make: Callable[[], Decider], upto: int
                                 ) -> tuple[Decider, Snapshotter, int]:
    """Publish the first `upto` events of the history; a service handles them live, taking snapshots. Returns
    its decider, its snapshots and the last sequence it handled."""
    await bus.publish(history()[:upto])
    decider = make()
    handler = Observed(decider)
    snaps = snapshotter(bus, handler)
    reactor = Reactor(bus, handler, snapshots=snaps)
    await reactor.start()
    await run_to_end(reactor)
    await snaps.flush()
    return decider, snaps, reactor.last_seq


def cuts(events: list[EventBase]) -> tuple[int, int]:
    """Where to split the history: half and three quarters of the way through the submissions."""
    submits = [i for i, e in enumerate(events) if isinstance(e, SubmitJob)]
    return submits[len(submits) // 2], submits[len(submits) * 3 // 4]


@pytest.mark.parametrize("make", [AdmissionDecider, QuotaDecider, PlacementDecider, PreemptionDecider],
                         ids=lambda m: m.__name__)
async def test_a_service_restored_from_a_snapshot_decides_exactly_as_one_that_replayed_everything(
        bus: Bus, make: Callable[[], Decider]) -> None:
    events = history()
    snapshotted, restarted = cuts(events)
    # The service handles the first half taking snapshots, then a quarter more without.
    await bus.publish(events[:snapshotted])
    first = Observed(make())
    snaps = snapshotter(bus, first)
    reactor = Reactor(bus, first, snapshots=snaps)
    await reactor.start()
    await run_to_end(reactor)
    await snaps.flush()
    reactor.snapshots = None
    await bus.publish(events[snapshotted:restarted])
    await run_to_end(reactor)
    stored = await snaps.store.manifest()
    assert stored is not None and 0 < stored[0].seq <= snapshotted

    # Restarted from the snapshot: only the tail after it is replayed.
    restored = Observed(make())
    from_snapshot = Reactor(bus, restored, snapshots=snapshotter(bus, restored))
    await from_snapshot.start()
    # Restarted without one: everything is replayed.
    replayed = Observed(make())
    from_scratch = Reactor(bus, replayed, durable="from-scratch")
    await from_scratch.start()
    await run_to_end(from_scratch)

    assert 0 < restored.replayed < sum(isinstance(e, tuple(replayed.input_types())) for e in events[:restarted])
    assert from_snapshot.last_seq == reactor.last_seq
    for other in (first, replayed):
        assert restored.decider.snapshot() == other.decider.snapshot()
        assert restored.decider.chain == other.decider.chain

    # The rest of the history: the restored service decides live; the one that replayed, in memory.
    restored.made.clear()
    await bus.publish(events[restarted:])
    await run_to_end(from_snapshot)
    accepted = tuple(replayed.input_types())
    expected = [d for seq, e in enumerate(events[restarted:], restarted + 1) if isinstance(e, accepted)
                for d in run_decider(replayed.decider, e, seq)]
    assert expected and restored.made == expected
    assert restored.decider.snapshot() == replayed.decider.snapshot()
    assert restored.decider.chain == replayed.decider.chain


def corrupt(kind: str, m: Manifest, payload: bytes, floor: int) -> tuple[Manifest, bytes]:
    match kind:
        case "checksum":  # a flipped byte
            return m, payload[:100] + bytes([payload[100] ^ 1]) + payload[101:]
        case "unreadable":  # garbage that hashes as its manifest says
            junk = b"not a state image" * 10
            return msgspec.structs.replace(m, sha256=sha256_hex(junk), size=len(junk)), junk
        case "chain_mismatch":
            return msgspec.structs.replace(m, chain_length=m.chain_length + 1), payload
        case "ahead_of_ack_floor":
            return msgspec.structs.replace(m, seq=floor + 1), payload
        case "code_changed":
            return msgspec.structs.replace(m, code="0" * 32), payload
        case "format":
            return msgspec.structs.replace(m, format=m.format + 1), payload
        case "other_log":
            return msgspec.structs.replace(m, stream_created="2000-01-01T00:00:00+00:00"), payload
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["checksum", "unreadable", "chain_mismatch", "ahead_of_ack_floor", "code_changed",
                                  "format", "other_log"])
async def test_a_corrupt_or_mismatching_snapshot_is_ignored_and_the_log_replayed(
        bus: Bus, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    cut = len(history()) // 2
    first, snaps, handled = await handled_with_snapshots(bus, PlacementDecider, cut)
    found = await snaps.store.get()
    assert found is not None
    bad, payload = corrupt(kind, *found, floor=handled)
    store = SnapshotStore(bus, "placement")
    await store.put(bad, payload)
    before = rejected("placement", kind)

    handler = Observed(PlacementDecider())
    reactor = Reactor(bus, handler, snapshots=snapshotter(bus, handler))
    await reactor.start()

    assert rejected("placement", kind) == before + 1
    assert f"snapshot ignored ({kind}" in caplog.text
    assert handler.replayed == sum(isinstance(e, tuple(first.input_types())) for e in history()[:cut])  # all of it
    assert reactor.last_seq == handled
    assert handler.decider.snapshot() == first.snapshot() and handler.decider.chain == first.chain


async def test_without_a_snapshot_the_log_is_replayed(bus: Bus) -> None:
    await bus.publish(history()[:500])
    handler = Observed(QuotaDecider())
    first = Reactor(bus, DeciderHandler(QuotaDecider()))
    await first.start()
    await run_to_end(first)
    reactor = Reactor(bus, handler, snapshots=snapshotter(bus, handler))
    await reactor.start()
    assert reactor.last_seq == first.last_seq and handler.replayed > 0
    assert handler.decider.snapshot() == first.handler.decider.snapshot()  # type: ignore[attr-defined]


async def test_a_new_snapshot_keeps_the_previous_one_whole_until_its_manifest_is_stored(bus: Bus) -> None:
    """Two slots, used in turn: the chunks a manifest names are never overwritten by the next snapshot."""
    store = SnapshotStore(bus, "quota")
    from libs.bus.snapshot_store import ensure_snapshot_stream

    await ensure_snapshot_stream(bus)
    payloads = [bytes([i]) * (600 * 1024 + i) for i in range(3)]  # two chunks each
    slots = []
    for i, payload in enumerate(payloads):
        m = Manifest(format=1, service="quota", stream=bus.config.stream, stream_created="", seq=i + 1, chain_head="",
                     chain_length=0, code="", sha256=sha256_hex(payload), size=len(payload))
        stored = await store.put(m, payload)
        assert len(stored.chunks) == 2
        slots.append(stored.slot)
        found = await store.get()
        assert found is not None and found[1] == payload and found[0] == stored
    assert slots == ["a", "b", "a"]


async def test_no_snapshot_while_the_handler_has_reports_on_their_way_to_the_log(bus: Bus) -> None:
    """An executor's timers publish in the background after changing its state: a snapshot then could hold a
    finish that a crash keeps from ever reaching the log."""
    handler = Observed(QuotaDecider())
    shots = snapshotter(bus, handler, every=1)
    settled = False
    handler.snapshot_settled = lambda: settled  # type: ignore[attr-defined]
    assert not shots.due(10, 5)
    settled = True
    assert shots.due(10, 5)
