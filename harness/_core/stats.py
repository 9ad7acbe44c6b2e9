"""Robust statistics for memory series: Theil-Sen slope, Mann-Kendall trend test, a series per
batch, and a broken line that says where growth bends.

Everything is plain numpy. A series is readings ``y`` at batches ``x``; where memory is read on
a stride, a reading stands for the batches around it, so the slope and the broken line weigh
batches, not readings: they are fitted to the :func:`per_batch` series (the readings joined by
straight lines, one point a batch). Series longer than :data:`MAX_POINTS` are reduced first:
the points are cut, in order, into ``MAX_POINTS`` consecutive blocks whose sizes differ by at
most one (as ``numpy.array_split`` cuts them), and each block becomes one point, the median of
its ``x`` and the median of its ``y``. That keeps the Theil-Sen slopes at O(MAX_POINTS²) pairs
whatever the length of the run, and removes spikes shorter than half a block. The Mann-Kendall
statistic is counted without forming its pairs (about n^1.5 steps), and the broken line's knots
are weighed from running sums (a fixed number of candidates), so a loop's fit costs time about
linear in its batches up to the bound, and bounded after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness._core.errors import BadArgument

MAX_POINTS = 1024
Series = Sequence[float] | np.ndarray
"""Readings, as a list or an array."""
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Trend:
    """A robust straight-line description of a series.

    ``slope`` is the Theil-Sen slope (y units per x unit) and ``intercept`` the median of
    ``y - slope * x``. ``s``, ``z`` and ``p`` are the Mann-Kendall statistic, its normal score
    (tie- and continuity-corrected) and the one-sided p-value for an increasing trend. ``noise``
    is the robust standard deviation (1.4826 x MAD) of the residuals around the line, and ``n``
    the number of points used (after any reduction to block medians).
    """

    slope: float
    intercept: float
    s: int
    z: float
    p: float
    noise: float
    n: int


def theil_sen(x: Series, y: Series) -> tuple[float, float]:
    """Median of the pairwise slopes over pairs with distinct ``x``, and the matching intercept.

    Returns ``(0.0, median(y))`` when no two points have distinct ``x``.
    """
    xs, ys = (v.astype(np.float64) for v in _arrays(x, y))
    return _theil_sen(xs, ys)


def _theil_sen(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    dx, dy = _differences(xs, ys)
    if len(xs) > 1 and bool((xs[1:] > xs[:-1]).all()):
        slopes = np.divide(dy, dx, out=dx)  # x strictly increasing: every pair counts
    else:
        keep = dx != 0
        if not keep.any():
            return 0.0, median(ys) if len(ys) else 0.0
        slopes = dy[keep] / dx[keep]
    slope = median(slopes)
    return slope, median(ys - slope * xs)


_SAMPLE = 4096
"""Values drawn by :func:`median` to bracket the median of a long array."""


def median(values: np.ndarray) -> float:
    """``numpy.median`` of a 1-D array of finite numbers, exactly, in fewer passes.

    Short arrays are partitioned at their middle ranks alone (``numpy.median`` does that, and
    its checks cost more than the partition itself). In a long one a deterministic sample of
    :data:`_SAMPLE` values brackets the middle ranks; the values below the bracket are counted
    and only those inside it are partitioned. When the middle ranks fall outside the bracket
    (rare: it is 8 standard errors wide) the whole array is partitioned.
    """
    n = len(values)
    if n < 16 * _SAMPLE:
        return _middle(values)
    drawn = np.sort(values[np.random.default_rng(n).integers(0, n, _SAMPLE)])
    half, margin = _SAMPLE // 2, _SAMPLE // 16
    low, high = drawn[half - margin], drawn[half + margin]
    below = int(np.count_nonzero(values < low))
    inside = values[(values >= low) & (values <= high)]
    first, second = (n - 1) // 2 - below, n // 2 - below
    if first < 0 or second >= len(inside):
        return _middle(values)
    part = np.partition(inside, (first, second))
    return float(part[first]) if first == second else (float(part[first]) + float(part[second])) / 2


def _middle(values: np.ndarray) -> float:
    """The median of ``values`` by one partition at its middle ranks; their mean in floats, as
    ``numpy.median`` takes it (NaN for none)."""
    n = len(values)
    if not n:
        return math.nan
    half = n // 2
    if n % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, (half - 1, half))
    return (float(part[half - 1]) + float(part[half])) / 2


_LATER = np.tri(64, k=-1, dtype=bool).T
"""The pairs ``(i, j)`` of up to 64 points with ``i < j``, as a mask."""


def _differences(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``xs[j] - xs[i]`` and ``ys[j] - ys[i]`` over every pair ``i < j``, in
    ``numpy.triu_indices`` order: for a few points through :data:`_LATER`, else :func:`_pairs`."""
    n = len(xs)
    if n <= len(_LATER):
        later = _LATER[:n, :n]
        return (xs - xs[:, None])[later], (ys - ys[:, None])[later]
    i, j = _pairs(n)
    return xs[j] - xs[i], ys[j] - ys[i]


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(i, j)`` of every pair ``i < j`` of ``n`` points, in ``numpy.triu_indices``
    order, without its ``n x n`` mask. Not cached: a judge that runs inside a recorded run
    must not keep memory of its own between calls."""
    kind = np.dtype(np.int32 if n * n < 2**31 else np.int64)  # half the memory when reduced
    counts = np.arange(n - 1, -1, -1, dtype=kind)  # row r pairs with r + 1 .. n - 1
    rows = np.arange(n, dtype=kind)
    i = np.repeat(rows, counts)
    first = np.cumsum(counts, dtype=kind) - counts  # where each row's pairs start
    j = np.arange(len(i), dtype=kind) - np.repeat(first - rows - 1, counts)
    return i, j


def mann_kendall(y: Series) -> tuple[int, float, float]:
    """Mann-Kendall test of ``y`` in its given order: ``(S, z, p)``, p one-sided for increase.

    The variance is corrected for ties and ``z`` for continuity; ``p`` comes from the normal
    approximation, which is adequate from about six points on. ``S`` is counted in about
    n^1.5 steps (:func:`_rising_pairs`), not pair by pair.
    """
    ys = np.asarray(y, dtype=np.float64)
    n = len(ys)
    if n < 2:
        return 0, 0.0, 0.5
    ordered = np.sort(ys)
    tied, correction = 0, 0.0  # pairs of equal values, and the variance they take
    if (equal := ordered[1:] == ordered[:-1]).any():
        ties = np.diff(np.flatnonzero(~equal), prepend=-1, append=n - 1)
        ties = ties[ties > 1].astype(np.float64)
        tied = int((ties * (ties - 1)).sum()) // 2
        correction = float((ties * (ties - 1) * (2 * ties + 5)).sum())
    s = 2 * _rising_pairs(ys, ordered) + tied - n * (n - 1) // 2  # rising pairs less falling
    var = (n * (n - 1) * (2 * n + 5) - correction) / 18
    if var <= 0 or s == 0:
        return s, 0.0, 0.5
    z = (s - math.copysign(1, s)) / math.sqrt(var)
    return s, z, 0.5 * math.erfc(z / math.sqrt(2))


def _rising_pairs(values: np.ndarray, ordered: np.ndarray) -> int:
    """How many pairs ``i < j`` have ``values[i] < values[j]`` (``ordered``: the values sorted).

    The values are cut into blocks of sqrt(8 n) (at least 64): pairs inside a block are
    compared directly, and a value's pairs with the blocks before it are read from the blocks'
    histograms of ranks (8 bytes a rank, a block), so the work is about n^1.5 however the
    values fall."""
    n = len(values)
    size = n if n <= len(_LATER) else max(math.isqrt(8 * n), len(_LATER))
    blocks = -(-n // size)
    padded = np.full(blocks * size, -np.inf)  # the last block padded below every value, last
    padded[:n] = values
    grid = padded.reshape(blocks, size)
    later = _LATER[:size, :size] if size <= len(_LATER) else np.tri(size, k=-1, dtype=bool).T
    rising = int(np.count_nonzero((grid[:, :, None] < grid[:, None, :]) & later))
    if blocks > 1:  # each rank's values in each block, in the blocks before it, and lower
        at = np.arange(blocks)[:, None] * (n + 1) + np.searchsorted(ordered, grid)
        counts = np.bincount(at.ravel(), minlength=blocks * (n + 1)).reshape(blocks, n + 1)
        before = np.cumsum(counts, axis=0) - counts
        rising += int((counts * (np.cumsum(before, axis=1) - before)).sum())
    return rising


GRID = 8192
"""The most points a :func:`per_batch` has: one a batch up to this many batches."""


def per_batch(x: Series, y: Series, *, points: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """Readings ``y`` at batches ``x`` (strictly ascending) as a series with one point a batch
    (at most ``points``, evenly spaced over the batches), each unread batch on the straight line
    between the readings around it: what an estimator fitted to it weighs is the same whether
    every batch was read or every sixteenth. More readings than ``points`` are first reduced to
    block medians."""
    xs, ys = reduce(*_arrays(x, y), max_points=points)
    xs, ys = xs.astype(np.float64, copy=False), ys.astype(np.float64, copy=False)
    if len(xs) < 2:
        return xs, ys
    count = min(int(xs[-1] - xs[0]) + 1, points)
    grid = np.arange(count) * ((xs[-1] - xs[0]) / max(count - 1, 1)) + xs[0]  # numpy.linspace's
    grid[-1] = xs[-1] if count > 1 else xs[0]  # arithmetic, without its checks
    return grid, np.interp(grid, xs, ys)


@dataclass(frozen=True)
class Broken:
    """A continuous line of three pieces through levels ``y`` at batches ``x`` (the first
    batch, the two knots, the last), the end levels read over ``edge`` batches; :meth:`at`
    reads it, extending the end pieces."""

    x: tuple[float, float, float, float]
    y: tuple[float, float, float, float]
    edge: float = 0.0
    """The batches from each end over which its level was read."""

    def at(self, batch: float) -> float:
        """The level at ``batch``."""
        x, y = self.x, self.y
        k = 0 if batch <= x[1] else 1 if batch <= x[2] else 2
        if x[k + 1] == x[k]:
            return y[k + 1]
        return y[k] + (y[k + 1] - y[k]) * (batch - x[k]) / (x[k + 1] - x[k])


PIECES = 64
"""Block medians a :func:`broken_line` places its knots by."""
SHORTEST = PIECES // 16
"""The fewest blocks a piece of a :func:`broken_line` spans: a sixteenth of the series."""
END_POINTS = 256
"""The most points an end piece's Theil-Sen line is fitted to."""
LEVEL_POINTS = 5
"""The fewest points a :func:`broken_line`'s level is read from: a lone spike among five spoils
four of their ten Theil-Sen pairs, fewer than half, so it moves neither the slope nor the level
(among four it spoils three of six, half, and the level follows it)."""


