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
sizes; cf. the Sum-of-Squares family, Csirik et al., J. ACM 2006).

The prices come from a small dense simplex on the dual (a few dozen variables) with cutting planes from an
unbounded-knapsack oracle, in plain floats, then rounded to integers: the same mix gives the same prices
everywhere, so decisions replay byte for byte.
"""

from __future__ import annotations

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


class PairingPrices:
    """Loss tables for one mix of fractions. `loss(m)[v]`: the loss (in thousandths of a GPU) of placing a
    fraction of m milli on a GPU with v milli free (v <= 1000; 0 where it does not fit)."""

    def __init__(self, prices: dict[int, int]) -> None:
        self.prices = dict(sorted(prices.items()))
        self.best = _best_fill(self.prices)  # K(r) for r = 0..1000, in millionths
        self._tables: dict[int, npt.NDArray[np.int64]] = {}
        self._lists: dict[int, list[int]] = {}

    def price(self, milli: int) -> int:
        """A fraction's price; for a size outside the mix, that of the largest size of the mix it covers (a
        bigger request is worth at least as much as any smaller one it could replace)."""
        if milli in self.prices:
            return self.prices[milli]
        return max((p for s, p in self.prices.items() if s <= milli), default=0)

    def loss(self, milli: int) -> npt.NDArray[np.int64]:
        table = self._tables.get(milli)
        if table is None:
            v = np.arange(FULL + 1, dtype=np.int64)
            fits = v >= milli
            raw = self.best - self.price(milli) - self.best[np.where(fits, v - milli, 0)]
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


def pairing_prices(mix: Iterable[tuple[int, int]]) -> PairingPrices | None:
    """Prices for a mix of (fraction in milli, count); None when there is no fraction to pair."""
    counts: dict[int, int] = {}
    for milli, count in mix:
        if 0 < milli < FULL and count > 0:
            counts[milli] = counts.get(milli, 0) + count
    if not counts:
        return None
    return _prices(tuple(sorted(counts.items())))


def fewest_gpus(mix: Iterable[tuple[int, int]]) -> float:
    """The fewest GPUs a mix of (fraction, count) fits in, in the linear relaxation: a lower bound on any
    packing of it (by LP duality, the prices' total)."""
    counts: dict[int, int] = {}
    for milli, count in mix:
        counts[milli] = counts.get(milli, 0) + count
    prices = pairing_prices(counts.items())
    if prices is None:
        return 0.0
    return sum(prices.prices[m] * c for m, c in counts.items() if m in prices.prices) / PRICE_SCALE


@functools.lru_cache(maxsize=16)
def _prices(mix: tuple[tuple[int, int], ...]) -> PairingPrices:
    sizes = [s for s, _ in mix]
    demand = np.array([c for _, c in mix], dtype=np.float64)
    # Start from the fills of one size only (they bound every price), then add the fill the current prices
    # overvalue most until none is worth more than one GPU.
    fills = [[FULL // s if j == i else 0 for j in range(len(sizes))] for i, s in enumerate(sizes)]
    prices = np.zeros(len(sizes))
    for _ in range(_MAX_ROUNDS):
        prices = _max_packing_lp(np.array(fills, dtype=np.float64), demand)
        value, fill = _best_fill_of(sizes, prices.tolist())
        if value <= 1 + _EPS:
            break
        fills.append(fill)
    scaled = {s: round(p * PRICE_SCALE) for s, p in zip(sizes, prices.tolist(), strict=True)}
    return PairingPrices(scaled)


def _max_packing_lp(a: npt.NDArray[np.float64], c: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """max c.x subject to a x <= 1, x >= 0 (a >= 0, bounded): a dense tableau simplex with Bland's rule
    (no cycling), elementwise float operations only, so every machine takes the same pivots."""
    rows, cols = a.shape
    t = np.zeros((rows + 1, cols + rows + 1))
    t[:rows, :cols] = a
    t[:rows, cols:cols + rows] = np.eye(rows)
    t[:rows, -1] = 1.0
    t[rows, :cols] = -c
    basis = list(range(cols, cols + rows))
    for _ in range(10_000):
        entering = next((j for j in range(cols + rows) if t[rows, j] < -_EPS), None)
        if entering is None:
            break
        column = t[:rows, entering]
        best: tuple[float, int] | None = None
        for i in range(rows):
            if column[i] > _EPS:
                ratio = t[i, -1] / column[i]
                tied = best is not None and abs(ratio - best[0]) <= _EPS
                if best is None or ratio < best[0] - _EPS or (tied and basis[i] < basis[best[1]]):
                    best = (ratio, i)
        assert best is not None, "the pairing LP is bounded"
        i = best[1]
        t[i] = t[i] / t[i, entering]
        for k in range(rows + 1):
            if k != i and t[k, entering] != 0.0:
                t[k] = t[k] - t[k, entering] * t[i]
        basis[i] = entering
    x = np.zeros(cols)
    for i, j in enumerate(basis):
        if j < cols:
            x[j] = t[i, -1]
    return x


def _best_fill_of(sizes: list[int], prices: list[float]) -> tuple[float, list[int]]:
    """The most valuable fill of one GPU under `prices` (unbounded knapsack over 0..1000 milli)."""
    value = [0.0] * (FULL + 1)
    take = [-1] * (FULL + 1)
    for r in range(1, FULL + 1):
        value[r], take[r] = value[r - 1], -1
        for i, s in enumerate(sizes):
            if s <= r and value[r - s] + prices[i] > value[r] + _EPS:
                value[r], take[r] = value[r - s] + prices[i], i
    fill = [0] * len(sizes)
    r = FULL
    while r > 0:
        if take[r] < 0:
            r -= 1
        else:
            fill[take[r]] += 1
            r -= sizes[take[r]]
    return value[FULL], fill


def _best_fill(prices: dict[int, int]) -> npt.NDArray[np.int64]:
    """K(r): the most value (integer prices) r milli can take, r = 0..1000."""
    best = [0] * (FULL + 1)
    for s, p in prices.items():  # unbounded knapsack, one size at a time (each may repeat)
        for r in range(s, FULL + 1):
            if best[r - s] + p > best[r]:
                best[r] = best[r - s] + p
    return np.array(best, dtype=np.int64)
