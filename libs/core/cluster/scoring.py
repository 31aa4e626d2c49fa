"""Where one replica goes: vectorised node and GPU scoring over ClusterArrays.

Policies (lower-level names are what queues and priority classes select):
- best-fit: the node whose CPU and GPU share left over is smallest (FGD paper's BestFit, min-max
  normalised integer score); inside a node the GPU with the least share left that still fits.
- fgd: fragmentation gradient descent (ATC'23): the node (and GPU) where the cluster's fragmentation,
  measured against the typical request shapes, grows least; the paper's integer sigmoid score.
- spread: the emptiest node (inference replicas, failure domains).
- packing: gpusched's default: a GPU fraction goes where the least pairing value is lost (the dual prices of
  the workload's packing relaxation, libs/core/cluster/pairing.py); otherwise FGD's score decides (measured against
  the typical shapes and also the rare ones that less than half of the cluster's GPUs could host, see
  `packing_shapes`), and its frequent ties
  go, for a request of GPUs, to the node whose GPU model is least contended (over the shapes limited to
  some models: the share of the GPUs they may use that they ask for, summed over the shapes that may use
  the node), so that work free to go anywhere leaves the scarce models to the requests that need them;
  then to the node whose fragmentation grows least under a multi-copy measure (GPUs that fit a shape but
  that the node's free CPU or memory cannot serve, because it can host fewer copies of the shape than it
  has GPUs for, count as fragment too, in proportion), then to the GPU left fullest. Results per pod list
  in docs/benchmarks.md.
Remaining ties go to the first node in a pseudo-random node order given by a salt (a hash of the row and
the salt): deterministic. A constant salt keeps one order for every request, which consolidates load.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contracts import JobSpec
from libs.core.cluster.arrays import FEW_NODES, I64, ChangeLog, ClusterArrays
from libs.core.cluster.pairing import PairingPrices
from libs.core.cluster.shapes import Shape, TypicalShapes

FULL = 1000
POLICIES = ("packing", "fgd", "best-fit", "spread")
DEFAULT_POLICY = "packing"
Mask = npt.NDArray[np.bool_]

# score s (1..99) of the FGD paper's int(100*sigmoid(x)) is reached when x >= logit(s/100).
_LOGIT = np.array([math.log(s / (100 - s)) for s in range(1, 100)])
# Up to this many rows, the fragmentation model is updated in plain Python (numpy's cost per call dominates).
FEW_ROWS = 4
# Up to this many candidate nodes, FGD and packing score in plain Python, for the same reason.
FEW_CANDIDATES = 16
# Contention is kept in integers: parts per CONTENTION_SCALE of a model's GPUs asked for.
CONTENTION_SCALE = 1_000_000
# A rare shape is scarce when the nodes that could host it (empty) hold less than 1/SCARCE_PART of the GPUs.
SCARCE_PART = 2
# packing ranks a GPU fraction's candidates by score - LOSS_STEP x pairing loss: any loss outweighs any
# difference of FGD's score (0..99), which decides among equal losses.
LOSS_STEP = 100


@dataclass(frozen=True, slots=True)
class Request:
    """One replica's request."""

    milli: int  # share of each GPU: 1000 for whole GPUs, 0 for none
    gpus: int
    cpu: int
    mem: int
    gpu_mem: int
    rdma: int
    models: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < FULL

    @classmethod
    def of(cls, spec: JobSpec) -> Request:
        if spec.gpu_milli > 0:
            milli, gpus = spec.gpu_milli, 1
        else:
            milli, gpus = (FULL, spec.gpus) if spec.gpus > 0 else (0, 0)
        return cls(milli=milli, gpus=gpus, cpu=spec.cpu_milli, mem=spec.memory_mib, gpu_mem=spec.gpu_memory_mib,
                   rdma=spec.rdma_nics, models=tuple(spec.gpu_models))


@dataclass(frozen=True, slots=True)
class Choice:
    row: int
    gpus: tuple[int, ...]  # column positions in the node's GPU list


def salted_order(rows: I64, salt: int) -> I64:
    """A pseudo-random but reproducible permutation key per row (splitmix-style, wrapping uint64)."""
    x = (rows.astype(np.uint64) + np.uint64(salt & 0xFFFFFFFF)) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return x.astype(np.int64)


