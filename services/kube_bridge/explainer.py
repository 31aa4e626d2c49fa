"""Why a job waits, where Kubernetes users look: each waiting or refused job's pods get `PodScheduled=False`
with the platform's reason code and explanation (what would unblock it, when it should start) and a
`FailedScheduling` Event; a Job (which has no pods while it waits) gets the Event. The explanation is the
one `gpusched explain` gives (`libs/views/explain.py`, over the read models), written only when it changed."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from contracts.views import Explanation, JobView, NodeView, QueueView
from libs.views.explain import explain
from libs.views.store import ViewStore
from services.kube_bridge.book import ENDED, JOB, WAITING, Tracked
from services.kube_bridge.bridge import KubeBridge

log = logging.getLogger(__name__)


def explanation_text(answer: Explanation) -> tuple[str, str]:
    """(reason code, message) of an explanation, the message in one line."""
    if not answer.reasons:
        return "waiting", f"waiting ({answer.phase or answer.state})"
    first = answer.reasons[0]
    parts = ["; ".join(r.message for r in answer.reasons)]
    if answer.unblock:
        parts.append("would unblock: " + "; ".join(answer.unblock))
    if answer.estimated_start is not None:
        when = datetime.fromtimestamp(answer.estimated_start, tz=UTC).isoformat(timespec="seconds")
        parts.append(f"estimated start {when}")
    return first.code, ". ".join(parts)


@dataclass
class Explainer:
    bridge: KubeBridge
    store: ViewStore | None
    every_s: float = 1.0

    async def run(self) -> None:
        while True:
            due = sorted(self.bridge.explain_due)
            self.bridge.explain_due.clear()
            world: World | None = None  # the read models, read once a round, only when a waiting job needs them
            for job_id in due:
                job = self.bridge.book.jobs.get(job_id)
                if job is None:
                    continue
                try:
                    if job.state == WAITING and self.store is not None and world is None:
                        world = await World.read(self.store)
                    if not await self.say(job, world):
                        self.bridge.explain_due.add(job_id)  # the read model lags the log: next round
                except Exception as err:
                    log.warning("explaining %s: %s", job_id, err)
            await asyncio.sleep(self.every_s)

    async def say(self, job: Tracked, world: World | None) -> bool:
        """Write the job's explanation; False when the read model has not caught up with it yet (never, without
        read models: a waiting job then says nothing more than its refusal would)."""
        refused = self.bridge.book.rejected.get(job.job_id)
        if job.state == ENDED and refused is not None:
            code, message = refused
        elif job.state == WAITING:
            if self.store is None or world is None:
                return True
            found = await world.explain(self.store, job.job_id)
            if found is None:
                return False
            code, message = found
        else:
            return True
        b = self.bridge
        if job.kind == JOB:
            obj = b.cache.batch_jobs.get((job.namespace, job.name))
            if obj is not None:
                await b.actions.say_waiting(obj, code, message, pod=False)
            return True
        for pod in b.cache.pods_of(job):
            if not pod.get("spec", {}).get("nodeName"):
                await b.actions.say_waiting(pod, code, message, pod=True)
        return True


@dataclass
class World:
    """What an explanation reads besides the job: the queues, the running jobs and the nodes."""

    queues: list[QueueView]
    running: list[JobView]
    nodes: list[NodeView]

    @classmethod
    async def read(cls, store: ViewStore) -> World:
        return cls(await store.queues(), await store.jobs(state="running", limit=100_000), await store.nodes())

    async def explain(self, store: ViewStore, job_id: str) -> tuple[str, str] | None:
        view = await store.job(job_id)
        if view is None or view.state != "pending":
            return None
        queue = next((q for q in self.queues if q.name == view.queue), None)
        answer = explain(view, queue, [j for j in self.running if j.queue == view.queue], self.running, self.nodes,
                         time.time())
        return explanation_text(answer)