def broken_line(x: Series, y: Series, *, end: float | None = None) -> Broken:
    """A continuous three-piece line through ``y`` at ``x`` (a :func:`per_batch`: evenly spaced,
    ascending), extended to ``end`` (by default the last ``x``).

    The knots are where the least-squares three-piece line closest to the :data:`PIECES` block
    medians bends, each piece at least :data:`SHORTEST` blocks long (a series too short for
    three bends nowhere: its knots sit a third and two thirds along). The levels are read
    locally and robustly: at the first ``x``, at the end of the first piece, at the start of
    the last and at the last ``x``, each the Theil-Sen line of the points within a sixteenth of
    the series on that side (at least :data:`LEVEL_POINTS` of them), there, kept within those
    points' range (which a line through a sawtooth's tooth would leave); so no level is moved by
    a step elsewhere, nor by a lone spike, even one a knot sits on. The last level goes on to
    ``end`` along its line."""
    xs, ys = (v.astype(np.float64) for v in _arrays(x, y))
    first, last = (float(xs[0]), float(xs[-1])) if len(xs) else (0.0, 0.0)
    end = last if end is None else max(float(end), last)
    if len(xs) < 2 or last == first:
        level = median(ys) if len(ys) else 0.0
        return Broken((first, first, end, end), (level,) * 4)
    c, e = _knots(xs, ys) or (first + (last - first) / 3, first + 2 * (last - first) / 3)
    edge = max((last - first) / 16, LEVEL_POINTS - 1.0)  # a point a batch when this short
    start, _ = _level(xs, ys, first, first + edge)
    bend, _ = _level(xs, ys, c, c - edge)
    flat, _ = _level(xs, ys, e, e + edge)
    final, slope = _level(xs, ys, last, last - edge)
    return Broken((first, c, e, end), (start, bend, flat, final + slope * (end - last)), edge)


