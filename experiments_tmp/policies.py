"""Candidate placement policies with the signature of libs.core.scoring.choose."""
import numpy as np
import libs.core.scoring as sc
from libs.core.scoring import FULL, Choice, feasible_rows, salted_order, _whole_gpus


def candidates(a, req, ok):
    if req.shared:
        fitm = (a.free >= req.milli) & (a.free_mem >= req.gpu_mem) & ok[:, None] & a.gpu_mask(req.models)
        rows, cols = np.nonzero(fitm)
        v = a.free[rows, cols]
        _, first = np.unique(rows * (FULL + 1) + v, return_index=True)
        return rows[first], cols[first], v[first]
    rows = np.nonzero(ok)[0].astype(np.int64)
    return rows, np.zeros_like(rows), np.full_like(rows, FULL if req.gpus else 0)


def finish(a, req, rows, cols, best):
    row = int(rows[best])
    if req.shared:
        return Choice(row, (int(cols[best]),))
    if req.gpus == 0:
        return Choice(row, ())
    return Choice(row, _whole_gpus(a, row, req))


class ShareFrag(sc.FragModel):
    def __init__(self, arrays, typical):
        super().__init__(arrays, typical)
        w = self.w * self.milli * self.num // 100
        tot = int(w.sum()) + self.w_cpu * 10
        self.w_cpu = self.w_cpu * 10
        self.w = w
        self.w_total = tot
        self.thresholds = sc._LOGIT * 1000.0 * self.w_total
        self.rebuild()