_SALTED: dict[tuple[int, int], I64] = {}


_SALTED_LISTS: dict[tuple[int, int], list[int]] = {}


def _salted_list(n: int, salt: int) -> list[int]:
    keys = _SALTED_LISTS.get((n, salt))
    if keys is None:
        if len(_SALTED_LISTS) > 64:
            _SALTED_LISTS.clear()
        keys = _SALTED_LISTS[(n, salt)] = salted_rows(n, salt).tolist()
    return keys


def salted_rows(n: int, salt: int) -> I64:
    """salted_order of every row 0..n-1 (each row's key depends on the row and the salt alone)."""
    keys = _SALTED.get((n, salt))
    if keys is None:
        if len(_SALTED) > 64:
            _SALTED.clear()
        keys = _SALTED[(n, salt)] = salted_order(np.arange(n, dtype=np.int64), salt)
        keys.flags.writeable = False
    return keys


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


def memory_need(a: ClusterArrays, req: Request) -> I64 | int:
    """The GPU memory a GPU must have free for one of the request's GPUs: what the request declares; for a
    fraction declaring none, its share of that GPU's memory (what the Cluster charges it), GPU by GPU."""
    if req.gpu_mem or not req.shared:
        return req.gpu_mem
    return a.share_memory(req.milli)


def memory_need_row(a: ClusterArrays, req: Request, row: int) -> list[int]:
    """memory_need for the GPUs of one row, as a list (read only: shared)."""
    if req.gpu_mem or not req.shared:
        return a.same_row(req.gpu_mem)
    return a.share_memory_rows(req.milli)[row]


def gpu_fits(a: ClusterArrays, req: Request) -> Mask:
    """Per GPU: is its share and memory free enough for one of the request's GPUs?"""
    return (a.free >= req.milli) & (a.free_mem >= memory_need(a, req))


def feasible_rows(a: ClusterArrays, req: Request, allowed: Mask | None) -> Mask:
    if not a.mixed and len(a.nodes) <= FEW_NODES:
        return _feasible_few(a, req, allowed)
    ok = a.online & a.model_mask(req.models) & (a.cpu >= req.cpu) & (a.mem >= req.mem) & (a.rdma >= req.rdma)
    if allowed is not None:
        ok &= allowed
    if req.gpus == 0:
        return ok & (a.model >= 0)
    fits_gpu = gpu_fits(a, req)
    if not a.mixed:
        return ok & (fits_gpu.sum(axis=1) >= req.gpus)
    # A replica's GPUs are of one model: enough of SOME allowed model on the node.
    enough = np.zeros(len(ok), dtype=bool)
    for model in a.model_ids(req.models):
        enough |= (fits_gpu & (a.gpu_model == model)).sum(axis=1) >= req.gpus
    return ok & enough


def _feasible_few(a: ClusterArrays, req: Request, allowed: Mask | None) -> Mask:
    """feasible_rows for a small cluster of one model per node, row by row."""
    models = a.model_mask_rows(req.models)
    rows = allowed.tolist() if allowed is not None else None
    out = []
    for i, (online, (cpu, mem, rdma)) in enumerate(zip(a.online_rows, a.host_rows, strict=True)):
        ok = (online and models[i] and cpu >= req.cpu and mem >= req.mem and rdma >= req.rdma
              and (rows is None or rows[i]))
        if ok:
            ok = a.model_rows[i] >= 0 if req.gpus == 0 else row_has_gpus(a, req, i)
        out.append(ok)
    return np.array(out, dtype=bool)


def row_has_gpus(a: ClusterArrays, req: Request, row: int) -> bool:
    """Does the row have GPUs enough free for one replica of a request of GPUs (a cluster of one model per
    node, or a row of one model)? From the row's summaries where they answer it."""
    milli, gpu_mem, gpus = req.milli, req.gpu_mem, req.gpus
    if gpu_mem == 0 and req.shared:  # a GPU with the share and its share of memory free
        return a.fraction_room[row] >= milli
    if gpu_mem == 0:  # whole GPUs with share enough (and memory not overdrawn), from the sorted shares
        shares = a.share_rows[row]
        return len(shares) - bisect.bisect_left(shares, milli) >= gpus
    count = 0
    for free, free_mem in zip(a.free_rows[row], a.free_mem_rows[row], strict=True):
        if free >= milli and free_mem >= gpu_mem:
            count += 1
    return count >= gpus