def settled(x: Series, y: Series, level: float, band: float) -> float:
    """The first ``x`` from which the :data:`PIECES` block medians of ``y`` (a
    :func:`per_batch` series) all stay within ``band`` of ``level``: where the series settled
    there (the last ``x`` where it never does)."""
    bx, by = reduce(*_arrays(x, y), max_points=PIECES)
    outside = np.flatnonzero(np.abs(by - level) > band)
    if not len(outside):
        return float(bx[0]) if len(bx) else 0.0
    if outside[-1] == len(bx) - 1:
        return float(np.asarray(x)[-1])
    return float(bx[outside[-1] + 1])


def _level(xs: np.ndarray, ys: np.ndarray, at: float, to: float) -> tuple[float, float]:
    """The level at ``at`` of the Theil-Sen line of the points between ``at`` and ``to``, kept
    within their range, and the line's slope."""
    low, high = sorted((at, to))  # xs ascend: the points between are a slice
    window = slice(int(np.searchsorted(xs, low)), int(np.searchsorted(xs, high, side="right")))
    x, y = xs[window], ys[window]
    slope, intercept = _theil_sen(*reduce(x, y, max_points=END_POINTS))
    return min(max(intercept + slope * at, float(y.min())), float(y.max())), slope


def _knots(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float] | None:
    """Where the least-squares three-piece line through the block medians of ``(xs, ys)`` bends;
    None when the series has too few blocks for three pieces.

    The line is the straight one plus two hinges, ``(u - a)+`` and ``(u - c)+`` at the knots
    ``a < c``: the pair of least squares is the one whose hinges take most from the straight
    line's residuals. Sums from each block on give each hinge's products, so every pair of
    knots is weighed at once, in a few operations (a 2 x 2 system each); of equals, the
    earliest pair."""
    bx, by = reduce(xs, ys, max_points=PIECES)
    k = len(bx)
    r = k - 3 * SHORTEST  # the places for either knot: SHORTEST blocks from the ends and apart
    if r < 1:
        return None
    centre = median(by)
    scale = float(np.abs(by - centre).max()) or 1.0
    u = (bx - bx[0]) / (bx[-1] - bx[0])  # well conditioned whatever the units
    v = (by - centre) / scale
    w = u - u.mean()
    ww = float(w @ w)
    residual = v - v.mean() - w * float(w @ v) / ww  # of the straight line
    # sums from each block on, of: 1, u, u^2, w, u w, the residual, u times the residual
    sums = np.stack([np.ones(k), u, u * u, w, u * w, residual, u * residual])
    n0, n1, n2, nw, nuw, ne, nue = np.cumsum(sums[:, ::-1], axis=1)[:, ::-1]
    # the hinge at each block: its sum, its product with w, with the residual, and with itself
    # less what the straight line takes of it
    ones, across, takes = n1 - u * n0, nuw - u * nw, nue - u * ne
    own = n2 - 2 * u * n1 + u * u * n0 - ones**2 / k - across**2 / ww
    early = slice(SHORTEST, SHORTEST + r)  # the earlier knot's blocks, down a grid's rows
    late = slice(2 * SHORTEST, 2 * SHORTEST + r)  # the later's, across its columns
    a, c = u[early, None], u[late]
    both = n2[late] - (a + c) * n1[late] + a * c * n0[late]  # from the later knot on
    both -= ones[early, None] * ones[late] / k + across[early, None] * across[late] / ww
    first, second, ta, tc = own[early, None], own[late], takes[early, None], takes[late]
    apart = np.tri(r, dtype=bool).T  # the later knot SHORTEST blocks or more after the earlier
    gain = np.where(apart, first * tc**2 - 2 * both * ta * tc + second * ta**2, -np.inf)
    lo, hi = divmod(int(np.argmax(gain / np.where(apart, first * second - both**2, 1.0))), r)
    return float(bx[SHORTEST + lo]), float(bx[2 * SHORTEST + hi])


