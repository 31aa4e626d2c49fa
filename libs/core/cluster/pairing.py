"""Pairing prices: which GPU fractions should share a GPU.

Requests for a fraction of a GPU are a bin-packing workload: each GPU is a bin of 1000 milli. The linear
relaxation of packing the workload's mix of fractions (Gilmore-Gomory cutting stock: cover each fraction's
count with the fewest GPUs) has dual prices pi(s): the part of a GPU that a fraction of s milli is worth in
an optimal packing. No GPU fill is worth more than one GPU, and the fills an optimal packing uses are worth
exactly one. With K(r) the most value r free milli can still take, placing s on a GPU with v free loses

    loss(v, s) = K(v) - pi(s) - K(v - s)  >= 0

of value for good: nothing when the GPU stays on an optimal fill (an 810 alone, two 470s, 650 + 320),
something when the space left can no longer be filled to full value (a 320 on the 530 left by a 470).
Packing puts a fraction where the loss is least, and lets FGD's score decide among equal losses: online,
the GPUs then end up in the fills the optimum would use (dual-guided online bin packing for a known mix of
sizes; cf. the Sum-of-Squares family, Csirik et al., J. ACM 2006). Fractions are priced by share alone:
GPU models and GPU memory decide where a fraction may go (the fit), not what it is worth.

The prices come from a dense simplex tableau on the dual (one variable per fraction), cut by the fill an
unbounded-knapsack oracle finds most overvalued and mended by dual simplex pivots, in elementwise floats
rounded to integers: the same mix gives the same prices everywhere, so decisions replay byte for byte.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

FULL = 1000
# Prices are kept in millionths of a GPU; losses in thousandths (finer differences are rounding noise).
PRICE_SCALE = 1_000_000
LOSS_UNIT = 1_000
_EPS = 1e-9
_MAX_ROUNDS = 500
# Distinct fractions priced apart (a solve of 64 takes ~0.15 s on a slow core; 20 take ~0.015 s).
MAX_SIZES = 64


class PairingPrices:
    """Loss tables for one mix of fractions. `loss(m)[v]`: the loss (in thousandths of a GPU) of placing a
    fraction of m milli on a GPU with v milli free (v <= 1000; 0 where it does not fit)."""

    def __init__(self, prices: dict[int, int], merged: dict[int, int] | None = None) -> None:
        self.prices = dict(sorted(prices.items()))
        self.merged = merged or {}  # a fraction priced as a larger one (see `pairing_prices`)
        self.best = _best_fill(tuple(self.prices.items()))  # K(r) for r = 0..1000, in millionths
        self._tables: dict[int, npt.NDArray[np.int64]] = {}
        self._lists: dict[int, list[int]] = {}

    def price(self, milli: int) -> int:
        """A fraction's price; for one merged into a larger fraction of the mix, that fraction's; for a size
        outside the mix, that of the largest size of the mix it covers (a bigger request is worth at least as
        much as any smaller one it could replace)."""
        if milli in self.prices:
            return self.prices[milli]
        if milli in self.merged:
            return self.prices[self.merged[milli]]
        return max((p for s, p in self.prices.items() if s <= milli), default=0)

    def loss(self, milli: int) -> npt.NDArray[np.int64]:
        table = self._tables.get(milli)
        if table is None:
            v = np.arange(FULL + 1, dtype=np.int64)
            fits = v >= milli
            # (never below 0: a merged fraction carries a larger one's price but leaves more room)
            raw = np.maximum(self.best - self.price(milli) - self.best[np.where(fits, v - milli, 0)], 0)
            table = np.where(fits, (raw + LOSS_UNIT // 2) // LOSS_UNIT, 0).astype(np.int64)
            table.flags.writeable = False
            if len(self._tables) > 256:
                self._tables.clear()
                self._lists.clear()
            self._tables[milli] = table
        return table

    def loss_list(self, milli: int) -> list[int]:
        """`loss(milli)` as a Python list (for scoring a few candidates without numpy)."""
        rows = self._lists.get(milli)
        if rows is None:
            rows = self._lists[milli] = self.loss(milli).tolist()
        return rows


def pairing_prices(mix: Iterable[tuple[int, int]], max_sizes: int | None = MAX_SIZES) -> PairingPrices | None:
    """Prices for a mix of (fraction in milli, count); None when there is no fraction to pair. Beyond
    `max_sizes` distinct fractions, the rarer ones are priced as the next larger kept one (rounding a request
    up keeps every fill real), so that a workload of many odd fractions costs a bounded solve."""
    counts = _fractions(mix)
    if not counts:
        return None
    merged: dict[int, int] = {}
    if max_sizes is not None and len(counts) > max_sizes:
        counts, merged = _merge_rare(counts, max_sizes)
    return PairingPrices(dict(_prices(tuple(sorted(counts.items())))), merged)


def fewest_gpus(mix: Iterable[tuple[int, int]]) -> float:
    """The fewest GPUs a mix of (fraction, count) fits in, in the linear relaxation: a lower bound on any
    packing of it (by LP duality, the prices' total; every fraction kept apart, however many)."""
    counts = _fractions(mix)
    if not counts:
        return 0.0
    prices = dict(_prices(tuple(sorted(counts.items()))))
    return sum(prices[m] * c for m, c in counts.items()) / PRICE_SCALE


def _fractions(mix: Iterable[tuple[int, int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for milli, count in mix:
        if 0 < milli < FULL and count > 0:
            counts[milli] = counts.get(milli, 0) + count
    return counts


def _merge_rare(counts: dict[int, int], max_sizes: int) -> tuple[dict[int, int], dict[int, int]]:
    """The `max_sizes` - 1 most frequent fractions and the largest; every other one added to the smallest
    kept fraction at least as large. Also: which fraction each merged one went to."""
    largest = max(counts)
    frequent = sorted((m for m in counts if m != largest), key=lambda m: (-counts[m], -m))[: max_sizes - 1]
    kept = sorted([*frequent, largest])
    total = dict.fromkeys(kept, 0)
    into: dict[int, int] = {}
    for m, c in counts.items():
        k = kept[bisect.bisect_left(kept, m)]
        total[k] += c
        if k != m:
            into[m] = k
    return total, into


@functools.lru_cache(maxsize=16)
def _prices(mix: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    sizes = [s for s, _ in mix]
    # Start from the fills of one size only (they bound every price), then add the fill the current prices
    # overvalue most, until none is worth more than one GPU.
    lp = _PackingDual([float(c) for _, c in mix], [[FULL // s if j == i else 0 for j in range(len(sizes))]
                                                   for i, s in enumerate(sizes)])
    for _ in range(_MAX_ROUNDS):
        value, fill = _best_fill_of(sizes, lp.solution())
        if value <= 1 + _EPS:
            break
        lp.add_fill(fill)
    return tuple((s, round(p * PRICE_SCALE)) for s, p in zip(sizes, lp.solution().tolist(), strict=True))


class _PackingDual:
    """max d.x subject to f.x <= 1 for every fill f added so far, x >= 0: a dense simplex tableau kept
    optimal as fills are added (a cut makes it primal infeasible; dual simplex pivots mend it). Pivot rules
    are deterministic (lowest index on ties) and every operation is elementwise in floats, so every machine
    takes the same pivots and gets the same prices."""

    def __init__(self, demand: list[float], fills: list[list[int]]) -> None:
        self.n = len(demand)
        self.width = self.n + len(fills) + _MAX_ROUNDS + 1  # structural, one slack per fill, right-hand side
        self.t = np.zeros((0, self.width))
        self.z = np.zeros(self.width)  # the objective row: optimal when no entry is negative
        self.z[: self.n] = -np.array(demand)
        self.basis: list[int] = []
        for fill in fills:
            self._append_row(fill)
        self._primal()

    def solution(self) -> npt.NDArray[np.float64]:
        x = np.zeros(self.n)
        for i, j in enumerate(self.basis):
            if j < self.n:
                x[j] = self.t[i, -1]
        return x

    def add_fill(self, fill: list[int]) -> None:
        self._append_row(fill)
        self._dual()
        self._primal()  # only if rounding left a negative reduced cost

    def _append_row(self, fill: list[int]) -> None:
        slack = self.n + len(self.basis)
        row = np.zeros(self.width)
        row[: self.n] = fill
        row[slack] = 1.0
        row[-1] = 1.0
        for i, j in enumerate(self.basis):  # in terms of the current basis
            if row[j] != 0.0:
                row = row - row[j] * self.t[i]
        self.t = np.vstack([self.t, row])
        self.basis.append(slack)

    def _pivot(self, pivot_row: int, pivot_column: int) -> None:
        table = self.t
        table[pivot_row] = table[pivot_row] / table[pivot_row, pivot_column]
        column = table[:, pivot_column].copy()
        column[pivot_row] = 0.0
        table -= column[:, None] * table[pivot_row][None, :]
        self.z = self.z - self.z[pivot_column] * table[pivot_row]
        self.basis[pivot_row] = pivot_column

    def _primal(self) -> None:
        columns = self.n + len(self.basis)
        for _ in range(100_000):
            entering = next((j for j in range(columns) if self.z[j] < -_EPS), None)
            if entering is None:
                return
            col, rhs = self.t[:, entering], self.t[:, -1]
            best: tuple[float, int] | None = None
            for i in np.flatnonzero(col > _EPS).tolist():
                ratio = rhs[i] / col[i]
                if best is None or ratio < best[0] - _EPS or (abs(ratio - best[0]) <= _EPS
                                                              and self.basis[i] < self.basis[best[1]]):
                    best = (ratio, i)
            assert best is not None, "the pairing LP is bounded"
            self._pivot(best[1], entering)

    def _dual(self) -> None:
        columns = self.n + len(self.basis)
        for _ in range(100_000):
            negative = np.flatnonzero(self.t[:, -1] < -_EPS)
            if not negative.size:
                return
            i = int(negative[0])
            row = self.t[i, :columns]
            best: tuple[float, int] | None = None
            for j in np.flatnonzero(row < -_EPS).tolist():
                ratio = self.z[j] / -row[j]
                if best is None or ratio < best[0] - _EPS:
                    best = (ratio, j)
            assert best is not None, "the pairing LP is feasible (x = 0)"
            self._pivot(i, best[1])


def _best_fill_of(sizes: list[int], prices: npt.NDArray[np.float64]) -> tuple[float, list[int]]:
    """The most valuable fill of one GPU under `prices`: an unbounded knapsack over 0..1000 milli, each size
    split into 1, 2, 4, ... copies so that every step is one elementwise pass over the capacities."""
    value = np.zeros(FULL + 1)
    steps: list[tuple[int, int, npt.NDArray[np.bool_]]] = []
    for i, (s, p) in enumerate(zip(sizes, prices.tolist(), strict=True)):
        left, copies = FULL // s, 1
        while left > 0:
            k = min(copies, left)
            w, v = k * s, k * p
            shifted = value[: FULL + 1 - w] + v
            take = np.zeros(FULL + 1, dtype=bool)
            take[w:] = shifted > value[w:] + _EPS
            value = np.where(take, np.concatenate([np.zeros(w), shifted]), value)
            steps.append((i, k, take))
            left -= k
            copies *= 2
    fill = [0] * len(sizes)
    r = FULL
    for i, k, take in reversed(steps):
        if take[r]:
            fill[i] += k
            r -= k * sizes[i]
    return float(value[FULL]), fill


@functools.lru_cache(maxsize=16)
def _best_fill(prices: tuple[tuple[int, int], ...]) -> npt.NDArray[np.int64]:
    """K(r): the most value (integer prices) r milli can take, r = 0..1000."""
    best = [0] * (FULL + 1)
    for s, p in prices:  # unbounded knapsack, one size at a time (each may repeat)
        for r in range(s, FULL + 1):
            if best[r - s] + p > best[r]:
                best[r] = best[r - s] + p
    table = np.array(best, dtype=np.int64)
    table.flags.writeable = False  # shared by every PairingPrices of these prices
    return table
