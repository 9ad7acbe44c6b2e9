"""Robust statistics for memory series: Theil-Sen slope, Mann-Kendall trend test, robust levels.

Everything is plain numpy. Series longer than :data:`MAX_POINTS` are reduced to that many block
medians first, which keeps the pairwise statistics at O(MAX_POINTS²) and removes short spikes.
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
    xs, ys = _arrays(x, y)
    i, j = np.triu_indices(len(xs), k=1)
    dx = xs[j] - xs[i]
    keep = dx != 0
    if not keep.any():
        return 0.0, float(np.median(ys)) if len(ys) else 0.0
    slope = float(np.median((ys[j][keep] - ys[i][keep]) / dx[keep]))
    return slope, float(np.median(ys - slope * xs))


def mann_kendall(y: Series) -> tuple[int, float, float]:
    """Mann-Kendall test of ``y`` in its given order: ``(S, z, p)``, p one-sided for increase.

    The variance is corrected for ties and ``z`` for continuity; ``p`` comes from the normal
    approximation, which is adequate from about six points on.
    """
    ys = np.asarray(y, dtype=np.float64)
    n = len(ys)
    if n < 2:
        return 0, 0.0, 0.5
    i, j = np.triu_indices(n, k=1)
    s = int(np.sign(ys[j] - ys[i]).sum())
    _, counts = np.unique(ys, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    if var <= 0 or s == 0:
        return s, 0.0, 0.5
    z = (s - math.copysign(1, s)) / math.sqrt(var)
    return s, z, 0.5 * math.erfc(z / math.sqrt(2))


def trend(x: Series, y: Series, *, max_points: int = MAX_POINTS) -> Trend:
    """Theil-Sen line and Mann-Kendall test of ``y`` against ``x`` (points ordered by ``x``)."""
    xs, ys = reduce(*_arrays(x, y), max_points=max_points)
    slope, intercept = theil_sen(xs, ys)
    s, z, p = mann_kendall(ys)
    residuals = ys - (slope * xs + intercept)
    noise = MAD_TO_SIGMA * float(np.median(np.abs(residuals - np.median(residuals))))
    return Trend(slope, intercept, s, z, p, noise if len(ys) else 0.0, len(xs))


def reduce(
    x: np.ndarray, y: np.ndarray, *, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)`` unchanged if short enough, else medians of ``max_points`` blocks."""
    if len(x) <= max_points:
        return x, y
    blocks = np.array_split(np.arange(len(x)), max_points)
    return (
        np.array([np.median(x[b]) for b in blocks]),
        np.array([np.median(y[b]) for b in blocks]),
    )


def edge_window(n: int, *, fraction: float = 1 / 8, minimum: int = 5) -> int:
    """How many points at each end :func:`robust_delta` takes a median over."""
    return max(1, min(n // 2, max(minimum, int(n * fraction))))


def robust_delta(y: Series, *, fraction: float = 1 / 8, minimum: int = 5) -> float:
    """Median of the last points minus the median of the first points of ``y``.

    Each end window holds ``fraction`` of the points (at least ``minimum``, at most half), so
    spikes making up less than ``fraction / 2`` of the points cannot carry either median.
    """
    ys = np.asarray(y, dtype=np.float64)
    if len(ys) < 2:
        return 0.0
    k = edge_window(len(ys), fraction=fraction, minimum=minimum)
    return float(np.median(ys[-k:]) - np.median(ys[:k]))


def _arrays(x: Series, y: Series) -> tuple[np.ndarray, np.ndarray]:
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"x and y must be 1-D and of equal length, got {xs.shape} and {ys.shape}")
    return xs, ys