def trend(x: Series, y: Series, *, spans: int | None = None) -> Trend:
    """Theil-Sen line and Mann-Kendall test of readings ``y`` at batches ``x`` (strictly
    ascending).

    The line is of the :func:`per_batch` series cut into ``spans`` equal spans of batches (as
    many as there are readings by default; at most :data:`MAX_POINTS`), each span its median:
    read at every batch, those are the readings themselves; read on a stride, a span stands for
    its batches, read or not, so the slope weighs batches, not readings. The test is of the
    same spans with ``spans`` given, else of the readings themselves (:func:`trend_test` makes
    it alone). ``noise`` is the readings' spread around the line."""
    xs, ys = _readings(x, y)
    bx, by = _spans(xs, ys, spans)
    slope, intercept = _theil_sen(bx, by)
    s, z, p = mann_kendall(_tested(xs, ys) if spans is None else by)
    residuals = ys - (slope * xs + intercept)
    return Trend(slope, intercept, s, z, p, spread(residuals), len(bx))


def trend_test(x: Series, y: Series, *, spans: int | None = None) -> tuple[int, float, float]:
    """The Mann-Kendall test :func:`trend` makes, ``(S, z, p)``, without its line."""
    xs, ys = _readings(x, y)
    return mann_kendall(_tested(xs, ys) if spans is None else _spans(xs, ys, spans)[1])


