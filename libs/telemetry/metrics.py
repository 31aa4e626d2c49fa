"""Metrics every service exports, named gpusched_<thing>_<unit>."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("gpusched_events_consumed_total", "Log events a service consumed", ["service", "type"])
DECISIONS = Counter("gpusched_decisions_total", "Decisions a service published", ["service", "type"])
DEAD_LETTERS = Counter("gpusched_dead_letters_total", "Messages sent to the dead-letter stream",
                       ["service", "reason"])
BATCH_SECONDS = Histogram("gpusched_reactor_batch_seconds", "Time to decide and publish one fetched batch",
                          ["service"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
BATCH_SIZE = Histogram("gpusched_reactor_batch_events", "Events per fetched batch", ["service"],
                       buckets=(1, 5, 10, 50, 100, 250, 500, 1000))
LAST_SEQ = Gauge("gpusched_reactor_last_sequence", "Stream sequence of the last event processed", ["service"])
CATCH_UP_SECONDS = Gauge("gpusched_reactor_catch_up_seconds", "Time the last start-up replay took", ["service"])
LAG = Gauge("gpusched_reactor_lag_events", "Events in the log the service has not handled yet", ["service"])
# Snapshots (libs/runtime/snapshots.py) and replicas (libs/runtime/standby.py).
SNAPSHOTS_TAKEN = Counter("gpusched_snapshots_taken_total", "Snapshots of the service's state stored", ["service"])
SNAPSHOTS_FAILED = Counter("gpusched_snapshots_failed_total", "Snapshots that could not be stored", ["service"])
SNAPSHOTS_REJECTED = Counter("gpusched_snapshots_rejected_total",
                             "Snapshots found at start and ignored (the log is replayed instead)",
                             ["service", "reason"])
SNAPSHOT_SEQ = Gauge("gpusched_snapshot_sequence", "Log sequence the last stored or restored snapshot reflects",
                     ["service"])
SNAPSHOT_BYTES = Gauge("gpusched_snapshot_bytes", "Size of the last stored snapshot", ["service"])
SNAPSHOT_SECONDS = Gauge("gpusched_snapshot_capture_seconds",
                         "Time the last snapshot held the event loop (the state's encoding)", ["service"])
LEADER = Gauge("gpusched_replica_leader", "1 while this replica holds its service's lease and writes, else 0",
               ["service", "replica"])
TAKEOVERS = Counter("gpusched_replica_takeovers_total", "Times this replica took its service's lease over",
                    ["service", "replica"])
