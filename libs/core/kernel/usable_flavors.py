"""Which of its queue's flavors a job can use: the one rule the quota decider reserves by and the preemption
decider simulates by, so that preemption never evicts for quota that quota would not give.

A flavor is quota of one GPU model (or of any model). Quota of a model the cluster has too few healthy GPUs of
for the job would never be placed: its reservation would time out again and again while quota of a model the
cluster has sits idle. So the queue's flavors the job may use (QuotaBook.flavors_for, in the queue's order) are
narrowed to those of a model the healthy GPUs of the registered nodes not cordoned could serve; all of them when
none could (then no flavor is better than another, and placement tells why the job cannot run).
"""

from __future__ import annotations

from collections.abc import Iterable

from contracts import EventBase, GpuHealthChanged, JobSpec, NodeCordoned, NodeLost, NodeRegistered, NodeUncordoned
from libs.core.kernel.accelerators import is_pattern, model_matches
from libs.core.kernel.quota_math import ANY, QuotaBook

MODEL_EVENTS = (NodeRegistered, NodeLost, GpuHealthChanged, NodeCordoned, NodeUncordoned)


class ModelCounts:
    """The healthy GPUs of each model on the registered nodes neither lost nor cordoned, folded from node events."""

    def __init__(self) -> None:
        self.healthy: dict[str, dict[int, tuple[str, bool]]] = {}  # node -> GPU index -> (model, healthy)
        self.cordoned: set[str] = set()  # out of placement until uncordoned (a registration keeps it so)
        self.by_model: dict[str, int] = {}  # model -> healthy GPUs of it
        self.version = 0  # bumps whenever `by_model` changes: answers cached per version go stale
        # `by_model` as it was before the last node event folded (the very same object when that event changed
        # no count): what a job was judged on before it, to tell whose flavors it moved.
        self.before: dict[str, int] = self.by_model

    def fold(self, event: EventBase) -> None:
        if not isinstance(event, MODEL_EVENTS):
            return
        self.before = self.by_model
        match event:
            case NodeRegistered():
                self.healthy[event.node.name] = {g.index: (g.model, g.healthy) for g in event.node.gpus}
            case NodeLost():
                if event.removed:  # out of the inventory: it comes back as new, its cordon forgotten (as nodes.py)
                    self.cordoned.discard(event.node)
                if self.healthy.pop(event.node, None) is None:
                    return
            case NodeCordoned():
                self.cordoned.add(event.node)
            case NodeUncordoned():
                self.cordoned.discard(event.node)
            case GpuHealthChanged():
                gpus = self.healthy.get(event.node)
                if gpus is None or event.index not in gpus or gpus[event.index][1] == event.healthy:
                    return
                gpus[event.index] = (gpus[event.index][0], event.healthy)
        self._recount()

    def _recount(self) -> None:
        counts: dict[str, int] = {}
        for node, gpus in self.healthy.items():
            if node in self.cordoned:
                continue
            for model, healthy in gpus.values():
                if healthy:
                    counts[model] = counts.get(model, 0) + 1
        if counts != self.by_model:
            self.by_model = counts  # a new object: `before` keeps the old one
            self.version += 1

    def could_hold(self, flavor: str, spec: JobSpec, demand_milli: int, counts: dict[str, int] | None = None) -> bool:
        """Are there enough healthy GPUs of the flavor's model (any the job allows, for ANY) for the job? By
        `counts` (healthy GPUs per model) when given, else by the counts as they are now."""
        by_model = self.by_model if counts is None else counts
        return sum(by_model.get(m, 0) for m in _models(flavor, spec, by_model)) * 1000 >= demand_milli

    def servable(self, flavors: tuple[str, ...], spec: JobSpec, demand_milli: int,
                 counts: dict[str, int] | None = None) -> tuple[str, ...]:
        """The flavors that could serve the job, in their order; all of them when none could. By `counts` as
        could_hold."""
        able = tuple(f for f in flavors if self.could_hold(f, spec, demand_milli, counts))
        return able if able else flavors


def usable_flavors(book: QuotaBook, models: ModelCounts, spec: JobSpec, demand_milli: int,
                   counts: dict[str, int] | None = None) -> tuple[str, ...]:
    """The flavors of the job's queue the job can use, in the queue's order (see above); by `counts` as
    ModelCounts.could_hold."""
    flavors = tuple(book.flavors_for(spec.queue, spec))
    if len(flavors) < 2:  # one flavor or none: nothing to narrow (servable keeps all when none could serve)
        return flavors
    return models.servable(flavors, spec, demand_milli, counts)


def _models(flavor: str, spec: JobSpec, by_model: dict[str, int]) -> Iterable[str]:
    if flavor != ANY:
        return (flavor,)
    if spec.gpu_models and not any(is_pattern(m) for m in spec.gpu_models):
        return spec.gpu_models
    return [m for m in by_model if model_matches(spec.gpu_models, m)]