def _readings(x: Series, y: Series) -> tuple[np.ndarray, np.ndarray]:
    """Readings as :func:`trend` takes them: at most :data:`GRID` block medians, in floats."""
    xs, ys = reduce(*_arrays(x, y), max_points=GRID)
    return xs.astype(np.float64, copy=False), ys.astype(np.float64, copy=False)


def _tested(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The readings :func:`trend` tests without spans: at most :data:`MAX_POINTS` block medians."""
    return reduce(xs, ys, max_points=MAX_POINTS)[1]


def _spans(xs: np.ndarray, ys: np.ndarray, spans: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The :func:`per_batch` series of readings cut into ``spans`` spans (as many as readings by
    default; at most :data:`MAX_POINTS`), each span its median."""
    return reduce(*per_batch(xs, ys), max_points=min(spans or len(xs), MAX_POINTS))


NOISE_SIGMAS = 3.0
"""How many robust spreads (:func:`spread`) of noise a change must exceed to be more than noise:
the history's creep and a rank's outlying growth alike."""


def spread(values: Series) -> float:
    """The robust standard deviation of ``values``: :data:`MAD_TO_SIGMA` times their median
    absolute deviation (a trend's noise, the history's noise between runs, the spread between
    ranks); 0 for none."""
    found = _numbers(values)
    if not len(found):
        return 0.0
    return MAD_TO_SIGMA * median(np.abs(found - median(found)))


def reduce(
    x: np.ndarray, y: np.ndarray, *, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` unchanged if short enough, else medians of ``max_points`` blocks."""
    if len(x) <= max_points:
        return x, y
    return _block_medians(x, max_points), _block_medians(y, max_points)


def _block_medians(values: np.ndarray, blocks: int) -> np.ndarray:
    """Medians of ``numpy.array_split(values, blocks)``: the first ``len % blocks`` blocks
    hold one point more than the others, so two reshapes cover them all."""
    size, longer = divmod(len(values), blocks)
    cut = longer * (size + 1)
    return np.concatenate(
        [
            _row_medians(values[:cut].reshape(longer, size + 1)),
            _row_medians(values[cut:].reshape(blocks - longer, size)),
        ]
    )


def _row_medians(rows: np.ndarray) -> np.ndarray:
    """``numpy.median(rows, axis=1)`` of finite numbers by one partition at the middle ranks."""
    half = rows.shape[1] // 2
    if rows.shape[1] % 2:
        return np.partition(rows, half, axis=1)[:, half].astype(np.float64)
    part = np.partition(rows, (half - 1, half), axis=1)
    return (part[:, half - 1].astype(np.float64) + part[:, half]) / 2


def _arrays(x: Series, y: Series) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as numeric arrays of one length (see :func:`_numbers`)."""
    xs, ys = _numbers(x), _numbers(y)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise BadArgument(f"x and y must be 1-D and of equal length, got {xs.shape} and {ys.shape}")
    return xs, ys


def _numbers(values: Series) -> np.ndarray:
    """``values`` as an array: itself if it holds whole or real numbers, else as floats. Medians
    of whole numbers below 2**53 are the same as of their floats."""
    found = np.asarray(values)
    return found if found.dtype.kind in "iuf" else found.astype(np.float64)
