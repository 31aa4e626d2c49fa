"""Agents' liveness: a node whose agent has not heartbeaten for `lost_after_s` is lost.

Node-telemetry then reports `NodeLost`; the roster (roster.py) reports the jobs that ran there evicted, on
the agent's behalf. A lost node whose agent heartbeats again is registered again (a new version of the same
inventory): placement may use it once more, and the agent, having seen itself lost, has killed its jobs.
Heartbeats are liveness, not facts: they travel on plain NATS and never enter the log. Every agent's node is
watched, whatever the platform's node backend, so that an agent that stops never leaves jobs on its node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from contracts import EventBase, JobEvicted, NodeLost, NodeRegistered
from libs.bus.jetstream import Bus
from libs.core.kernel.decider import derived_id
from libs.core.node_health.announcements import registration_id
from services.node_telemetry.roster import AGENTS, SERVICE, NodeRoster

log = logging.getLogger(__name__)


@dataclass
class HeartbeatWatch:
    roster: NodeRoster = field(default_factory=NodeRoster)
    lost_after_s: float = 10.0
    last_seen: dict[str, float] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)  # nodes we re-registered, awaiting the log's echo
    reported: set[str] = field(default_factory=set)  # runs on lost nodes this process reported evicted

    def fold(self, event: EventBase) -> None:
        self.roster.fold(event)
        if isinstance(event, NodeRegistered):
            self.announced.discard(event.node.name)

    def start_clock(self, now: float) -> None:
        """After a restart every agent of an online node gets a whole `lost_after_s` to be heard from again; a
        lost one comes back only when it is heard (the start is no sign of life)."""
        for name in self.roster.nodes_of(AGENTS):
            if self.roster.online.get(name):
                self.last_seen.setdefault(name, now)

    def heard(self, node: str, now: float) -> None:
        self.last_seen[node] = now

    def due(self, now: float) -> tuple[list[EventBase], list[EventBase]]:
        """(losses, comebacks): NodeLost for silent agents' nodes, and a new registration for lost ones that
        heartbeat again."""
        roster = self.roster
        lost: list[EventBase] = []
        back: list[EventBase] = []
        for name in roster.nodes_of(AGENTS):
            if name not in self.last_seen:
                if not roster.online.get(name):
                    continue  # lost, and not heard since this process started
                self.last_seen[name] = now  # an agent registered since the clock started
            silent = now - self.last_seen[name]
            version = roster.versions.get(name, 0)
            if roster.online.get(name) and silent > self.lost_after_s:
                lost.append(NodeLost(id=derived_id(SERVICE, "lost", name, version), ts=now, source=SERVICE,
                                     correlation_id=name, node=name,
                                     reason=f"heartbeat_timeout: nothing for {silent:.0f} s"))
                roster.online[name] = False  # until the log says otherwise, do not report it twice
            elif not roster.online.get(name) and silent <= self.lost_after_s and name not in self.announced:
                back.append(NodeRegistered(id=registration_id(roster.specs[name], version + 1), ts=now,
                                           source=SERVICE, correlation_id=name, node=roster.specs[name]))
                self.announced.add(name)
        return lost, back

    def orphans(self, now: float) -> list[EventBase]:
        """The runs on nodes lost for the roster's grace, each reported evicted once by this process."""
        return self.roster.orphans(now, self.reported)


async def watch_nodes(bus: Bus, watch: HeartbeatWatch, every_s: float = 0.5) -> None:
    """Listen to every agent's heartbeats; report losses, comebacks, and the jobs of nodes nobody serves."""

    async def on_beat(msg: Msg) -> None:
        try:
            node = str(json.loads(msg.data)["node"])
        except (ValueError, KeyError, TypeError):
            log.warning("malformed heartbeat on %s", msg.subject)
            return
        watch.heard(node, time.time())

    sub = await bus.nc.subscribe(f"{bus.config.subject_prefix}.hb.*", cb=on_beat)
    try:
        watch.start_clock(time.time())
        while True:
            await asyncio.sleep(every_s)
            now = time.time()
            lost, back = watch.due(now)
            for events in (lost, back, watch.orphans(now)):
                if events:
                    log.warning("%s", ", ".join(f"{type(e).__name__} {getattr(e, 'node', '')}".strip()
                                                 for e in events if not isinstance(e, JobEvicted)) or
                                f"{len(events)} run(s) on lost nodes reported evicted")
                    await bus.publish(events)
    finally:
        await sub.unsubscribe()
