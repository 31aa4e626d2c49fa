"""Request shapes and the "typical" ones: the most frequent shapes covering 95 % of a workload, each with
its count. Fragmentation is measured against them (FGD, ATC'23): idle GPU share that the typical requests
cannot use is wasted. The rarer GPU shapes are kept apart (`rare`): the default policy also measures
against those of them that only a small part of the cluster can host
(libs.core.cluster.fragmentation.packing_shapes)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from contracts import JobSpec
from libs.core.cluster.pairing import PairingPrices, pairing_prices


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One replica's request as fragmentation sees it. Memory is not part of it (it never fragments GPUs)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only request
    gpus: int
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: JobSpec) -> Shape:
        if spec.gpu_milli > 0:
            milli, count = spec.gpu_milli, 1
        else:
            milli, count = (1000, spec.gpus) if spec.gpus > 0 else (0, 0)
        # Kubernetes counts a request of 0 CPU as 100m; the protocol's shapes do too.
        return cls(cpu_milli=spec.cpu_milli or 100, gpu_milli=milli, gpus=count, models=tuple(sorted(spec.gpu_models)))


@dataclass(frozen=True, slots=True)
class TypicalShapes:
    shapes: tuple[Shape, ...]
    counts: tuple[int, ...]
    # GPU shapes beyond the coverage, most frequent first, with their counts.
    rare: tuple[Shape, ...] = ()
    rare_counts: tuple[int, ...] = ()
    # The mean memory (MiB) of the requests of each shape, and of each rare one; empty when not known.
    memory: tuple[int, ...] = ()
    rare_memory: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts)


def typical_shapes(specs: Iterable[JobSpec], coverage: float = 0.95) -> TypicalShapes:
    """Shapes by count, most frequent first (ties: the larger shape first), taken until they cover
    `coverage` of all requests. Counts are kept as integers so that scores stay exact."""
    counts: dict[Shape, int] = {}
    memory: dict[Shape, int] = {}
    for spec in specs:
        s = Shape.of(spec)
        counts[s] = counts.get(s, 0) + 1
        memory[s] = memory.get(s, 0) + spec.memory_mib
    return typical_from_counts(counts, coverage, memory)


def typical_from_counts(counts: dict[Shape, int], coverage: float = 0.95,
                        memory: dict[Shape, int] | None = None) -> TypicalShapes:
    """`memory`: the summed memory of the requests of each shape, when known."""
    n = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _desc(kv[0])))
    shapes: list[Shape] = []
    taken: list[int] = []
    covered = 0
    for shape, count in ranked:
        if count <= 0:
            break
        if n and covered >= coverage * n:
            break
        shapes.append(shape)
        taken.append(count)
        covered += count
    rare = [(shape, count) for shape, count in ranked[len(shapes):] if count > 0 and shape.gpus > 0]
    mean: tuple[int, ...] = ()
    rare_mean: tuple[int, ...] = ()
    if memory is not None:
        mean = tuple(memory.get(s, 0) // c for s, c in zip(shapes, taken, strict=True))
        rare_mean = tuple(memory.get(s, 0) // c for s, c in rare)
    return TypicalShapes(tuple(shapes), tuple(taken), tuple(s for s, _ in rare), tuple(c for _, c in rare),
                         mean, rare_mean)


class ShapeWindow:
    """The request shapes of the last `size` submissions, and their typical set, recomputed every `every`
    submissions (not on each one, so that scores stay stable between recomputations)."""

    def __init__(self, size: int = 5000, every: int = 250) -> None:
        self.size, self.every = size, every
        self.recent: deque[tuple[Shape, int]] = deque()  # shape and memory of each submission
        self.counts: dict[Shape, int] = {}
        self.memory: dict[Shape, int] = {}
        self.since = 0
        self.typical: TypicalShapes | None = None

    def add(self, spec: JobSpec) -> bool:
        """Count a submission; True when the typical set was recomputed."""
        shape = Shape.of(spec)
        self.recent.append((shape, spec.memory_mib))
        self.counts[shape] = self.counts.get(shape, 0) + 1
        self.memory[shape] = self.memory.get(shape, 0) + spec.memory_mib
        if len(self.recent) > self.size:
            old, mib = self.recent.popleft()
            self.counts[old] -= 1
            self.memory[old] -= mib
        self.since += 1
        if self.typical is None or self.since >= self.every:
            self.typical = typical_from_counts(self.counts, memory=self.memory)
            self.since = 0
            return True
        return False


def _desc(shape: Shape) -> tuple[int, int, int, tuple[int, ...]]:
    # Larger first on ties: negate the numeric fields; models compare by their code points, negated.
    return (-shape.cpu_milli, -shape.gpu_milli, -shape.gpus, tuple(-ord(c) for c in "|".join(shape.models)))


def shared_pairing(typical: TypicalShapes) -> PairingPrices | None:
    """Pairing prices for the GPU fractions of a workload: its typical and rare one-GPU shapes by share."""
    shapes = typical.shapes + typical.rare
    counts = typical.counts + typical.rare_counts
    return pairing_prices((s.gpu_milli, c) for s, c in zip(shapes, counts, strict=True) if s.gpus == 1)
