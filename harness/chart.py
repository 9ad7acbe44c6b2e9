"""Memory over a run as a Mermaid ``xychart-beta`` block, which GitHub renders without tooling:
the x axis is the checkpoint number (the sample's position in the timeline), runs longer than
:data:`MAX_POINTS` are cut into that many equal spans each drawn at its highest reading (so
short spikes stay visible), each metric is one line in the order given, and a last, flat line
marks the device's capacity when the readings come within a quarter of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from harness.markdown import mermaid

MAX_POINTS = 120
MIB = 2**20


def memory_chart(
    series: Mapping[str, Sequence[int | None]],
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


def shows_capacity(series: Mapping[str, Sequence[int | None]], capacity: int | None) -> bool:
    """Whether :func:`memory_chart` draws the capacity line: some reading is at least a quarter
    of it."""
    top = max((r for readings in series.values() for r in readings if r is not None), default=None)
    return top is not None and capacity is not None and 0 < capacity <= top * 4


def _downsample(readings: Sequence[int | None]) -> list[float]:
    """One value per span of checkpoints: the span's highest reading, else the previous value
    (the first value for spans before any reading)."""
    n = len(readings)
    spans = min(n, MAX_POINTS)
    values: list[float | None] = []
    for b in range(spans):
        chunk = [r for r in readings[b * n // spans : (b + 1) * n // spans] if r is not None]
        values.append(float(max(chunk)) if chunk else None)
    first = next((v for v in values if v is not None), None)
    if first is None:
        return []
    filled: list[float] = []
    for v in values:
        filled.append(v if v is not None else (filled[-1] if filled else first))
    return filled
