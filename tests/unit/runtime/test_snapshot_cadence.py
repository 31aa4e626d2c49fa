"""When a snapshot is due: every so many events or seconds, but never so often that snapshots take more than
a small share of the service's time."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from libs.bus.jetstream import BusConfig
from libs.core.quota.decider import QuotaDecider
from libs.runtime.handler import DeciderHandler
from libs.runtime.snapshots import MAX_SHARE, SnapshotPolicy, Snapshotter


def snapshotter(every_events: int = 100, every_s: float = 3600.0) -> Snapshotter:
    bus: Any = SimpleNamespace(nc=None, config=BusConfig(stream="S", subject_prefix="s"))
    return Snapshotter(bus, DeciderHandler(QuotaDecider()), SnapshotPolicy(every_events=every_events, every_s=every_s))


def test_a_snapshot_is_due_after_enough_events() -> None:
    snaps = snapshotter()
    assert not snaps.due(10, 50)
    assert snaps.due(20, 60)  # 110 events since the last
    snaps._taken_seq = 20
    assert not snaps.due(20, 500)  # a snapshot never reflects a sequence it already holds


def test_a_quiet_service_is_snapshotted_after_the_period() -> None:
    snaps = snapshotter(every_s=10.0)
    assert not snaps.due(5, 1)
    snaps._taken_at = time.monotonic() - 11.0
    assert snaps.due(6, 1)


def test_under_heavy_traffic_snapshots_keep_to_their_share_of_the_time() -> None:
    snaps = snapshotter()
    snaps._cost_s = 0.5  # the last one took half a second to encode and store
    snaps._taken_at = time.monotonic() - 1.0
    assert not snaps.due(1_000, 10_000)  # plenty of events, but too soon
    snaps._taken_at = time.monotonic() - 0.5 / MAX_SHARE - 0.1
    assert snaps.due(2_000, 1)
