"""Memory over a run as a Mermaid ``xychart-beta`` block, which GitHub renders without tooling:
the x axis is the checkpoint number (the sample's position in the timeline), runs longer than
:data:`CHART_POINTS` are cut into that many equal spans each drawn at its highest reading (so
short spikes stay visible), each metric is one line in the order given, and a last, flat line
marks the device's capacity when the readings come within a quarter of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from harness.core.markdown import mermaid

CHART_POINTS = 120
MIB = 2**20
Readings = Sequence[int | None] | np.ndarray
"""Bytes per checkpoint: None, or NaN in an array, where not measured."""


def memory_chart(
    series: Mapping[str, Readings],
    *,
    capacity: int | None = None,
    title: str = "Memory per checkpoint",
) -> list[str]:
    """The fenced ``mermaid`` block for ``series`` (metric name to bytes per checkpoint, ``None``
    where not measured; all of one length); no lines when nothing was measured. ``title`` may be
    any text: it is written as an inert Mermaid string."""
    lines = {name: points for name, r in series.items() if (points := _downsample(r))}
    if not lines:
        return []
    checkpoints = max(len(r) for r in series.values())
    values = [v for points in lines.values() for v in points]
    if shows_capacity(series, capacity) and capacity is not None:
        lines["capacity"] = [float(capacity)] * len(next(iter(lines.values())))
        values.append(float(capacity))
    low, high = min(values), max(values)
    pad = max((high - low) * 0.05, high * 0.001, 1.0)
    y_min = math.floor(max(0.0, low - pad) / MIB * 10) / 10
    y_max = math.ceil((high + pad) / MIB * 10) / 10
    return [
        "```mermaid",
        "xychart-beta",
        f'    title "{mermaid(title)}"',
        f'    x-axis "checkpoint" 0 --> {max(checkpoints - 1, 1)}',
        f'    y-axis "MiB" {y_min:.1f} --> {y_max:.1f}',
        *(f"    line [{', '.join(f'{p / MIB:.1f}' for p in points)}]" for points in lines.values()),
        "```",
    ]


def shows_capacity(series: Mapping[str, Readings], capacity: int | None) -> bool:
    """Whether :func:`memory_chart` draws the capacity line: some reading is at least a quarter
    of it."""
    if capacity is None or capacity <= 0:
        return False
    return any(
        bool(np.nanmax(v, initial=-np.inf) * 4 >= capacity) for v in map(as_floats, series.values())
    )


def _downsample(readings: Readings) -> list[float]:
    """One value per span of checkpoints: the span's highest reading, else the previous value
    (the first value for spans before any reading)."""
    values = as_floats(readings)
    n = len(values)
    if not n or np.isnan(values).all():
        return []
    spans = min(n, CHART_POINTS)
    bounds = np.arange(spans) * n // spans
    highest = np.fmax.reduceat(values, bounds)  # NaN (not read) only where a whole span is
    known = np.flatnonzero(~np.isnan(highest))
    # each span without a reading takes the previous span's value, the first known before any
    previous = np.maximum.accumulate(np.where(np.isnan(highest), -1, np.arange(spans)))
    filled = highest[np.where(previous < 0, known[0], previous)]
    return filled.tolist()


def as_floats(readings: Readings) -> np.ndarray:
    """Readings as float64, NaN where not read."""
    if isinstance(readings, np.ndarray):
        return readings.astype(np.float64, copy=False)
    return np.array([np.nan if r is None else r for r in readings], dtype=np.float64)
