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

from dataclasses import dataclass

import numpy as np

from libs.core.cluster.arrays import I64, ClusterArrays
from libs.core.cluster.feasibility import Mask, Request, feasible_rows, gpu_fits, memory_need_row
from libs.core.cluster.fragmentation import FragModel
from libs.core.cluster.nodes import FULL

POLICIES = ("packing", "fgd", "best-fit", "spread")
DEFAULT_POLICY = "packing"

# Up to this many candidate nodes, FGD and packing score in plain Python, for the same reason.
FEW_CANDIDATES = 16


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


def _salted_list(count: int, salt: int) -> list[int]:
    keys = _SALTED_LISTS.get((count, salt))
    if keys is None:
        if len(_SALTED_LISTS) > 64:
            _SALTED_LISTS.clear()
        keys = _SALTED_LISTS[(count, salt)] = salted_rows(count, salt).tolist()
    return keys


def salted_rows(count: int, salt: int) -> I64:
    """salted_order of every row 0..n-1 (each row's key depends on the row and the salt alone)."""
    keys = _SALTED.get((count, salt))
    if keys is None:
        if len(_SALTED) > 64:
            _SALTED.clear()
        keys = _SALTED[(count, salt)] = salted_order(np.arange(count, dtype=np.int64), salt)
        keys.flags.writeable = False
    return keys


