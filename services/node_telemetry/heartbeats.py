"""Agents' liveness: a node whose agent has not heartbeaten for `lost_after_s` is lost.

Node-telemetry then reports `NodeLost` and, on the agent's behalf, every job that ran there as evicted
(`node_lost`), under the ids the agent itself would use, so that a late report from the agent is the same
message. A lost node whose agent heartbeats again is registered again (a new version of the same
inventory): placement may use it once more, and the agent, having seen itself lost, has killed its jobs.
Heartbeats are liveness, not facts: they travel on plain NATS and never enter the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from contracts import EventBase, JobEvicted, JobFailed, JobFinished, JobPlaced, NodeLost, NodeRegistered, NodeSpec
from libs.bus.jetstream import Bus
from libs.core.decider import derived_id
from libs.core.inventory import registration_id
from libs.nodes.reports import report_id

log = logging.getLogger(__name__)
SERVICE = "node-telemetry"
AGENT_SOURCE = "agent/"


@dataclass
class HeartbeatWatch:
    lost_after_s: float = 10.0
    specs: dict[str, NodeSpec] = field(default_factory=dict)  # agent nodes, as last registered
    versions: dict[str, int] = field(default_factory=dict)
    online: dict[str, bool] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    runs: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # job -> (run id, its nodes)
    announced: set[str] = field(default_factory=set)  # nodes we re-registered, awaiting the log's echo

    def input_types(self) -> tuple[type[EventBase], ...]:
        return (NodeRegistered, NodeLost, JobPlaced, JobFinished, JobFailed, JobEvicted)

    def fold(self, event: EventBase) -> None:
        match event:
            case NodeRegistered():
                name = event.node.name
                self.versions[name] = self.versions.get(name, 0) + 1
                if event.source.startswith(AGENT_SOURCE) or name in self.specs:
                    self.specs[name], self.online[name] = event.node, True
                    self.announced.discard(name)
            case NodeLost() if event.node in self.specs:
                self.online[event.node] = False
            case JobPlaced():
                self.runs[event.job_id] = (event.id, frozenset(p.node for p in event.placements))
            case JobFinished() | JobFailed() | JobEvicted() if event.run in ("", self.runs.get(event.job_id, ("",))[0]):
                self.runs.pop(event.job_id, None)  # (a report about an earlier run leaves the current one)

    def start_clock(self, now: float) -> None:
        """After a restart every agent gets a whole `lost_after_s` to be heard from again."""
        for name in self.specs:
            self.last_seen.setdefault(name, now)

    def heard(self, node: str, now: float) -> None:
        self.last_seen[node] = now

    def due(self, now: float) -> tuple[list[EventBase], list[EventBase]]:
        """(losses, comebacks): NodeLost plus its jobs' evictions for silent nodes, and a new registration
        for lost nodes that heartbeat again."""
        lost: list[EventBase] = []
        back: list[EventBase] = []
        for name, spec in self.specs.items():
            silent = now - self.last_seen.get(name, now)
            version = self.versions.get(name, 0)
            if self.online.get(name) and silent > self.lost_after_s:
                lost.append(NodeLost(id=derived_id(SERVICE, "lost", name, version), ts=now, source=SERVICE,
                                     correlation_id=name, node=name,
                                     reason=f"heartbeat_timeout: nothing for {silent:.0f} s"))
                for job_id, (run_id, nodes) in self.runs.items():
                    if name in nodes:
                        lost.append(JobEvicted(id=report_id(run_id, "evicted"), ts=now, source=SERVICE,
                                               correlation_id=job_id, job_id=job_id, run=run_id, reason="node_lost"))
                self.online[name] = False  # until the log says otherwise, do not report it twice
            elif not self.online.get(name) and silent <= self.lost_after_s and name not in self.announced:
                back.append(NodeRegistered(id=registration_id(spec, version + 1), ts=now, source=SERVICE,
                                           correlation_id=name, node=spec))
                self.announced.add(name)
        return lost, back


async def watch_heartbeats(bus: Bus, watch: HeartbeatWatch, every_s: float = 0.5) -> None:
    """Listen to every agent's heartbeats and report losses and comebacks."""

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
            lost, back = watch.due(time.time())
            for events in (lost, back):
                if events:
                    log.warning("%s", ", ".join(f"{type(e).__name__} {getattr(e, 'node', '')}".strip()
                                                 for e in events if not isinstance(e, JobEvicted)))
                    await bus.publish(events)
    finally:
        await sub.unsubscribe()