def _best_fit_scores(a: ClusterArrays, rows: I64, req: Request) -> I64:
    """The FGD paper's BestFit node score, normalised min-max to 0..100 in integers."""
    idle = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1)
    d = 128_000 * 8_000
    num = 100 * d - 400_000 * (a.cpu[rows] - req.cpu) - 6_400_000 * (idle - req.milli * req.gpus)
    raw = np.where(num >= 0, num // d, -((-num) // d))
    lo, hi = raw.min(), raw.max()
    return np.zeros_like(raw) if hi == lo else (raw - lo) * 100 // (hi - lo)


def choose(a: ClusterArrays, frag: FragModel | None, req: Request, policy: str, salt: int,
           allowed: Mask | None = None, feasible: Mask | None = None) -> Choice | None:
    """The best node (and, for a shared request, GPU) for one replica under `policy`; None if none fits.
    `feasible`: feasible_rows(a, req, allowed), when the caller has it already."""
    ok = feasible_rows(a, req, allowed) if feasible is None else feasible
    if not ok.any():
        return None
    if policy in ("fgd", "packing") and frag is not None:
        rows_ok = np.flatnonzero(ok)
        if len(rows_ok) <= FEW_CANDIDATES:
            choice = _choose_scored(a, frag, req, policy, salt, rows_ok.tolist())
            if choice is not None:
                return choice
    if req.shared:
        fit = gpu_fits(a, req) & ok[:, None] & a.gpu_mask(req.models)
        rows, cols = np.nonzero(fit)
        v = a.free[rows, cols]
        # GPUs of a node with the same free share are interchangeable: keep the lowest index of each.
        _, first = np.unique(rows * (FULL + 1) + v, return_index=True)
        rows, cols, v = rows[first], cols[first], v[first]
    else:
        rows = np.nonzero(ok)[0].astype(np.int64)
        cols = np.zeros_like(rows)
        v = np.full_like(rows, FULL if req.gpus else 0)
    k, m = req.gpus, req.milli
    idle_after = a.idle[rows] - k * m
    gpu_left = v - m
    salt_key = salted_rows(len(a.nodes), salt)[rows]
    uniform = not req.shared  # whole GPUs (or none): every candidate's share is the same
    # Sort keys, least significant first (np.lexsort): the last key decides, ties fall to the previous.
    keys: tuple[npt.NDArray[np.int64], ...]
    if policy in ("fgd", "packing") and frag is not None:
        score = frag.sigmoid_score(frag.frag[rows] - frag.after(rows, v, k, m, req.cpu, uniform=uniform))
        if req.shared:
            score = frag.rank_shared(score, v, m)
        if policy == "fgd" or not frag.multi_copy:
            keys = (cols, salt_key, -score)
        else:
            # FGD's score decides; among its (frequent, integer) ties, for a request of GPUs the least
            # contended node, then the multi-copy score, then the GPU left fullest. Only the tied candidates
            # are scored a second time.
            top = np.nonzero(score == score.max())[0]
            if req.gpus and len(top) > 1:
                contention = frag.contention[rows[top]]
                top = top[contention == contention.min()]
            rows, cols, v, gpu_left, salt_key = rows[top], cols[top], v[top], gpu_left[top], salt_key[top]
            if len(top) == 1:  # no tie to break
                keys = (cols,)
            else:
                tie = frag.sigmoid_score(frag.frag_multi[rows] - frag.after(rows, v, k, m, req.cpu, multi=True,
                                                                            uniform=uniform, mem=req.mem))
                keys = (cols, salt_key, gpu_left, -tie)
    elif policy == "spread":
        keys = (cols, salt_key, -gpu_left, -(a.cpu[rows] - req.cpu), -idle_after)
    elif policy == "best-fit":
        keys = (cols, salt_key, gpu_left, -_best_fit_scores(a, rows, req))
    else:  # packing before any typical shapes are known: the GPU, then the node, left fullest
        keys = (cols, salt_key, idle_after, gpu_left)
    best = int(np.lexsort(keys)[0])
    row = int(rows[best])
    if req.shared:
        return Choice(row, (int(cols[best]),))
    if req.gpus == 0:
        return Choice(row, ())
    return Choice(row, whole_gpus(a, row, req))


def _choose_scored(a: ClusterArrays, frag: FragModel, req: Request, policy: str, salt: int, rows: list[int]
                   ) -> Choice | None:
    """`choose` under FGD or packing for a few candidate nodes, in plain integers (same keys, same order, same
    answer). None when it cannot tell (a GPU with more than a whole share free): `choose` decides then."""
    k, m = req.gpus, req.milli
    candidates: list[tuple[int, int, int]] = []  # (row, column, free share), ordered as in `choose`
    if req.shared:
        models = a.gpu_mask(req.models)
        for r in rows:
            firsts: dict[int, int] = {}
            for j, (v, mem, need, allowed) in enumerate(zip(a.free_rows[r], a.free_mem[r].tolist(),
                                                            memory_need_row(a, req, r), models[r].tolist(),
                                                            strict=True)):
                if v > FULL:
                    return None
                if v >= m and mem >= need and allowed and v not in firsts:
                    firsts[v] = j
            candidates.extend((r, firsts[v], v) for v in sorted(firsts))
    else:
        share = FULL if req.gpus else 0
        candidates = [(r, 0, share) for r in rows]
    if not candidates:
        return None
    salted = _salted_list(len(a.nodes), salt)
    scored = [(frag.sigmoid_one(frag.row(r)[6] - frag.after_one(r, v, k, m, req.cpu)), r, col, v)
              for r, col, v in candidates]
    if req.shared:
        scored = [(frag.rank_shared_one(c[0], c[3], m), *c[1:]) for c in scored]
    if policy == "fgd" or not frag.multi_copy:
        # lexsort keys (cols, salt, -score): the best score, then the salted order, then the column
        best = min(scored, key=lambda c: (-c[0], salted[c[1]], c[2]))
    else:
        top = max(c[0] for c in scored)
        tied = [c for c in scored if c[0] == top]
        if req.gpus and len(tied) > 1:  # the least contended nodes
            contention = frag.contention_rows
            least = min(contention[c[1]] for c in tied)
            tied = [c for c in tied if contention[c[1]] == least]
        if len(tied) == 1:
            best = tied[0]
        else:
            # keys (cols, salt, gpu left, -multi-copy score)
            best = min(tied, key=lambda c: (
                -frag.sigmoid_one(frag.row(c[1])[7]
                                  - frag.after_one(c[1], c[3], k, m, req.cpu, multi=True, mem=req.mem)),
                c[3] - m, salted[c[1]], c[2]))
    row, col = best[1], best[2]
    if req.shared:
        return Choice(row, (col,))
    if req.gpus == 0:
        return Choice(row, ())
    return Choice(row, whole_gpus(a, row, req))


def whole_gpus(a: ClusterArrays, row: int, req: Request) -> tuple[int, ...]:
    """Idle GPUs of the chosen node: all from one NVLink domain when one has enough (the smallest such
    domain, so big domains stay whole), else the lowest-index idle GPUs."""
    node = a.nodes[row]
    allowed = a.gpu_mask(req.models)[row]
    idle = [j for j in range(len(node.gpus))
            if a.free[row, j] == FULL and a.free_mem[row, j] >= req.gpu_mem and allowed[j]]
    if a.mixed:  # one model per replica: the allowed model with the most idle GPUs here
        by_model: dict[int, list[int]] = {}
        for j in idle:
            by_model.setdefault(int(a.gpu_model[row, j]), []).append(j)
        idle = max(by_model.values(), key=lambda cols: (len(cols), -cols[0]))
    groups: dict[int, list[int]] = {}
    for j in idle:
        g = node.gpus[j].nvlink_group
        if g >= 0:
            groups.setdefault(g, []).append(j)
    fitting = sorted((len(cols), g) for g, cols in groups.items() if len(cols) >= req.gpus)
    if req.gpus > 1 and fitting:
        return tuple(groups[fitting[0][1]][: req.gpus])
    return tuple(idle[: req.gpus])