def make(variant):
    parts = variant.split('+')
    base = parts[0]
    opts = set(parts[1:])
    import libs.core.fit as fit
    if 'sharew' in opts:
        fit.FragModel = ShareFrag
    global USE_MEM
    usemem = 'mem' in opts or 'own' in opts or 'multi' in opts
    USE_MEM = 'mem' in opts
    if usemem:
        fit.FragModel = MultiFrag if 'multi' in opts else MemFrag

    def choose(a, frag, req, policy, salt, allowed=None):
        ok = feasible_rows(a, req, allowed)
        if not ok.any():
            return None
        rows, cols, v = candidates(a, req, ok)
        k, m = req.gpus, req.milli
        idle_now = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1)
        idle_after = idle_now - k * m
        gpu_left = v - m
        salt_key = salted_order(rows, salt)
        if usemem:
            delta = frag.frag[rows] - frag.after(rows, v, k, m, req.cpu, req.mem)
        else:
            delta = frag.frag[rows] - frag.after(rows, v, k, m, req.cpu)
        s = frag.sigmoid_score(delta)
        keys = [cols, salt_key]
        # secondary keys (later = more significant in lexsort), inserted before the primary score
        if 'gl' in opts:
            keys.append(gpu_left)
        if 'ia' in opts:
            keys.append(idle_after)
        if 'cpuonly_full' in opts and req.gpus == 0:
            keys.append((idle_now > 0).astype(np.int64))
        if 'cpuslack' in opts and req.gpus == 0:
            # take CPU from the node with the most CPU per idle GPU share (keep GPU nodes hostable)
            keys.append(-(a.cpu[rows] - req.cpu - 12 * idle_now))
        if 'cpuslack2' in opts and req.gpus == 0:
            keys.append(-((a.cpu[rows] - req.cpu) * 1000 // np.maximum(idle_now, 1)))
        if 'bal' in opts and req.gpus > 0:
            slack = (a.cpu[rows] - req.cpu) - 11 * idle_after
            keys.append(np.maximum(0, -slack))
        if 'bfs' in opts and req.shared:
            keys.append(-s)
            keys.append(gpu_left)
        if base == 'fgd':
            keys.append(-s)
        elif base == 'exact':
            keys.append(-delta)
        elif base.startswith('q'):  # quantised delta: q<step> in units of w_total*1000/step...
            step = int(base[1:]) * frag.w_total
            keys.append(-(delta // step))
        if 'BF' in opts and req.shared:
            keys.append(gpu_left)
        if 'BF2' in opts and req.shared:  # best fit only among already-used GPUs, else FGD
            keys.append(np.where(v < FULL, gpu_left, FULL))
        if 'noCPUfail' in opts and req.gpus == 0:
            keys.append(-(a.cpu[rows] - req.cpu - 11 * idle_now))
        best = int(np.lexsort(tuple(keys))[0])
        return finish(a, req, rows, cols, best)

    return choose


# ---- memory-aware fragmentation -------------------------------------------------------------------
SHAPE_MEM = {}
USE_MEM = True  # Shape -> typical memory_mib (median over the workload's pods of that shape); set by harness


def load_shape_mem(csv_path, q=0.5):
    import libs.sim.fgd as F
    from libs.core.shapes import Shape
    d = {}
    for p in F.load_pods(csv_path):
        d.setdefault(Shape.of(p.spec), []).append(p.spec.memory_mib)
    SHAPE_MEM.clear()
    for s, v in d.items():
        v.sort()
        SHAPE_MEM[s] = v[min(len(v) - 1, int(q * len(v)))]


class MemFrag:
    """Standalone copy of the original FragModel (commit 07f495f) plus a memory check per typical shape."""

    def __init__(self, arrays, typical):
        gpu_shapes = [(s, c) for s, c in zip(typical.shapes, typical.counts, strict=True) if s.gpu_milli > 0]
        self.smem = np.array([SHAPE_MEM.get(s, 0) if USE_MEM else 0 for s, _ in gpu_shapes], dtype=np.int64)
        self.w_cpu = sum(c for s, c in zip(typical.shapes, typical.counts, strict=True) if s.gpu_milli == 0)
        self.w_total = max(typical.total, 1)
        self.milli = np.array([s.gpu_milli for s, _ in gpu_shapes], dtype=np.int64)
        self.num = np.array([s.gpus for s, _ in gpu_shapes], dtype=np.int64)
        self.cpu = np.array([s.cpu_milli for s, _ in gpu_shapes], dtype=np.int64)
        self.w = np.array([c for _, c in gpu_shapes], dtype=np.int64)
        self.models = [s.models for s, _ in gpu_shapes]
        self.arrays = arrays
        self.thresholds = sc._LOGIT * 1000.0 * self.w_total
        self.rebuild()

    def rebuild(self):
        a = self.arrays
        n, t = len(a.nodes), len(self.w)
        self.acc = np.ones((n, t), dtype=bool)
        for j, models in enumerate(self.models):
            if models:
                self.acc[:, j] = a.model_mask(models)
        self.cnt = np.zeros((n, t), dtype=np.int64)
        self.fragp = np.zeros((n, t), dtype=np.int64)
        self.frag = np.zeros(n, dtype=np.int64)
        self.update(np.arange(n))
        self.version = a.version

    def sigmoid_score(self, delta):
        return np.searchsorted(self.thresholds, delta.astype(np.float64), side="right").astype(np.int64)

    def update(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        a = self.arrays
        free = a.free[rows][:, :, None]
        milli = self.milli[None, None, :]
        self.cnt[rows] = (free >= milli).sum(axis=1)
        self.fragp[rows] = np.where((free > 0) & (free < milli), free, 0).sum(axis=1)
        idle = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1)
        q3 = (self.acc[rows] & (self.cnt[rows] >= self.num) & (a.cpu[rows][:, None] >= self.cpu)
              & (a.mem[rows][:, None] >= self.smem))
        g = np.where(q3, self.fragp[rows], idle[:, None])
        self.frag[rows] = self.w_cpu * idle + g @ self.w

    def after(self, rows, v, k, m, c, mem=0):
        a = self.arrays
        milli = self.milli[None, :]
        vv = v[:, None]
        before_c = np.where((vv > 0) & (vv < milli), vv, 0)
        left = vv - m
        after_c = np.where((left > 0) & (left < milli), left, 0)
        fragp = self.fragp[rows] - k * before_c + k * after_c
        lost = (vv >= milli) & (left < milli)
        cnt = self.cnt[rows] - k * lost.astype(np.int64)
        idle = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1) - k * m
        q3 = (self.acc[rows] & (cnt >= self.num) & ((a.cpu[rows] - c)[:, None] >= self.cpu)
              & ((a.mem[rows] - mem)[:, None] >= self.smem))
        g = np.where(q3, fragp, idle[:, None])
        return self.w_cpu * idle + g @ self.w


class MultiFrag(MemFrag):
    """FGD fragmentation where a typical shape's usable GPUs are limited by how many copies of it the node's
    CPU and memory can host: fitting GPUs beyond h = min(cnt // num, cpu // cpu_j, mem // mem_j) copies
    count as fragment in proportion (integer)."""

    def rebuild(self):
        n, t = len(self.arrays.nodes), len(self.w)
        self.fits = np.zeros((n, t), dtype=np.int64)
        super().rebuild()

    def _g(self, fragp, fits, cnt, cpu, mem, acc):
        cpu_j = np.maximum(self.cpu, 1)[None, :]
        h = np.minimum(cnt // self.num[None, :], cpu[:, None] // cpu_j)
        if USE_MEM:
            h = np.minimum(h, np.where(self.smem > 0, mem[:, None] // np.maximum(self.smem, 1)[None, :], 1 << 40))
        h = np.where(acc, np.maximum(h, 0), 0)
        used = np.minimum(h * self.num[None, :], cnt)
        extra = np.where(cnt > 0, fits * (cnt - used) // np.maximum(cnt, 1), 0)
        return fragp + extra

    def update(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        a = self.arrays
        free = a.free[rows][:, :, None]
        milli = self.milli[None, None, :]
        self.cnt[rows] = (free >= milli).sum(axis=1)
        self.fits[rows] = np.where(free >= milli, free, 0).sum(axis=1)
        self.fragp[rows] = np.where((free > 0) & (free < milli), free, 0).sum(axis=1)
        idle = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1)
        g = self._g(self.fragp[rows], self.fits[rows], self.cnt[rows], a.cpu[rows], a.mem[rows], self.acc[rows])
        self.frag[rows] = self.w_cpu * idle + g @ self.w

    def after(self, rows, v, k, m, c, mem=0):
        a = self.arrays
        milli = self.milli[None, :]
        vv = v[:, None]
        before_c = np.where((vv > 0) & (vv < milli), vv, 0)
        left = vv - m
        after_c = np.where((left > 0) & (left < milli), left, 0)
        fragp = self.fragp[rows] - k * before_c + k * after_c
        fits = self.fits[rows] - k * np.where(vv >= milli, vv, 0) + k * np.where(left >= milli, left, 0)
        lost = (vv >= milli) & (left < milli)
        cnt = self.cnt[rows] - k * lost.astype(np.int64)
        idle = np.where(a.free[rows] > 0, a.free[rows], 0).sum(axis=1) - k * m
        g = self._g(fragp, fits, cnt, a.cpu[rows] - c, a.mem[rows] - mem, self.acc[rows])
        return self.w_cpu * idle + g @ self.w
