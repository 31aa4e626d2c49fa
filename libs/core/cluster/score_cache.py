"""Scores remembered per request shape, so that a placement re-scores only the nodes that changed.

Under FGD and packing every feasible node is scored for every replica, yet one placement changes one node.
A `ShapeScores` keeps, per node, whether a request of one shape fits there and that node's best candidate
(FGD score, packing's tie-break score, share left on the GPU, GPU column); before each pick it re-scores
the nodes whose array rows or fragmentation rows changed since (both keep a log of the rows they changed),
or all of them, vectorised, when many did. The pick follows `choose`'s keys exactly, reduced per node
first: a node's own best candidate is the only one of its candidates `choose` could ever take, because the
node's contention and place in the salted order are the same for all of them. Tests hold it to `choose`
decision by decision.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from libs.core.cluster.arrays import I64, ClusterArrays
from libs.core.cluster.feasibility import Request, feasible_rows, gpu_fits, memory_need_row, row_has_gpus
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.nodes import FULL
from libs.core.cluster.scoring import Choice, salted_rows, whole_gpus

# Above this share of the nodes changed since the last pick, all nodes are re-scored at once instead.
REBUILD_SHARE = 0.25
# Changed nodes are re-scored in plain Python while their candidates times the typical shapes stay below
# this (numpy's cost per call dominates small sums), vectorised beyond.
PLAIN_WORK = 48
# A shape gets scores kept once it is asked for again within this many asks.
HOT_WITHIN = 256
# Shapes remembered (least recently used dropped first): enough for a workload's common shapes.
SHAPES_KEPT = 256
NONE = -(1 << 62)  # the score of a node where the request does not fit (ranks can be negative)


class ShapeScores:
    def __init__(self, arrays: ClusterArrays, frag: FragModel, req: Request, policy: str, salt: int) -> None:
        self.a, self.frag, self.req, self.salt = arrays, frag, req, salt
        # packing breaks FGD's ties by contention (requests of GPUs), its multi-copy score, then the share
        # left; fgd by the salted order.
        self.multi = policy == "packing" and frag.multi_copy
        n = len(arrays.nodes)
        self.score = np.full(n, NONE, dtype=np.int64)
        self.tie = np.zeros(n, dtype=np.int64)
        self.tie_known = np.zeros(n, dtype=bool)
        self.left = np.zeros(n, dtype=np.int64)
        self.col = np.zeros(n, dtype=np.int64)
        self.salted = salted_rows(n, salt)
        self._models = arrays.model_mask_rows(req.models)
        self._gpu_models = arrays.gpu_mask(req.models)
        self._model_ids = set(arrays.model_ids(req.models))
        self._work_per_candidate = max(len(frag.weights), 1) * (2 if self.multi else 1)
        self._build()

    def current(self, arrays: ClusterArrays, frag: FragModel) -> bool:
        """Can these scores be brought up to date from the logs (same nodes, same fragmentation model)?"""
        return (arrays is self.a and frag is self.frag and arrays.version == self.version
                and arrays.changes.epoch == self._a_epoch and frag.changes.epoch == self._f_epoch)

    def pick(self) -> Choice | None:
        """`choose(a, frag, req, policy, salt)`'s answer, after re-scoring what changed."""
        self._sync()
        score = self.score
        top = int(score.max()) if len(score) else NONE
        if top == NONE:
            return None
        tied = np.flatnonzero(score == top)
        if len(tied) == 1:
            row = int(tied[0])
        elif not self.multi:
            row = int(tied[np.argmin(self.salted[tied])])
        else:
            if self.req.gpus:  # the least contended nodes (a node's contention is fixed with the model)
                contention = self.frag.contention[tied]
                tied = tied[contention == contention.min()]
            unknown = tied[~self.tie_known[tied]]
            if unknown.size:
                self._ties(unknown)
            row = int(tied[np.lexsort((self.salted[tied], self.left[tied], -self.tie[tied]))[0]])
        req = self.req
        if req.shared:
            return Choice(row, (int(self.col[row]),))
        if req.gpus == 0:
            return Choice(row, ())
        return Choice(row, whole_gpus(self.a, row, req))

    # --- keeping up ----------------------------------------------------------------------------------

    def _mark(self) -> None:
        a, frag = self.a, self.frag
        self.version = a.version
        self._a_epoch, self._a_pos = a.changes.epoch, len(a.changes.rows)
        self._f_epoch, self._f_pos = frag.changes.epoch, len(frag.changes.rows)

    def _sync(self) -> None:
        a, frag = self.a, self.frag
        a_rows, f_rows = a.changes.rows, frag.changes.rows
        if len(a_rows) == self._a_pos and len(f_rows) == self._f_pos:
            return
        if a.changes.epoch != self._a_epoch or frag.changes.epoch != self._f_epoch:
            self._build()
            return
        dirty = set(a_rows[self._a_pos:])
        dirty.update(f_rows[self._f_pos:])
        if len(dirty) > REBUILD_SHARE * len(self.score):
            self._build()
            return
        rows: list[int] = []
        cols: list[int] = []
        shares: list[int] = []
        for r in sorted(dirty):
            self.score[r] = NONE
            if self._fits(r):
                for j, v in self._candidates(r):
                    rows.append(r)
                    cols.append(j)
                    shares.append(v)
        if len(rows) * self._work_per_candidate <= PLAIN_WORK:
            for r, j, v in zip(rows, cols, shares, strict=True):
                self._score_plain(r, j, v)
        elif rows:
            self._score(np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64),
                        np.array(shares, dtype=np.int64))
        self._mark()

    def _build(self) -> None:
        """Every node at once, as `choose` scores them."""
        a, req = self.a, self.req
        self.score[:] = NONE
        ok = feasible_rows(a, req, None)
        if req.shared:
            fit = gpu_fits(a, req) & ok[:, None] & self._gpu_models
            rows, cols = np.nonzero(fit)
            v = a.free[rows, cols]
            # GPUs of a node with the same free share are interchangeable: the lowest index of each stands.
            _, first = np.unique(rows * (FULL + 1) + v, return_index=True)
            rows, cols, v = rows[first], cols[first], v[first]
        else:
            rows = np.flatnonzero(ok).astype(np.int64)
            cols = np.zeros_like(rows)
            v = np.full_like(rows, FULL if req.gpus else 0)
        if len(rows):
            self._score(rows, cols, v)
        self._mark()

    def _candidates(self, row: int) -> list[tuple[int, int]]:
        """A node's candidates as `choose` lists them: (GPU column, its free share), for a shared request the
        first GPU of each free share that fits."""
        req = self.req
        if not req.shared:
            return [(0, FULL if req.gpus else 0)]
        firsts: dict[int, int] = {}
        mask = self._gpu_models[row]
        needs = memory_need_row(self.a, req, row)
        gpus = zip(self.a.free_rows[row], self.a.free_mem_rows[row], needs, strict=True)
        for column, (share, mem, need) in enumerate(gpus):
            if share >= req.milli and mem >= need and mask[column] and share not in firsts:
                firsts[share] = column
        return [(column, share) for share, column in firsts.items()]

    def _score(self, rows: I64, cols: I64, shares: I64) -> None:
        """Score candidates (vectorised, as `choose`) and keep each node's best: under fgd by (-score, column);
        under packing by (-score, -tie, share left, column), where the tie-break score (as costly as the score
        itself) is computed now only for nodes with several candidates at their best score, and for the others
        when their score ties for the top at a pick (`choose` too scores ties only)."""
        frag, req = self.frag, self.req
        gpus, milli, cpu = req.gpus, req.milli, req.cpu
        uniform = not req.shared
        score = frag.sigmoid_score(frag.frag[rows] - frag.after(rows, shares, gpus, milli, cpu, uniform=uniform))
        if req.shared:
            score = frag.rank_shared(score, shares, milli)
        left = shares - milli
        tie = np.zeros_like(score)
        known = np.zeros(len(rows), dtype=bool)
        if self.multi and req.shared:  # several candidates per node only when GPUs are shared
            order = np.lexsort((-score, rows))
            ordered = rows[order]
            group = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1
            sorted_score = score[order]
            at_max = sorted_score == sorted_score[np.r_[0, np.flatnonzero(np.diff(group)) + 1]][group]
            several = at_max & (np.bincount(group[at_max], minlength=group[-1] + 1)[group] > 1)
            need = order[several]
            if need.size:
                tie[need] = frag.sigmoid_score(frag.frag_multi[rows[need]] - frag.after(
                    rows[need], shares[need], gpus, milli, cpu, multi=True, mem=req.mem))
                known[need] = True
        order = np.lexsort((cols, left, -tie, -score, rows) if self.multi else (cols, -score, rows))
        ordered = rows[order]
        first = order[np.r_[True, ordered[1:] != ordered[:-1]]]
        best = rows[first]
        self.score[best] = score[first]
        self.tie[best] = tie[first]
        self.tie_known[best] = known[first]
        self.left[best] = left[first]
        self.col[best] = cols[first]

    def _ties(self, rows: I64) -> None:
        """The tie-break score of these nodes' best candidates (left unknown by `_score`)."""
        frag, req = self.frag, self.req
        k, m, c = req.gpus, req.milli, req.cpu
        self.tie[rows] = frag.sigmoid_score(frag.frag_multi[rows] - frag.after(
            rows, self.left[rows] + m, k, m, c, multi=True, uniform=not req.shared, mem=req.mem))
        self.tie_known[rows] = True

    def _score_plain(self, row: int, column: int, share: int) -> None:
        """`_score` for one candidate, in plain integers, kept if it beats the node's best so far."""
        frag, req = self.frag, self.req
        gpus, milli, cpu = req.gpus, req.milli, req.cpu
        figures = frag.row(row)
        score = frag.sigmoid_one(figures[6] - frag.after_one(row, share, gpus, milli, cpu))
        if req.shared:
            score = frag.rank_shared_one(score, share, milli)
        tie = (frag.sigmoid_one(figures[7] - frag.after_one(row, share, gpus, milli, cpu, multi=True, mem=req.mem))
               if self.multi else 0)
        if self.score[row] != NONE:
            key = (-score, -tie, share - milli, column) if self.multi else (-score, 0, 0, column)
            held = int(self.score[row]), int(self.tie[row]), int(self.left[row]), int(self.col[row])
            if key >= ((-held[0], -held[1], held[2], held[3]) if self.multi else (-held[0], 0, 0, held[3])):
                return
        self.score[row], self.tie[row], self.left[row], self.col[row] = score, tie, share - milli, column
        self.tie_known[row] = True

    def _fits(self, row: int) -> bool:
        """feasible_rows for one node (no allowed mask)."""
        arrays, req = self.a, self.req
        if not (arrays.online_rows[row] and self._models[row]):
            return False
        cpu, mem, rdma = arrays.host_rows[row]
        if cpu < req.cpu or mem < req.mem or rdma < req.rdma:
            return False
        if req.gpus == 0:
            return arrays.model_rows[row] >= 0
        if not arrays.mixed:
            return row_has_gpus(arrays, req, row)
        gpus = zip(arrays.free_rows[row], arrays.free_mem_rows[row], memory_need_row(arrays, req, row), strict=True)
        fitting = [column for column, (share, free_mem, need) in enumerate(gpus)
                   if share >= req.milli and free_mem >= need]
        counts: dict[int, int] = {}
        models = arrays.gpu_model[row]
        for column in fitting:
            model = int(models[column])
            if model in self._model_ids:
                counts[model] = counts.get(model, 0) + 1
        return any(n >= req.gpus for n in counts.values())


