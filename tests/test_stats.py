import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness._core.stats import (
    broken_line,
    mann_kendall,
    per_batch,
    reduce,
    settled,
    theil_sen,
    trend,
)
from harness._rules.fit import Fit


def test_theil_sen_recovers_a_line_exactly():
    x = np.arange(50)
    slope, intercept = theil_sen(x, 3.5 * x + 100)
    assert slope == pytest.approx(3.5)
    assert intercept == pytest.approx(100)


def test_theil_sen_ignores_a_quarter_of_wild_points():
    rng = np.random.default_rng(0)
    x = np.arange(200)
    y = 10.0 * x
    wild = rng.choice(200, size=50, replace=False)
    y[wild] += rng.uniform(-1e9, 1e9, size=50)
    assert theil_sen(x, y)[0] == pytest.approx(10.0, rel=0.05)


def test_theil_sen_skips_pairs_with_equal_x():
    assert theil_sen([1, 1, 2, 2], [0, 100, 10, 110])[0] == pytest.approx(10.0)
    assert theil_sen([3, 3], [1, 5]) == (0.0, 3.0)


def test_mann_kendall_matches_the_textbook_formula():
    s, z, p = mann_kendall([1, 2, 3, 4, 5])
    var = 5 * 4 * 15 / 18
    assert s == 10
    assert z == pytest.approx(9 / math.sqrt(var))
    assert p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert p < 0.02


def test_mann_kendall_corrects_for_ties_and_direction():
    s, z, _ = mann_kendall([1, 1, 2, 2, 3])
    var = (5 * 4 * 15 - 2 * (2 * 1 * 9)) / 18
    assert s == 8
    assert z == pytest.approx(7 / math.sqrt(var))
    s, _, p = mann_kendall([5, 4, 3, 2, 1])
    assert s == -10 and p > 0.95
    assert mann_kendall([7, 7, 7, 7]) == (0, 0.0, 0.5)
    assert mann_kendall([1]) == (0, 0.0, 0.5)


def test_long_series_are_reduced_to_block_medians():
    x = np.arange(5000.0)
    y = 2.0 * x
    y[::50] += 1e12
    rx, ry = reduce(x, y, max_points=100)
    assert len(rx) == len(ry) == 100
    t = trend(x, y, spans=100)
    assert t.n == 100
    assert t.slope == pytest.approx(2.0)
    assert t.p < 1e-10


def test_trend_noise_is_the_residual_spread():
    rng = np.random.default_rng(1)
    x = np.arange(2000)
    t = trend(x, 5.0 * x + rng.normal(0, 100, 2000))
    assert t.noise == pytest.approx(100, rel=0.1)


def test_mismatched_inputs_are_rejected():
    with pytest.raises(ValueError, match="equal length"):
        theil_sen([1, 2, 3], [1, 2])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-(10**9), 10**9), min_size=3, max_size=60),
    st.integers(-(10**12), 10**12),
    st.integers(1, 1000),
)
def test_statistics_are_shift_invariant_and_scale_equivariant(ys, shift, scale):
    x = np.arange(len(ys))
    y = np.array(ys, dtype=np.float64)
    slope = theil_sen(x, y)[0]
    assert theil_sen(x, y + shift)[0] == pytest.approx(slope, abs=1e-6)
    assert theil_sen(x, y * scale)[0] == pytest.approx(slope * scale, rel=1e-9, abs=1e-6)
    assert mann_kendall(y + shift) == mann_kendall(y)
    assert mann_kendall(y * scale) == mann_kendall(y)


def test_a_series_per_batch_joins_the_readings_with_straight_lines():
    x, y = per_batch([0, 1, 2, 18, 34], [0, 10, 20, 180, 180])
    assert x.tolist() == list(range(35))
    assert y[10] == pytest.approx(100) and y[30] == pytest.approx(180)
    x, y = per_batch(np.arange(0, 10**6, 10), np.zeros(10**5))
    assert len(x) <= 8192 and 0 <= x[0] < 200 and 999_800 < x[-1] <= 999_990  # block medians


def test_a_broken_line_finds_where_growth_starts_and_reads_its_ends_robustly():
    x = np.arange(700.0)
    y = np.where(x >= 400, (x - 400) * 100.0, 0.0)
    y[[3, 650]] += 1e9  # spikes at either end move no level
    line = broken_line(x, y, end=720)
    assert line.x[1] == pytest.approx(400, abs=700 / 64) or line.x[2] == pytest.approx(400, abs=11)
    assert line.y[0] == pytest.approx(0, abs=1) and line.at(699) == pytest.approx(29_900, rel=1e-3)
    assert line.y[3] == pytest.approx(32_000, rel=1e-3)  # the last piece extended to the end


def test_a_series_settles_where_it_stays_near_its_last_level():
    x = np.arange(200.0)
    assert settled(x, np.minimum(x, 50.0), 50.0, 5.0) == pytest.approx(45, abs=200 / 64)
    assert settled(x, x, 199.0, 1.0) > 195  # a leak settles nowhere before its last batches


KB = 1024


@pytest.mark.parametrize(
    ("n", "factor", "spike", "height", "jitter", "seed"),
    [
        (64, 2.0, 34, -337 * KB, 0, 0),  # a knot on the spike: its level was read from 4 points
        (47, 9.76, 46, 18_588 * KB, 7 * KB, 530079119),  # the last reading: a rate x150
        (41, 8.84, 40, -65_352 * KB, 6 * KB, 493770990),  # the last reading: the leak missed
        (40, 3.0, 5, 64 * 1024 * KB, 2 * KB, 1),  # the first judged reading: the start level
    ],
)
def test_a_lone_spike_moves_no_level_of_the_broken_line(n, factor, spike, height, jitter, seed):
    """A leak of ``factor`` budgets (128 KiB) over ``n`` batches judged after a 5-batch warm-up,
    as tests/test_rules.py draws it, with one reading off by ``height``: every level of the line
    stays on the leak's, so the fit finds no onset and reports the leak's own rate."""
    slope = factor * 128 * KB / (n - 6)
    x = np.arange(5, n)
    y = slope * (x - 5) + np.random.default_rng(seed).uniform(-jitter, jitter, len(x))
    y[x == spike] += height
    line = broken_line(*per_batch(x, y))
    growth = slope * (n - 6)
    for at, level in zip(line.x, line.y, strict=True):
        assert level == pytest.approx(slope * (at - 5), abs=0.1 * growth)
    fit = Fit.of(x, y)
    assert fit.onset is None and fit.rate == pytest.approx(slope, rel=0.1)
