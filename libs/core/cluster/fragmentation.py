"""How fragmented each node leaves the cluster, against the typical request shapes (FGD, ATC'23), row by row:
the model FGD and packing score a replica's candidates by (libs/core/cluster/scoring.py), kept up to date as the
arrays change, and the shapes packing measures against (`packing_shapes`)."""

from __future__ import annotations

import bisect
import math

import numpy as np
import numpy.typing as npt

from libs.core.cluster.arrays import I64, ChangeLog, ClusterArrays
from libs.core.cluster.nodes import FULL
from libs.core.cluster.pairing import PairingPrices
from libs.core.cluster.shapes import Shape, TypicalShapes

# score s (1..99) of the FGD paper's int(100*sigmoid(x)) is reached when x >= logit(s/100).
_LOGIT = np.array([math.log(s / (100 - s)) for s in range(1, 100)])
# Up to this many rows, the fragmentation model is updated in plain Python (numpy's cost per call dominates).
FEW_ROWS = 4
# Contention is kept in integers: parts per CONTENTION_SCALE of a model's GPUs asked for.
CONTENTION_SCALE = 1_000_000
# A rare shape is scarce when the nodes that could host it (empty) hold less than 1/SCARCE_PART of the GPUs.
SCARCE_PART = 2
# packing ranks a GPU fraction's candidates by score - LOSS_STEP x pairing loss: any loss outweighs any
# difference of FGD's score (0..99), which decides among equal losses.
LOSS_STEP = 100


def packing_shapes(typical: TypicalShapes, arrays: ClusterArrays) -> TypicalShapes:
    """The shapes packing measures fragmentation against: the typical ones and the rare GPU shapes that only
    a small part of the cluster could host (GPU models, a node's whole CPU or GPU count). A rare shape that
    fits most nodes changes little when left out, but one that only a few nodes can take is invisible to
    the typical set: those nodes are then spent on work that could have gone anywhere, and the rare request
    (a 120-core 8-GPU job, a job limited to a scarce model) finds no room when it comes."""
    if not typical.rare:
        return typical
    gpus = np.array([len(x.gpus) for x in arrays.nodes], dtype=np.int64)
    cpu = np.array([x.cpu_milli for x in arrays.nodes], dtype=np.int64)
    total = int(gpus.sum())
    shapes, counts, memory = list(typical.shapes), list(typical.counts), list(typical.memory)
    rare_memory = typical.rare_memory or (0,) * len(typical.rare)
    for shape, count, mib in zip(typical.rare, typical.rare_counts, rare_memory, strict=True):
        if _supply(arrays, gpus, cpu, shape) * SCARCE_PART < total:
            shapes.append(shape)
            counts.append(count)
            memory.append(mib)
    return TypicalShapes(tuple(shapes), tuple(counts), memory=tuple(memory) if typical.memory else ())


def _supply(arrays: ClusterArrays, gpus: I64, cpu: I64, shape: Shape) -> int:
    """GPUs on the nodes that could host `shape` when empty."""
    able = (cpu >= shape.cpu_milli) & (gpus >= shape.gpus)
    if shape.models:
        able &= arrays.model_mask(shape.models)
    return int(gpus[able].sum())


