"""Nodes, as the informer sees them, into the log as the platform's inventory events:

- a Ready node whose inventory differs from the log's (or that the log says is lost): `NodeRegistered`;
- Ready=False / Unknown, or the Node deleted: `NodeLost`, and each run on it reported evicted (`node_lost`),
  under the ids an executor would use, as node-telemetry does for a silent agent;
- `spec.unschedulable` set or cleared: `CordonNode` / `UncordonNode` (node-telemetry records the cordon).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import msgspec

from contracts import CordonNode, EventBase, NodeLost, NodeRegistered, NodeSpec, UncordonNode
from libs.core.kernel.decider import derived_id
from libs.core.node_health.announcements import registration_id
from libs.kube.client import Obj
from libs.kube.dra import GPU_DRIVER, gpus_of, node_devices
from libs.kube.nodes import TopologyLabels, is_ready, is_unschedulable, node_spec
from libs.kube.reflector import DELETED, MODIFIED, version_of
from libs.kube.run_reports import Run
from libs.kube.workloads import meta
from services.kube_bridge.bridge import SOURCE, KubeBridge

log = logging.getLogger(__name__)
OPERATOR = "kubernetes"


@dataclass
class NodeSync:
    bridge: KubeBridge
    topology: TopologyLabels = field(default_factory=TopologyLabels)
    announced: dict[str, NodeSpec] = field(default_factory=dict)  # registrations not yet back from the log
    versions: dict[str, int] = field(default_factory=dict)  # registrations published per node
    lost_sent: set[str] = field(default_factory=set)
    unschedulable: dict[str, bool] = field(default_factory=dict)  # Kubernetes' cordon of each node, as last seen
    slices: dict[str, Obj] = field(default_factory=dict)  # the DRA driver's ResourceSlices, by name
    driver: str = GPU_DRIVER

    async def on_node(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        node = new if new is not None else old
        assert node is not None
        name = str(meta(node).get("name", ""))
        if kind == DELETED:
            self.bridge.cache.nodes.pop(name, None)
            await self.lose(name, "node_deleted")
            return
        self.bridge.cache.nodes[name] = node
        if not is_ready(node):
            await self.lose(name, "node_not_ready")
            return
        spec = node_spec(node, self.topology)
        devices = self.bridge.claims.devices.get(name)
        if devices:  # a DRA driver publishes the node's GPUs: its devices are the inventory
            spec = msgspec.structs.replace(spec, gpus=gpus_of(devices))
        await self.register(name, spec)
        await self.cordon(name, is_unschedulable(node), version_of(node))

    async def on_slice(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """A ResourceSlice changed: its node's GPU devices are read again from all of the node's slices, and the
        node registered again if its inventory changed."""
        obj = new if new is not None else old
        assert obj is not None
        key = str(meta(obj).get("name", ""))
        if kind == DELETED:
            self.slices.pop(key, None)
        else:
            self.slices[key] = obj
        node = (obj.get("spec", {}) or {}).get("nodeName")
        if not node:
            return
        found = node_devices([s for s in self.slices.values() if (s.get("spec", {}) or {}).get("nodeName") == node],
                             self.driver).get(node, [])
        if found:
            self.bridge.claims.devices[node] = found
        else:
            self.bridge.claims.devices.pop(node, None)
        if node in self.bridge.cache.nodes:
            await self.on_node(MODIFIED, None, self.bridge.cache.nodes[node])

    async def register(self, name: str, spec: NodeSpec) -> None:
        book = self.bridge.book
        logged = book.nodes.get(name)
        if self.announced.get(name) == spec or (logged == spec and name not in book.lost):
            return
        version = max(book.registrations.get(name, 0), self.versions.get(name, 0)) + 1
        self.versions[name] = version
        self.announced[name] = spec
        self.lost_sent.discard(name)
        log.info("node %s registered (version %d, %d GPUs)", name, version, len(spec.gpus))
        await self.bridge.publish([NodeRegistered(id=registration_id(spec, version), ts=time.time(), source=SOURCE,
                                                  correlation_id=name, node=spec)])

    async def lose(self, name: str, reason: str) -> None:
        """The node is gone or not ready: lost, and its runs with it (they run again elsewhere)."""
        book = self.bridge.book
        if name not in book.nodes and name not in self.announced:
            return
        if name in self.lost_sent or (name in book.lost and name not in self.announced):
            return
        self.lost_sent.add(name)
        self.announced.pop(name, None)
        version = max(book.registrations.get(name, 0), self.versions.get(name, 0))
        now = time.time()
        events: list[EventBase] = [NodeLost(id=derived_id(SOURCE, "lost", name, version), ts=now, source=SOURCE,
                                            correlation_id=name, node=name, reason=reason)]
        for job_id, (run, nodes) in sorted(self.bridge.book.runs_on.items()):
            if name in nodes:  # every run there, pods or not (a run left by another executor on a ghost node)
                events.append(Run(job_id, run, SOURCE).evicted(now, "node_lost"))
        log.warning("node %s lost (%s): %d run(s) evicted", name, reason, len(events) - 1)
        await self.bridge.publish(events)

    async def cordon(self, name: str, unschedulable: bool, version: str) -> None:
        """Kubernetes' cordon, mirrored by its transitions (and at first sight): set, the node is cordoned in the
        platform unless it already is; cleared, the platform's cordon is lifted only if Kubernetes set it. A cordon
        or drain of the platform's own operators (`gpusched node drain`) is theirs to lift."""
        before = self.unschedulable.get(name)
        self.unschedulable[name] = unschedulable
        if before == unschedulable:
            return
        cordoned_by = self.bridge.book.cordoned.get(name)
        if (unschedulable and cordoned_by is not None) or (not unschedulable and cordoned_by != OPERATOR):
            return
        now = time.time()
        command: EventBase
        if unschedulable:
            command = CordonNode(id=derived_id(SOURCE, "cordon", name, version), ts=now, source=SOURCE,
                                 correlation_id=name, node=name, reason="spec.unschedulable", operator=OPERATOR)
        else:
            command = UncordonNode(id=derived_id(SOURCE, "uncordon", name, version), ts=now, source=SOURCE,
                                   correlation_id=name, node=name, reason="spec.unschedulable cleared",
                                   operator=OPERATOR)
        await self.bridge.publish([command])
