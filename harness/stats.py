"""Robust statistics for memory series: Theil-Sen slope, Mann-Kendall trend test, robust levels.

Everything is plain numpy. Series longer than :data:`MAX_POINTS` are reduced first: the points
are cut, in order, into ``MAX_POINTS`` consecutive blocks whose sizes differ by at most one
(as ``numpy.array_split`` cuts them), and each block becomes one point, the median of its ``x``
and the median of its ``y``. That keeps the pairwise statistics at O(MAX_POINTS²) whatever the
length of the run, and removes spikes shorter than half a block. :func:`trend` computes the
differences ``y[j] - y[i]`` over the pairs ``i < j`` once, for both the Theil-Sen slope and the
Mann-Kendall statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    i, j = _pairs(len(xs))
    return _theil_sen(xs, ys, ys[j] - ys[i], i, j)


def _theil_sen(
    xs: np.ndarray, ys: np.ndarray, dy: np.ndarray, i: np.ndarray, j: np.ndarray
) -> tuple[float, float]:
    dx = xs[j] - xs[i]
    if len(xs) > 1 and bool((xs[1:] > xs[:-1]).all()):
        slopes = np.divide(dy, dx, out=dx)  # x strictly increasing: every pair counts
    else:
        keep = dx != 0
        if not keep.any():
            return 0.0, float(np.median(ys)) if len(ys) else 0.0
        slopes = dy[keep] / dx[keep]
    slope = median(slopes)
    return slope, float(np.median(ys - slope * xs))


_SAMPLE = 4096
"""Values drawn by :func:`median` to bracket the median of a long array."""


def median(values: np.ndarray) -> float:
    """``numpy.median`` of a 1-D float array, exactly, in fewer passes for long arrays.

    A deterministic sample of :data:`_SAMPLE` values brackets the middle ranks; the values
    below the bracket are counted and only those inside it are partitioned. When the middle
    ranks fall outside the bracket (rare: it is 8 standard errors wide) the whole array is
    partitioned, as ``numpy.median`` does.
    """
    n = len(values)
    if n < 16 * _SAMPLE:
        return float(np.median(values))
    drawn = np.sort(values[np.random.default_rng(n).integers(0, n, _SAMPLE)])
    half, margin = _SAMPLE // 2, _SAMPLE // 16
    low, high = drawn[half - margin], drawn[half + margin]
    below = int(np.count_nonzero(values < low))
    inside = values[(values >= low) & (values <= high)]
    first, second = (n - 1) // 2 - below, n // 2 - below
    if first < 0 or second >= len(inside):
        return float(np.median(values))
    part = np.partition(inside, (first, second))
    return float(np.mean(part[[first, second]])) if first != second else float(part[first])


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
    approximation, which is adequate from about six points on.
    """
    ys = np.asarray(y, dtype=np.float64)
    if len(ys) < 2:
        return 0, 0.0, 0.5
    i, j = _pairs(len(ys))
    return _mann_kendall(ys, ys[j] - ys[i])


def _mann_kendall(ys: np.ndarray, dy: np.ndarray) -> tuple[int, float, float]:
    n = len(ys)
    if n < 2:
        return 0, 0.0, 0.5
    s = int(np.count_nonzero(dy > 0)) - int(np.count_nonzero(dy < 0))
    _, counts = np.unique(ys, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    if var <= 0 or s == 0:
        return s, 0.0, 0.5
    z = (s - math.copysign(1, s)) / math.sqrt(var)
    return s, z, 0.5 * math.erfc(z / math.sqrt(2))


def trend(x: Series, y: Series, *, max_points: int = MAX_POINTS) -> Trend:
    """Theil-Sen line and Mann-Kendall test of ``y`` against ``x`` (points ordered by ``x``).
    A long series is reduced before its whole numbers are turned into floats (their block
    medians are the same either way), so it is never copied whole."""
    xs, ys = reduce(*_arrays(x, y), max_points=max_points)
    xs, ys = xs.astype(np.float64, copy=False), ys.astype(np.float64, copy=False)
    i, j = _pairs(len(xs))
    dy = ys[j] - ys[i]
    s, z, p = _mann_kendall(ys, dy)
    slope, intercept = _theil_sen(xs, ys, dy, i, j)
    residuals = ys - (slope * xs + intercept)
    noise = MAD_TO_SIGMA * float(np.median(np.abs(residuals - np.median(residuals))))
    return Trend(slope, intercept, s, z, p, noise if len(ys) else 0.0, len(xs))


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
            np.median(values[:cut].reshape(longer, size + 1), axis=1),
            np.median(values[cut:].reshape(blocks - longer, size), axis=1),
        ]
    )


def edge_window(n: int, *, fraction: float = 1 / 8, minimum: int = 5) -> int:
    """How many points at each end :func:`robust_delta` takes a median over."""
    return max(1, min(n // 2, max(minimum, int(n * fraction))))


def robust_delta(y: Series, *, fraction: float = 1 / 8, minimum: int = 5) -> float:
    """Median of the last points minus the median of the first points of ``y``.

    Each end window holds ``fraction`` of the points (at least ``minimum``, at most half), so
    spikes making up less than ``fraction / 2`` of the points cannot carry either median.
    """
    ys = _numbers(y)
    if len(ys) < 2:
        return 0.0
    k = edge_window(len(ys), fraction=fraction, minimum=minimum)
    return float(np.median(ys[-k:]) - np.median(ys[:k]))


def _arrays(x: Series, y: Series) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` as numeric arrays of one length (see :func:`_numbers`)."""
    xs, ys = _numbers(x), _numbers(y)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"x and y must be 1-D and of equal length, got {xs.shape} and {ys.shape}")
    return xs, ys


def _numbers(values: Series) -> np.ndarray:
    """``values`` as an array: itself if it holds whole or real numbers, else as floats. Medians
    of whole numbers below 2**53 are the same as of their floats."""
    found = np.asarray(values)
    return found if found.dtype.kind in "iuf" else found.astype(np.float64)