def _best_fit_scores(arrays: ClusterArrays, rows: I64, req: Request) -> I64:
    """The FGD paper's BestFit node score, normalised min-max to 0..100 in integers."""
    idle = np.where(arrays.free[rows] > 0, arrays.free[rows], 0).sum(axis=1)
    d = 128_000 * 8_000
    num = 100 * d - 400_000 * (arrays.cpu[rows] - req.cpu) - 6_400_000 * (idle - req.milli * req.gpus)
    raw = np.where(num >= 0, num // d, -((-num) // d))
    lo, hi = raw.min(), raw.max()
    return np.zeros_like(raw) if hi == lo else (raw - lo) * 100 // (hi - lo)


def choose(arrays: ClusterArrays, frag: FragModel | None, req: Request, policy: str, salt: int,
           allowed: Mask | None = None, feasible: Mask | None = None) -> Choice | None:
    """The best node (and, for a shared request, GPU) for one replica under `policy`; None if none fits.
    `feasible`: feasible_rows(a, req, allowed), when the caller has it already."""
    ok = feasible_rows(arrays, req, allowed) if feasible is None else feasible
    if not ok.any():
        return None
    scoring = frag if policy in ("fgd", "packing") else None  # FGD's model, when the policy scores by it
    if scoring is not None:
        rows_ok = np.flatnonzero(ok)
        if len(rows_ok) <= FEW_CANDIDATES:
            choice = _choose_scored(arrays, scoring, req, policy, salt, rows_ok.tolist())
            if choice is not None:
                return choice
    rows, cols, free = _candidates(arrays, req, ok)
    gpu_left = free - req.milli
    salt_key = salted_rows(len(arrays.nodes), salt)[rows]
    if scoring is not None:
        rows, cols, keys = _scored_keys(scoring, req, policy, rows, cols, free, gpu_left, salt_key)
    else:
        keys = _plain_keys(arrays, req, policy, rows, cols, gpu_left, salt_key)
    best = int(np.lexsort(keys)[0])
    row = int(rows[best])
    if req.shared:
        return Choice(row, (int(cols[best]),))
    if req.gpus == 0:
        return Choice(row, ())
    return Choice(row, whole_gpus(arrays, row, req))


def _candidates(arrays: ClusterArrays, req: Request, ok: Mask) -> tuple[I64, I64, I64]:
    """The candidates of `choose`: (node row, GPU column, the GPU's free share). For a shared request every GPU
    it fits on, GPUs of a node with the same free share counted once (the lowest index: they are
    interchangeable); otherwise every feasible node, with column 0 and a whole share (none for a CPU job)."""
    if req.shared:
        fit = gpu_fits(arrays, req) & ok[:, None] & arrays.gpu_mask(req.models)
        rows, cols = np.nonzero(fit)
        free = arrays.free[rows, cols]
        _, first = np.unique(rows * (FULL + 1) + free, return_index=True)
        return rows[first], cols[first], free[first]
    rows = np.nonzero(ok)[0].astype(np.int64)
    return rows, np.zeros_like(rows), np.full_like(rows, FULL if req.gpus else 0)


# Sort keys, least significant first (np.lexsort): the last key decides, ties fall to the previous.
SortKeys = tuple[I64, ...]


def _scored_keys(frag: FragModel, req: Request, policy: str, rows: I64, cols: I64, free: I64, gpu_left: I64,
                 salt_key: I64) -> tuple[I64, I64, SortKeys]:
    """FGD's or packing's sort keys of the candidates, and the candidates they rank (rows, columns): packing
    with the multi-copy score keeps only the candidates tied on FGD's score."""
    gpus, milli = req.gpus, req.milli
    uniform = not req.shared  # whole GPUs (or none): every candidate's share is the same
    score = frag.sigmoid_score(frag.frag[rows] - frag.after(rows, free, gpus, milli, req.cpu, uniform=uniform))
    if req.shared:
        score = frag.rank_shared(score, free, milli)
    if policy == "fgd" or not frag.multi_copy:
        return rows, cols, (cols, salt_key, -score)
    # FGD's score decides; among its (frequent, integer) ties, for a request of GPUs the least contended node,
    # then the multi-copy score, then the GPU left fullest. Only the tied candidates are scored a second time.
    top = np.nonzero(score == score.max())[0]
    if gpus and len(top) > 1:
        contention = frag.contention[rows[top]]
        top = top[contention == contention.min()]
    rows, cols, free, gpu_left, salt_key = rows[top], cols[top], free[top], gpu_left[top], salt_key[top]
    if len(top) == 1:  # no tie to break
        return rows, cols, (cols,)
    tie = frag.sigmoid_score(frag.frag_multi[rows] - frag.after(rows, free, gpus, milli, req.cpu, multi=True,
                                                                uniform=uniform, mem=req.mem))
    return rows, cols, (cols, salt_key, gpu_left, -tie)


def _plain_keys(arrays: ClusterArrays, req: Request, policy: str, rows: I64, cols: I64, gpu_left: I64,
                salt_key: I64) -> SortKeys:
    """The sort keys of spread, best-fit, and packing before any typical shapes are known."""
    idle_after = arrays.idle[rows] - req.gpus * req.milli
    if policy == "spread":
        return (cols, salt_key, -gpu_left, -(arrays.cpu[rows] - req.cpu), -idle_after)
    if policy == "best-fit":
        return (cols, salt_key, gpu_left, -_best_fit_scores(arrays, rows, req))
    return (cols, salt_key, idle_after, gpu_left)  # packing: the GPU, then the node, left fullest


def _choose_scored(arrays: ClusterArrays, frag: FragModel, req: Request, policy: str, salt: int, rows: list[int]
                   ) -> Choice | None:
    """`choose` under FGD or packing for a few candidate nodes, in plain integers (same keys, same order, same
    answer). None when it cannot tell (a GPU with more than a whole share free): `choose` decides then."""
    k, m = req.gpus, req.milli
    candidates: list[tuple[int, int, int]] = []  # (row, column, free share), ordered as in `choose`
    if req.shared:
        models = arrays.gpu_mask(req.models)
        for r in rows:
            firsts: dict[int, int] = {}
            for j, (v, mem, need, allowed) in enumerate(zip(arrays.free_rows[r], arrays.free_mem[r].tolist(),
                                                            memory_need_row(arrays, req, r), models[r].tolist(),
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
    salted = _salted_list(len(arrays.nodes), salt)
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
    return Choice(row, whole_gpus(arrays, row, req))


def whole_gpus(arrays: ClusterArrays, row: int, req: Request) -> tuple[int, ...]:
    """Idle GPUs of the chosen node: all from one NVLink domain when one has enough (the smallest such
    domain, so big domains stay whole), else the lowest-index idle GPUs."""
    node = arrays.nodes[row]
    allowed = arrays.gpu_mask(req.models)[row]
    idle = [j for j in range(len(node.gpus))
            if arrays.free[row, j] == FULL and arrays.free_mem[row, j] >= req.gpu_mem and allowed[j]]
    if arrays.mixed:  # one model per replica: the allowed model with the most idle GPUs here
        by_model: dict[int, list[int]] = {}
        for j in idle:
            by_model.setdefault(int(arrays.gpu_model[row, j]), []).append(j)
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
