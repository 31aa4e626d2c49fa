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
        self.w = np.array([c for _, c in gpu_shapes], dtype=np.int64)
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
        self._shapes = list(zip(self.milli.tolist(), self.num.tolist(), self.cpu.tolist(), self.w.tolist(),
                                self._cpu_at_least_1.tolist(), self.mem.tolist(), strict=True))
        self._share_cache: dict[tuple[bytes, int, int], tuple[npt.NDArray[np.int32], ...]] = {}
        self.changes = ChangeLog()
        self.rebuild()

    def rebuild(self) -> None:
        a = self.arrays
        n, t = len(a.nodes), len(self.w)
        self.acc = np.ones((n, t), dtype=bool)
        for j, models in enumerate(self.models):
            if models:
                self.acc[:, j] = a.model_mask(models)
        # Contention: per shape limited to some models, its demand (count x GPUs x share) over the GPUs of the
        # nodes it may use; per node, the sum over such shapes that may use it. Shapes free to use any model
        # would add the same to every node, and are left out.
        gpus = np.array([len(x.gpus) for x in a.nodes], dtype=np.int64)
        supply = (self.acc * gpus[:, None]).sum(axis=0)
        limited = np.array([bool(models) for models in self.models], dtype=bool)
        per_shape = np.where(limited & (supply > 0),
                             self.w * self.num * self.milli * CONTENTION_SCALE // np.maximum(supply, 1), 0)
        self.contention: I64 = self.acc.astype(np.int64) @ per_shape.astype(np.int64)
        self.contention_rows: list[int] = self.contention.tolist()
        # Per node and typical shape (int32: small values, half the memory traffic of int64):
        self.spare = np.zeros((n, t), dtype=np.int32)  # GPUs that could host the shape, minus how many it needs
        self.fragp = np.zeros((n, t), dtype=np.int32)  # share on GPUs too small for the shape
        self.fits = np.zeros((n, t), dtype=np.int32)  # share on GPUs big enough for the shape
        self.cpu_slack = np.zeros((n, t), dtype=np.int32)  # CPU left minus the shape's CPU
        self.idle = np.zeros(n, dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.int64)
        self.frag_multi = np.zeros(n, dtype=np.int64)
        # Rows read back as Python values (for scoring a few candidates), made on demand, dropped on update.
        self._rows: dict[int, tuple[list[bool], list[int], list[int], list[int], list[int], int, int, int]] = {}
        self.update(np.arange(n))
        self.version = a.version

    def update(self, rows: npt.ArrayLike) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        changed = rows.tolist()
        self.changes.add(changed)
        for r in changed:
            self._rows.pop(r, None)
        if rows.size <= FEW_ROWS:
            self._update_few(rows)
            return
        a = self.arrays
        free2 = a.free[rows]  # (r, g)
        free = free2[:, :, None]  # (r, g, 1)
        big = free >= self._milli3  # GPUs big enough for each shape
        count = big.sum(axis=1)  # (r, t): GPUs that could host the shape
        spare = count - self.num
        # Share on GPUs too small for the shape ((0 < free < milli)), and on GPUs big enough.
        fragp = np.where(big, 0, np.where(free > 0, free, 0)).sum(axis=1)
        fits = np.where(big, free, 0).sum(axis=1)
        cpu = a.cpu[rows]
        idle = np.where(free2 > 0, free2, 0).sum(axis=1)
        self.spare[rows] = spare
        self.fragp[rows] = fragp
        self.fits[rows] = fits
        self.cpu_slack[rows] = cpu[:, None] - self.cpu
        self.idle[rows] = idle
        # As _unusable, on the values just computed (small enough that the int32 tables hold them exactly).
        acc = self.acc[rows]
        q3 = acc & (spare >= 0) & (cpu[:, None] >= self.cpu)
        self.frag[rows] = self.w_cpu * idle + np.where(q3, fragp, idle[:, None]) @ self.w
        if self.multi_copy:
            copies = self._copies(count, cpu, a.mem[rows])
            copies = np.where(acc, np.maximum(copies, 0), 0)
            used = np.minimum(copies * self.num, count)
            spill = np.where(count > 0, fits * (count - used) // np.maximum(count, 1), 0)
            self.frag_multi[rows] = self.w_cpu * idle + (fragp + spill) @ self.w

    def _update_few(self, rows: I64) -> None:
        """`update` row by row in plain integers: the same numbers, without numpy's cost per call."""
        a = self.arrays
        w_cpu, multi = self.w_cpu, self.multi_copy
        for r in rows.tolist():
            free = a.free_rows[r]
            cpu, mem = int(a.cpu[r]), int(a.mem[r])
            acc = self.acc[r].tolist()
            idle = 0
            for x in free:
                if x > 0:
                    idle += x
            spare, fragp, fits = [], [], []
            g = g_multi = 0
            for j, (milli, num, shape_cpu, w, cpu_at_least_1, shape_mem) in enumerate(self._shapes):
                count = small = big = 0
                for x in free:
                    if x >= milli:
                        count += 1
                        big += x
                    elif x > 0:
                        small += x
                spare.append(count - num)
                fragp.append(small)
                fits.append(big)
                g += (small if acc[j] and count >= num and cpu >= shape_cpu else idle) * w
                if multi:
                    copies = min(count // num, cpu // cpu_at_least_1)
                    if shape_mem:
                        copies = min(copies, mem // shape_mem)
                    copies = max(copies, 0) if acc[j] else 0
                    used = min(copies * num, count)
                    spill = big * (count - used) // max(count, 1) if count > 0 else 0
                    g_multi += (small + spill) * w
            self.spare[r] = spare
            self.fragp[r] = fragp
            self.fits[r] = fits
            self.idle[r] = idle
            self.frag[r] = w_cpu * idle + g
            if multi:
                self.frag_multi[r] = w_cpu * idle + g_multi
        self.cpu_slack[rows] = a.cpu[rows][:, None] - self.cpu

    def _unusable(self, rows: I64, fragp: npt.NDArray[np.int32], fits: npt.NDArray[np.int32],
                  spare: npt.NDArray[np.int32], cpu: I64, idle: I64, multi: bool, mem: I64) -> I64:
        """Per node and shape, the free share that shape could not use (what fragmentation sums)."""
        acc = self.acc[rows]
        if not multi:
            q3 = acc & (spare >= 0) & (cpu[:, None] >= self.cpu)
            return np.where(q3, fragp, idle[:, None]).astype(np.int64)
        cnt = (spare + self.num).astype(np.int64)
        copies = self._copies(cnt, cpu, mem)
        copies = np.where(acc, np.maximum(copies, 0), 0)
        used = np.minimum(copies * self.num, cnt)
        spill = np.where(cnt > 0, fits.astype(np.int64) * (cnt - used) // np.maximum(cnt, 1), 0)
        return fragp.astype(np.int64) + spill

    def _copies(self, count: npt.NDArray[np.int64] | npt.NDArray[np.int32], cpu: I64, mem: I64) -> I64:
        """Per node and shape, how many copies of the shape the node could host: GPUs, CPU and memory."""
        copies = np.minimum(count // self.num, cpu[:, None] // self._cpu_at_least_1)
        if self.mem.any():
            copies = np.where(self.mem > 0, np.minimum(copies, mem[:, None] // self._mem_at_least_1), copies)
        return copies.astype(np.int64)

    def _per_candidate(self, v: I64, k: int, m: int, uniform: bool = False
                       ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """_per_share for each candidate's share, computed once per distinct share (and remembered: the same
        few shares and request sizes come back all the time). `uniform`: every candidate has the same share."""
        if v.size and (uniform or v.min() == v.max()):
            shares, inverse = v[:1], None
        else:
            shares, inverse = np.unique(v, return_inverse=True)
        key = (shares.tobytes(), k, m)
        tables = self._share_cache.get(key)
        if tables is None:
            if len(self._share_cache) > 4096:
                self._share_cache.clear()
            tables = self._share_cache[key] = self._per_share(shares, k, m)
        if inverse is None:
            return tables[0][0], tables[1][0], tables[2][0]
        return tables[0][inverse], tables[1][inverse], tables[2][inverse]

    def _per_share(self, v: I64, k: int, m: int
                   ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """For GPUs of free share v losing m, per shape: the change of the too-small share, of the big-enough
        share, and the GPUs that stop fitting."""
        vv = v[:, None]
        milli = self.milli[None, :]
        left = vv - m
        before_c = np.where((vv > 0) & (vv < milli), vv, 0)
        after_c = np.where((left > 0) & (left < milli), left, 0)
        dfits = np.where(left >= milli, left, 0) - np.where(vv >= milli, vv, 0)
        lost = (vv >= milli) & (left < milli)
        return ((k * (after_c - before_c)).astype(np.int32), (k * dfits).astype(np.int32),
                (k * lost).astype(np.int32))

    def after(self, rows: I64, v: I64, k: int, m: int, c: int, multi: bool = False, uniform: bool = False,
              mem: int = 0) -> I64:
        """Scaled fragmentation of each candidate node after taking `k` GPUs of free share `v` by `m`
        each (and `c` CPU, `mem` memory), under FGD's measure or (`multi`) the multi-copy one. Integer
        arithmetic. `uniform`: every candidate's share is the same."""
        dfrag, dfits, lost = self._per_candidate(v, k, m, uniform)
        idle = self.idle[rows] - k * m
        if not multi:  # the paper's measure, on the cheapest path
            q3 = self.acc[rows] & (self.spare[rows] >= lost) & (self.cpu_slack[rows] >= c)
            g = np.where(q3, self.fragp[rows] + dfrag, idle[:, None].astype(np.int32))
            return self.w_cpu * idle + (g.astype(np.int64) @ self.w)
        g64 = self._unusable(rows, self.fragp[rows] + dfrag, self.fits[rows] + dfits, self.spare[rows] - lost,
                             self.arrays.cpu[rows] - c, idle, True, self.arrays.mem[rows] - mem)
        return self.w_cpu * idle + g64 @ self.w

    def row(self, r: int) -> tuple[list[bool], list[int], list[int], list[int], list[int], int, int, int]:
        """Row `r` as Python values: acc, spare, fragp, fits, cpu_slack, idle, frag, frag_multi."""
        row = self._rows.get(r)
        if row is None:
            row = self._rows[r] = (self.acc[r].tolist(), self.spare[r].tolist(), self.fragp[r].tolist(),
                                   self.fits[r].tolist(), self.cpu_slack[r].tolist(), int(self.idle[r]),
                                   int(self.frag[r]), int(self.frag_multi[r]))
        return row

    def after_one(self, row: int, v: int, k: int, m: int, c: int, multi: bool = False, mem: int = 0) -> int:
        """`after` for one candidate (node `row`, free share `v`), in plain integers."""
        acc, spare, fragp, fits, slack, idle, _, _ = self.row(row)
        idle -= k * m
        if multi:
            cpu = int(self.arrays.cpu[row]) - c
            mem_left = int(self.arrays.mem[row]) - mem
        g = 0
        left = v - m
        for j, (milli, num, _, w, cpu_at_least_1, shape_mem) in enumerate(self._shapes):
            # _per_share: the change of the too-small share, of the big-enough share, GPUs that stop fitting
            dfrag = k * ((left if 0 < left < milli else 0) - (v if 0 < v < milli else 0))
            lost = k if v >= milli > left else 0
            small = fragp[j] + dfrag
            if not multi:
                g += (small if acc[j] and spare[j] >= lost and slack[j] >= c else idle) * w
                continue
            big = fits[j] + k * ((left if left >= milli else 0) - (v if v >= milli else 0))
            count = spare[j] - lost + num
            copies = min(count // num, cpu // cpu_at_least_1)
            if shape_mem:
                copies = min(copies, mem_left // shape_mem)
            copies = max(copies, 0) if acc[j] else 0
            used = min(copies * num, count)
            spill = big * (count - used) // max(count, 1) if count > 0 else 0
            g += (small + spill) * w
        return self.w_cpu * idle + g

    def rank_shared(self, score: I64, v: I64, milli: int) -> I64:
        """A GPU fraction's candidates (GPUs with v free) ranked by pairing loss first, then by score."""
        if self.pairing is None:
            return score
        return score - LOSS_STEP * self.pairing.loss(milli)[np.minimum(v, FULL)]

    def rank_shared_one(self, score: int, v: int, milli: int) -> int:
        """rank_shared of one candidate (v <= FULL)."""
        if self.pairing is None:
            return score
        return score - LOSS_STEP * self.pairing.loss_list(milli)[v]

    def sigmoid_one(self, delta: int) -> int:
        """sigmoid_score of one integer drop."""
        return bisect.bisect_right(self._thresholds, float(delta))

    def sigmoid_score(self, delta: I64) -> I64:
        """The FGD paper's int(100*sigmoid(dF/1000)), from the scaled integer drop in fragmentation."""
        return np.searchsorted(self.thresholds, delta.astype(np.float64), side="right").astype(np.int64)
