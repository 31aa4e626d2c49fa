"""Pairing prices: the dual prices of packing a mix of GPU fractions, and packing's use of them to keep each
GPU on a fill an optimal packing would use."""

from __future__ import annotations

import itertools
import random

import pytest

from contracts import GpuSpec, JobSpec, NodeSpec
from libs.core.cluster.job_fit import Placer
from libs.core.cluster.model import Cluster
from libs.core.cluster.pairing import FULL, PRICE_SCALE, fewest_gpus, pairing_prices
from libs.core.cluster.shapes import Shape, typical_from_counts


def fills(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every way to fill one GPU (1000 milli) with these sizes, by brute force."""
    found = []
    bounds = [range(FULL // s + 1) for s in sizes]
    for counts in itertools.product(*bounds):
        if 0 < sum(c * s for c, s in zip(counts, sizes, strict=True)) <= FULL:
            found.append(counts)
    return found


def first_fit_decreasing(items: list[int]) -> int:
    gaps: list[int] = []
    for s in sorted(items, reverse=True):
        for i, g in enumerate(gaps):
            if g >= s:
                gaps[i] -= s
                break
        else:
            gaps.append(FULL - s)
    return len(gaps)


def test_prices_of_a_mix_with_known_optimal_fills() -> None:
    prices = pairing_prices([(810, 100), (470, 300), (650, 80), (320, 90)])
    assert prices is not None
    third = PRICE_SCALE // 3
    assert prices.prices == {320: third, 470: PRICE_SCALE // 2, 650: PRICE_SCALE - third, 810: PRICE_SCALE}
    # Staying on an optimal fill loses nothing; leaving space no fraction of the mix can fill to full value
    # loses for good (in thousandths of a GPU).
    assert prices.loss(470)[FULL] == 0 and prices.loss(470)[530] == 0  # two 470s
    assert prices.loss(320)[350] == 0  # 650 + 320
    assert prices.loss(320)[530] == 167  # 470 + 320: the 210 left is worth nothing
    assert prices.loss(650)[680] == 0 and prices.loss(810)[FULL] == 0
    assert prices.loss(470)[400] == 0  # does not fit: no loss, and never a candidate


def test_no_fraction_no_prices_and_the_mix_order_does_not_matter() -> None:
    assert pairing_prices([(1000, 5), (0, 3)]) is None
    a = pairing_prices([(300, 4), (500, 7), (300, 2)])
    b = pairing_prices([(500, 7), (300, 6)])
    assert a is not None and b is not None and a.prices == b.prices
    assert (a.best == b.best).all()


def test_a_size_outside_the_mix_is_priced_as_the_largest_it_covers() -> None:
    prices = pairing_prices([(250, 10), (500, 10)])
    assert prices is not None
    assert prices.price(300) == prices.price(250)
    assert prices.price(600) == prices.price(500)
    assert prices.price(100) == 0
    assert (prices.loss(300) >= 0).all()


@pytest.mark.parametrize("seed", range(25))
def test_prices_are_an_optimal_dual_of_the_packing_relaxation(seed: int) -> None:
    """No GPU fill is worth more than one GPU (the prices are a feasible dual), and the prices' total lies
    between the mix's volume and a real packing's GPU count (LP optimum <= integer optimum <= FFD)."""
    rng = random.Random(seed)
    sizes = sorted(rng.sample([110, 160, 220, 250, 300, 350, 470, 500, 650, 810], rng.randint(1, 4)))
    counts = [rng.randint(1, 40) for _ in sizes]
    prices = pairing_prices(list(zip(sizes, counts, strict=True)))
    assert prices is not None
    for fill in fills(sizes):
        # (each price is rounded to a millionth: a fill of n fractions may gain up to n millionths)
        assert sum(c * prices.prices[s] for c, s in zip(fill, sizes, strict=True)) <= PRICE_SCALE + sum(fill)
    assert prices.best[FULL] <= PRICE_SCALE + FULL // min(sizes)
    assert (prices.best[1:] >= prices.best[:-1]).all()  # more room never holds less
    items = [s for s, c in zip(sizes, counts, strict=True) for _ in range(c)]
    dual_total = sum(c * prices.prices[s] for s, c in zip(sizes, counts, strict=True)) / PRICE_SCALE
    slack = len(items) / PRICE_SCALE  # rounding, as above
    assert sum(items) / FULL - slack <= dual_total <= first_fit_decreasing(items) + slack
    for s in sizes:
        assert (prices.loss(s) >= 0).all()


def node_cluster(nodes: int, gpus: int = 8) -> Cluster:
    cluster = Cluster()
    for n in range(nodes):
        cluster.register(NodeSpec(name=f"n{n:02d}", cpu_milli=256000, memory_mib=1 << 20,
                                  gpus=tuple(GpuSpec(index=i, model="A100", memory_mib=80000) for i in range(gpus))))
    return cluster


MIX = {810: 30, 470: 40, 650: 15, 320: 20}


def typical_of(mix: dict[int, int]) -> object:
    return typical_from_counts({Shape(cpu_milli=1000, gpu_milli=m, gpus=1): c for m, c in mix.items()}, coverage=1.0)


def fraction(milli: int) -> JobSpec:
    return JobSpec(team="t", queue="q", gpus=1, gpu_milli=milli, cpu_milli=1000)


def test_packing_keeps_a_gpu_on_an_optimal_fill() -> None:
    """A 320 goes to a fresh GPU rather than onto a 470's 530 free (which would leave 210 nothing fills);
    the next 650 joins the 320, and a 470 joins the 470."""
    placer = Placer(node_cluster(1), typical_of(MIX))  # type: ignore[arg-type]
    first = placer.place_replica(fraction(470), 0, "packing")
    second = placer.place_replica(fraction(320), 0, "packing")
    third = placer.place_replica(fraction(650), 0, "packing")
    fourth = placer.place_replica(fraction(470), 0, "packing")
    assert first and second and third and fourth
    assert second.gpu_indices != first.gpu_indices
    assert third.gpu_indices == second.gpu_indices
    assert fourth.gpu_indices == first.gpu_indices


def gpus_used(policy: str, seed: int) -> int:
    rng = random.Random(seed)
    items = [m for m, c in MIX.items() for _ in range(c)]
    rng.shuffle(items)
    cluster = node_cluster(16)
    placer = Placer(cluster, typical_of(MIX))  # type: ignore[arg-type]
    for m in items:
        assert placer.place_replica(fraction(m), 0, policy, salt=seed) is not None
    return sum(1 for node in cluster.sorted_nodes() for g in node.gpus if g.free_milli < FULL)


def test_packing_pairs_fractions_onto_fewer_gpus_than_fgd_and_best_fit() -> None:
    """The same random arrivals of a mix whose optimal fills are 810 alone, 470+470 and 650+320: packing ends
    on fewer GPUs than FGD or best-fit, summed over seeds (and never below the packing's lower bound)."""
    used = {p: [gpus_used(p, seed) for seed in range(8)] for p in ("packing", "fgd", "best-fit")}
    assert sum(used["packing"]) < sum(used["fgd"])
    assert sum(used["packing"]) < sum(used["best-fit"])
    bound = 30 + 20 + 15 + 2  # 810s alone, 470 pairs, 650+320, three 320s per GPU for the 5 left
    assert all(u >= bound for u in used["packing"]), used


def test_a_mix_of_many_odd_fractions_is_priced_on_its_frequent_ones_rounded_up() -> None:
    rng = random.Random(5)
    mix = [(m, rng.randint(1, 50)) for m in range(7, 1000, 9)]  # 111 distinct fractions
    prices = pairing_prices(mix, max_sizes=16)
    assert prices is not None and len(prices.prices) == 16
    assert max(prices.prices) == max(m for m, _ in mix)  # the largest is always kept: every fraction has a home
    for m, _ in mix:
        assert (prices.loss(m) >= 0).all()
    assert prices.best[FULL] <= PRICE_SCALE + FULL // min(prices.prices)
    # The floor keeps every fraction apart: rounding up could only raise it.
    assert fewest_gpus(mix[:12]) <= fewest_gpus([(m + 1, c) for m, c in mix[:12]]) + 1e-6


def test_a_merged_fraction_carries_the_price_of_the_fraction_it_joined() -> None:
    mix = [(300, 50), (310, 1), (500, 40), (700, 30)]
    prices = pairing_prices(mix, max_sizes=3)
    assert prices is not None and set(prices.prices) == {300, 500, 700}
    assert prices.merged == {310: 500}  # the rarest, rounded up to the next kept fraction
    assert prices.price(310) == prices.price(500)
    assert (prices.loss(310) >= 0).all()