class ScoreCache:
    """ShapeScores per (request, policy, salt) for one Placer. A shape earns its scores by coming back within
    `HOT_WITHIN` asks (a workload of hundreds of distinct requests keeps only its frequent ones: keeping a
    rare shape up to date costs as much as scoring it afresh); least recently used dropped first."""

    def __init__(self) -> None:
        self._shapes: OrderedDict[tuple[Request, str, int], ShapeScores] = OrderedDict()
        self._asked: dict[tuple[Request, str, int], int] = {}  # shape -> the ask it was last seen at
        self._asks = 0

    def scores(self, arrays: ClusterArrays, frag: FragModel, req: Request, policy: str, salt: int
               ) -> ShapeScores | None:
        """The shape's scores, brought up to date by `pick`; None while the shape is not asked often."""
        key = (req, policy, salt)
        self._asks += 1
        scores = self._shapes.get(key)
        if scores is not None and scores.current(arrays, frag):
            self._shapes.move_to_end(key)
            return scores
        last = self._asked.get(key)
        self._asked[key] = self._asks
        if scores is None and (last is None or self._asks - last > HOT_WITHIN):
            if len(self._asked) > 16 * HOT_WITHIN:
                self._asked = {k: n for k, n in self._asked.items() if self._asks - n <= HOT_WITHIN}
            return None
        scores = self._shapes[key] = ShapeScores(arrays, frag, req, policy, salt)
        if len(self._shapes) > SHAPES_KEPT:
            self._shapes.popitem(last=False)
        return scores

    def clear(self) -> None:
        self._shapes.clear()
        self._asked.clear()
