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
        if base == 'fgd':
            keys.append(-s)
        elif base == 'exact':
            keys.append(-delta)
        elif base.startswith('q'):  # quantised delta: q<step> in units of w_total*1000/step...
            step = int(base[1:]) * frag.w_total
            keys.append(-(delta // step))
        best = int(np.lexsort(tuple(keys))[0])
        return finish(a, req, rows, cols, best)

    return choose
