"""The verdict's fit at a bounded cost: the knot search and the Mann-Kendall count give what the
direct ways give (every pair of knots solved by least squares, every pair of readings compared)
without forming what those ways form. Memory is read by ``tracemalloc``, which numpy reports
its arrays to: a deterministic measure of what a statistic builds, unlike its time."""

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness._core.stats import (
    PIECES,
    SHORTEST,
    broken_line,
    mann_kendall,
    per_batch,
    reduce,
    trend,
    trend_test,
)


def peak(call: Callable[[], object]) -> int:
    """The most bytes ``call`` held at once beyond what was held before it."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def pairwise_s(y: np.ndarray) -> int:
    """Mann-Kendall's S the direct way: the sign of every later value less an earlier one."""
    signs = np.sign(y[None, :] - y[:, None])
    return int(np.triu(signs, 1).sum())


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 1200).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(1, 2 * n + 2), st.integers(0, 2**32 - 1))
    )
)
def test_mann_kendall_counts_every_pair_without_forming_them(drawn):
    n, levels, seed = drawn  # few levels: many ties; lengths across the count's blocks of 64
    y = np.random.default_rng(seed).integers(0, levels, n).astype(np.float64)
    s, z, p = mann_kendall(y)
    assert s == pairwise_s(y)
    assert (z > 0) == (s > 1) and 0 <= p <= 1


def test_mann_kendall_of_a_long_series_holds_a_small_part_of_its_pairs():
    y = np.random.default_rng(0).integers(0, 50, 5000).astype(np.float64)
    pairs_bytes = 5000 * 4999 // 2 * 8  # one float per pair: 100 MB
    assert peak(lambda: mann_kendall(y)) < pairs_bytes / 10
    s, _, _ = mann_kendall(y[:1500])
    assert s == pairwise_s(y[:1500])


def least_squares_cost(u: np.ndarray, v: np.ndarray, lo: int, hi: int) -> float:
    """The residual sum of squares of the continuous line bending at blocks ``lo`` and ``hi``."""
    design = np.stack(
        [np.ones_like(u), u, np.maximum(u - u[lo], 0), np.maximum(u - u[hi], 0)], axis=1
    )
    beta = np.linalg.lstsq(design, v, rcond=None)[0]
    return float(((design @ beta - v) ** 2).sum())


@settings(max_examples=40, deadline=None)
@given(
    st.integers(3 * SHORTEST + 1, 3000),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["noise", "onset", "plateau", "steps", "saw"]),
)
def test_the_knots_are_the_least_squares_pair(n, seed, shape):
    rng = np.random.default_rng(seed)
    b = np.arange(n, dtype=np.float64)
    at = rng.integers(0, n)
    clean = {
        "noise": np.zeros(n),
        "onset": np.maximum(b - at, 0) * 50.0,
        "plateau": np.minimum(b, at) * 50.0,
        "steps": (b >= at) * 3000.0 + (b >= at // 2) * 2000.0,
        "saw": (b % max(at // 3, 2)) * 40.0,
    }[shape]
    x, y = per_batch(b, clean + rng.normal(0, 100, n))
    line = broken_line(x, y)
    bx, by = reduce(x, y, max_points=PIECES)
    u = (bx - bx[0]) / (bx[-1] - bx[0])
    v = (by - np.median(by)) / (np.abs(by - np.median(by)).max() or 1.0)
    k = len(bx)
    costs = {
        (lo, hi): least_squares_cost(u, v, lo, hi)
        for lo in range(SHORTEST, k - 2 * SHORTEST)
        for hi in range(lo + SHORTEST, k - SHORTEST)
    }
    chosen = (int(np.searchsorted(bx, line.x[1])), int(np.searchsorted(bx, line.x[2])))
    assert costs[chosen] <= min(costs.values()) + 1e-9 * float((v**2).sum())


def test_the_knot_search_holds_no_system_per_pair_of_knots():
    x, y = per_batch(np.arange(176), np.random.default_rng(0).normal(0, 1, 176))
    pairs = 1378  # the pairs of knots 64 blocks give
    assert peak(lambda: broken_line(x, y)) < pairs * 4 * 4 * 8  # one 4 x 4 system each


@pytest.mark.parametrize("spans", [None, 7, 40])
def test_trend_test_is_the_test_of_trend(spans):
    rng = np.random.default_rng(spans or 0)
    x = np.unique(rng.integers(0, 3000, 200))
    y = np.round(rng.normal(0, 4000, len(x)) + 3 * x)
    t = trend(x, y, spans=spans)
    assert trend_test(x, y, spans=spans) == (t.s, t.z, t.p)