class FragModel:
    """Per-node fragmentation against the typical shapes, cached row by row (integer weights), under FGD's
    measure (`frag`) and, when `multi_copy` is set, also the multi-copy one (`frag_multi`: GPUs a node cannot
    use for lack of CPU, or of memory where the shapes' memory is known, count as fragment too). Both share
    the per-node, per-shape counts. `contention`: per node, how much of the GPUs they may use the typical
    shapes limited to some GPU models ask for (fixed for a set of nodes and typical shapes). `pairing`: the
    workload's pairing prices (packing's model only), see `rank_shared`."""

    def __init__(self, arrays: ClusterArrays, typical: TypicalShapes, multi_copy: bool = False,
                 pairing: PairingPrices | None = None) -> None:
        self.multi_copy = multi_copy
        self.pairing = pairing
        gpu_shapes = [(s, c) for s, c in zip(typical.shapes, typical.counts, strict=True) if s.gpu_milli > 0]
        memory = dict(zip(typical.shapes, typical.memory, strict=True)) if typical.memory else {}
        self.w_cpu = sum(c for s, c in zip(typical.shapes, typical.counts, strict=True) if s.gpu_milli == 0)
        self.w_total = max(typical.total, 1)
        self.milli = np.array([s.gpu_milli for s, _ in gpu_shapes], dtype=np.int64)
        self.num = np.array([s.gpus for s, _ in gpu_shapes], dtype=np.int64)
        self.cpu = np.array([s.cpu_milli for s, _ in gpu_shapes], dtype=np.int64)
        self.weights = np.array([c for _, c in gpu_shapes], dtype=np.int64)
        # A shape's mean memory request (MiB); 0 where unknown: its copies are then not limited by memory.
        self.mem = np.array([memory.get(s, 0) for s, _ in gpu_shapes], dtype=np.int64)
        self.models = [s.models for s, _ in gpu_shapes]
        self.arrays = arrays
        self.thresholds = _LOGIT * 1000.0 * self.w_total
        self._thresholds = self.thresholds.tolist()
        # Constants of `update`, shaped once (and as Python lists, for updating a few rows).
        self._milli3 = self.milli[None, None, :]
        self._cpu_at_least_1 = np.maximum(self.cpu, 1)
        self._mem_at_least_1 = np.maximum(self.mem, 1)
        self._shapes = list(zip(self.milli.tolist(), self.num.tolist(), self.cpu.tolist(), self.weights.tolist(),
                                self._cpu_at_least_1.tolist(), self.mem.tolist(), strict=True))
        self._share_cache: dict[tuple[bytes, int, int], tuple[npt.NDArray[np.int32], ...]] = {}
        self.changes = ChangeLog()
        self.rebuild()

    def rebuild(self) -> None:
        arrays = self.arrays
        nodes, shapes = len(arrays.nodes), len(self.weights)
        self.acc = np.ones((nodes, shapes), dtype=bool)
        for shape, models in enumerate(self.models):
            if models:
                self.acc[:, shape] = arrays.model_mask(models)
        # Contention: per shape limited to some models, its demand (count x GPUs x share) over the GPUs of the
        # nodes it may use; per node, the sum over such shapes that may use it. Shapes free to use any model
        # would add the same to every node, and are left out.
        gpus = np.array([len(x.gpus) for x in arrays.nodes], dtype=np.int64)
        supply = (self.acc * gpus[:, None]).sum(axis=0)
        limited = np.array([bool(models) for models in self.models], dtype=bool)
        per_shape = np.where(limited & (supply > 0),
                             self.weights * self.num * self.milli * CONTENTION_SCALE // np.maximum(supply, 1), 0)
        self.contention: I64 = self.acc.astype(np.int64) @ per_shape.astype(np.int64)
        self.contention_rows: list[int] = self.contention.tolist()
        # Per node and typical shape (int32: small values, half the memory traffic of int64):
        # GPUs that could host the shape, minus how many it needs
        self.spare = np.zeros((nodes, shapes), dtype=np.int32)
        self.fragp = np.zeros((nodes, shapes), dtype=np.int32)  # share on GPUs too small for the shape
        self.fits = np.zeros((nodes, shapes), dtype=np.int32)  # share on GPUs big enough for the shape
        self.cpu_slack = np.zeros((nodes, shapes), dtype=np.int32)  # CPU left minus the shape's CPU
        self.idle = np.zeros(nodes, dtype=np.int64)
        self.frag = np.zeros(nodes, dtype=np.int64)
        self.frag_multi = np.zeros(nodes, dtype=np.int64)
        # Rows read back as Python values (for scoring a few candidates), made on demand, dropped on update.
        self._rows: dict[int, tuple[list[bool], list[int], list[int], list[int], list[int], int, int, int]] = {}
        self.update(np.arange(nodes))
        self.version = arrays.version

    def update(self, rows: npt.ArrayLike) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        changed = rows.tolist()
        self.changes.add(changed)
        for row in changed:
            self._rows.pop(row, None)
        if rows.size <= FEW_ROWS:
            self._update_few(rows)
            return
        arrays = self.arrays
        free_by_gpu = arrays.free[rows]  # (rows, GPUs)
        free = free_by_gpu[:, :, None]  # (rows, GPUs, 1)
        big = free >= self._milli3  # GPUs big enough for each shape
        count = big.sum(axis=1)  # (rows, shapes): GPUs that could host the shape
        spare = count - self.num
        # Share on GPUs too small for the shape ((0 < free < milli)), and on GPUs big enough.
        fragp = np.where(big, 0, np.where(free > 0, free, 0)).sum(axis=1)
        fits = np.where(big, free, 0).sum(axis=1)
        cpu = arrays.cpu[rows]
        idle = np.where(free_by_gpu > 0, free_by_gpu, 0).sum(axis=1)
        self.spare[rows] = spare
        self.fragp[rows] = fragp
        self.fits[rows] = fits
        self.cpu_slack[rows] = cpu[:, None] - self.cpu
        self.idle[rows] = idle
        # As _unusable, on the values just computed (small enough that the int32 tables hold them exactly).
        acc = self.acc[rows]
        usable = acc & (spare >= 0) & (cpu[:, None] >= self.cpu)
        self.frag[rows] = self.w_cpu * idle + np.where(usable, fragp, idle[:, None]) @ self.weights
        if self.multi_copy:
            spill = self._spill(acc, count, fits, cpu, arrays.mem[rows])
            self.frag_multi[rows] = self.w_cpu * idle + (fragp + spill) @ self.weights

    def _update_few(self, rows: I64) -> None:
        """`update` row by row in plain integers: the same numbers, without numpy's cost per call."""
        arrays = self.arrays
        w_cpu, multi = self.w_cpu, self.multi_copy
        for row in rows.tolist():
            free = arrays.free_rows[row]
            cpu, mem = int(arrays.cpu[row]), int(arrays.mem[row])
            acc = self.acc[row].tolist()
            idle = 0
            for share in free:
                if share > 0:
                    idle += share
            spare, fragp, fits = [], [], []
            unusable = unusable_multi = 0
            for shape, (milli, num, shape_cpu, weight, cpu_at_least_1, shape_mem) in enumerate(self._shapes):
                count = small = big = 0
                for share in free:
                    if share >= milli:
                        count += 1
                        big += share
                    elif share > 0:
                        small += share
                spare.append(count - num)
                fragp.append(small)
                fits.append(big)
                unusable += (small if acc[shape] and count >= num and cpu >= shape_cpu else idle) * weight
                if multi:
                    spill = _spill_one(acc[shape], count, big, num, cpu, cpu_at_least_1, mem, shape_mem)
                    unusable_multi += (small + spill) * weight
            self.spare[row] = spare
            self.fragp[row] = fragp
            self.fits[row] = fits
            self.idle[row] = idle
            self.frag[row] = w_cpu * idle + unusable
            if multi:
                self.frag_multi[row] = w_cpu * idle + unusable_multi
        self.cpu_slack[rows] = arrays.cpu[rows][:, None] - self.cpu

    def _unusable(self, rows: I64, fragp: npt.NDArray[np.int32], fits: npt.NDArray[np.int32],
                  spare: npt.NDArray[np.int32], cpu: I64, idle: I64, multi: bool, mem: I64) -> I64:
        """Per node and shape, the free share that shape could not use (what fragmentation sums)."""
        acc = self.acc[rows]
        if not multi:
            usable = acc & (spare >= 0) & (cpu[:, None] >= self.cpu)
            return np.where(usable, fragp, idle[:, None]).astype(np.int64)
        count = (spare + self.num).astype(np.int64)
        return fragp.astype(np.int64) + self._spill(acc, count, fits.astype(np.int64), cpu, mem)

    def _spill(self, acc: npt.NDArray[np.bool_], count: npt.NDArray[np.int64] | npt.NDArray[np.int32],
               fits: npt.NDArray[np.int64] | npt.NDArray[np.int32], cpu: I64, mem: I64) -> I64:
        """Per node and shape, the big-enough share the multi-copy measure counts as fragment too: what the GPUs
        the node's copies of the shape cannot use (for lack of CPU or memory) hold, pro rata."""
        copies = self._copies(count, cpu, mem)
        copies = np.where(acc, np.maximum(copies, 0), 0)
        used = np.minimum(copies * self.num, count)
        return np.where(count > 0, fits * (count - used) // np.maximum(count, 1), 0)

    def _copies(self, count: npt.NDArray[np.int64] | npt.NDArray[np.int32], cpu: I64, mem: I64) -> I64:
        """Per node and shape, how many copies of the shape the node could host: GPUs, CPU and memory."""
        copies = np.minimum(count // self.num, cpu[:, None] // self._cpu_at_least_1)
        if self.mem.any():
            copies = np.where(self.mem > 0, np.minimum(copies, mem[:, None] // self._mem_at_least_1), copies)
        return copies.astype(np.int64)

    def _per_candidate(self, free: I64, gpus: int, milli: int, uniform: bool = False
                       ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """_per_share for each candidate's share, computed once per distinct share (and remembered: the same
        few shares and request sizes come back all the time). `uniform`: every candidate has the same share."""
        if free.size and (uniform or free.min() == free.max()):
            shares, inverse = free[:1], None
        else:
            shares, inverse = np.unique(free, return_inverse=True)
        key = (shares.tobytes(), gpus, milli)
        tables = self._share_cache.get(key)
        if tables is None:
            if len(self._share_cache) > 4096:
                self._share_cache.clear()
            tables = self._share_cache[key] = self._per_share(shares, gpus, milli)
        if inverse is None:
            return tables[0][0], tables[1][0], tables[2][0]
        return tables[0][inverse], tables[1][inverse], tables[2][inverse]

    def _per_share(self, free: I64, gpus: int, milli: int
                   ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """For `gpus` GPUs of each free share losing `milli` each, per shape: the change of the too-small share,
        of the big-enough share, and the GPUs that stop fitting."""
        before = free[:, None]
        shape_milli = self.milli[None, :]
        left = before - milli
        small_before = np.where((before > 0) & (before < shape_milli), before, 0)
        small_after = np.where((left > 0) & (left < shape_milli), left, 0)
        dfits = np.where(left >= shape_milli, left, 0) - np.where(before >= shape_milli, before, 0)
        lost = (before >= shape_milli) & (left < shape_milli)
        return ((gpus * (small_after - small_before)).astype(np.int32), (gpus * dfits).astype(np.int32),
                (gpus * lost).astype(np.int32))

    def after(self, rows: I64, free: I64, gpus: int, milli: int, cpu: int, multi: bool = False,
              uniform: bool = False, mem: int = 0) -> I64:
        """Scaled fragmentation of each candidate node after taking `gpus` GPUs of free share `free` by `milli`
        each (and `cpu` CPU, `mem` memory), under FGD's measure or (`multi`) the multi-copy one. Integer
        arithmetic. `uniform`: every candidate's share is the same."""
        dfrag, dfits, lost = self._per_candidate(free, gpus, milli, uniform)
        idle = self.idle[rows] - gpus * milli
        if not multi:  # the paper's measure, on the cheapest path
            usable = self.acc[rows] & (self.spare[rows] >= lost) & (self.cpu_slack[rows] >= cpu)
            unusable = np.where(usable, self.fragp[rows] + dfrag, idle[:, None].astype(np.int32))
            return self.w_cpu * idle + (unusable.astype(np.int64) @ self.weights)
        unusable64 = self._unusable(rows, self.fragp[rows] + dfrag, self.fits[rows] + dfits, self.spare[rows] - lost,
                                    self.arrays.cpu[rows] - cpu, idle, True, self.arrays.mem[rows] - mem)
        return self.w_cpu * idle + unusable64 @ self.weights

    def row(self, node: int) -> tuple[list[bool], list[int], list[int], list[int], list[int], int, int, int]:
        """Row `node` as Python values: acc, spare, fragp, fits, cpu_slack, idle, frag, frag_multi."""
        row = self._rows.get(node)
        if row is None:
            row = self._rows[node] = (self.acc[node].tolist(), self.spare[node].tolist(), self.fragp[node].tolist(),
                                      self.fits[node].tolist(), self.cpu_slack[node].tolist(), int(self.idle[node]),
                                      int(self.frag[node]), int(self.frag_multi[node]))
        return row

    def after_one(self, row: int, free: int, gpus: int, milli: int, cpu: int, multi: bool = False,
                  mem: int = 0) -> int:
        """`after` for one candidate (node `row`, free share `free`), in plain integers."""
        acc, spare, fragp, fits, slack, idle, _, _ = self.row(row)
        idle -= gpus * milli
        if multi:
            cpu_left = int(self.arrays.cpu[row]) - cpu
            mem_left = int(self.arrays.mem[row]) - mem
        unusable = 0
        left = free - milli
        for shape, (shape_milli, num, _, weight, cpu_at_least_1, shape_mem) in enumerate(self._shapes):
            # _per_share: the change of the too-small share, of the big-enough share, GPUs that stop fitting
            dfrag = gpus * ((left if 0 < left < shape_milli else 0) - (free if 0 < free < shape_milli else 0))
            lost = gpus if free >= shape_milli > left else 0
            small = fragp[shape] + dfrag
            if not multi:
                unusable += (small if acc[shape] and spare[shape] >= lost and slack[shape] >= cpu else idle) * weight
                continue
            big = fits[shape] + gpus * ((left if left >= shape_milli else 0) - (free if free >= shape_milli else 0))
            count = spare[shape] - lost + num
            spill = _spill_one(acc[shape], count, big, num, cpu_left, cpu_at_least_1, mem_left, shape_mem)
            unusable += (small + spill) * weight
        return self.w_cpu * idle + unusable

    def rank_shared(self, score: I64, free: I64, milli: int) -> I64:
        """A GPU fraction's candidates (GPUs with `free` share free) ranked by pairing loss first, then by
        score."""
        if self.pairing is None:
            return score
        return score - LOSS_STEP * self.pairing.loss(milli)[np.minimum(free, FULL)]

    def rank_shared_one(self, score: int, free: int, milli: int) -> int:
        """rank_shared of one candidate (free <= FULL)."""
        if self.pairing is None:
            return score
        return score - LOSS_STEP * self.pairing.loss_list(milli)[free]

    def sigmoid_one(self, delta: int) -> int:
        """sigmoid_score of one integer drop."""
        return bisect.bisect_right(self._thresholds, float(delta))

    def sigmoid_score(self, delta: I64) -> I64:
        """The FGD paper's int(100*sigmoid(dF/1000)), from the scaled integer drop in fragmentation."""
        return np.searchsorted(self.thresholds, delta.astype(np.float64), side="right").astype(np.int64)


def _spill_one(accepts: bool, count: int, big: int, num: int, cpu: int, cpu_at_least_1: int, mem: int,
               shape_mem: int) -> int:
    """FragModel._spill for one node and shape, in plain integers: of the `count` GPUs big enough for the shape
    (holding `big` share), what the node's copies of it cannot use for lack of CPU or memory holds, pro rata."""
    copies = min(count // num, cpu // cpu_at_least_1)
    if shape_mem:
        copies = min(copies, mem // shape_mem)
    copies = max(copies, 0) if accepts else 0
    used = min(copies * num, count)
    return big * (count - used) // max(count, 1) if count > 0 else 0
