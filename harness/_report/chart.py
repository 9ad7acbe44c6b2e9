"""Memory Over the Run: the section (:func:`chart`), a line for each run shown (one per rank of
a merged run), for what fills the device where it is another metric, and for the DataLoader
workers' total. It is drawn as a Mermaid ``xychart-beta`` block, which GitHub renders without
tooling (:func:`memory_chart`): the x axis is the checkpoint number (the sample's position in
the timeline), runs longer than :data:`CHART_POINTS` are cut into that many equal spans each
drawn at its highest reading (so short spikes stay visible), each series is one line in the
order given, and a last, flat line marks the device's capacity when the readings come within
a quarter of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from harness._core.markdown import Markdown, code, mermaid, text
from harness._core.units import format_mib
from harness._report.ranks import more, side_by_side
from harness._report.run import (
    NAME_CHARS,
    Run,
    batch_positions,
    checkpoint_name,
    key_starts,
    oom_events,
    turns,
)
from harness._report.workers import children_total

CHART_POINTS = 120
MIB = 2**20
Readings = Sequence[int | None] | np.ndarray
"""Bytes per checkpoint: None, or NaN in an array, where not measured."""
MARKS = 3
"""Out-of-memory events, and turns of a loop's growth, named in the caption, per run shown."""
GUIDE_PHASES = 12
"""Phases the caption's guide to the x axis names."""


def chart(run: Run) -> list[str]:
    """The Memory Over the Run section; nothing where no reading was taken."""
    columns = side_by_side(run)
    ranked = columns[0].rank is not None
    metric = run.metric
    series: dict[str, np.ndarray] = {}
    said: dict[str, str] = {}
    for c in columns:
        name = f"rank {c.rank}" if ranked else metric
        series[name] = c.run.readings(metric)
        said[name] = f"{name}'s {code(metric)}" if ranked else code(metric)
    for c in columns:
        against = c.run.capacity_metric
        filling = c.run.readings(against)
        if against != metric and shows_capacity({against: filling}, c.run.capacity):
            series[c.head(against)], said[c.head(against)] = filling, c.head(code(against))
    for c in columns:
        children = children_total(c.run)
        if children is not None:
            name = f"rank {c.rank} children" if ranked else "children"
            series[name] = children
            said[name] = name if ranked else "the children's judged memory in all"
    block = memory_chart(series, capacity=run.capacity)
    if not block:
        return []
    drawn = [said[name] for name, values in series.items() if not np.isnan(values).all()]
    if shows_capacity(series, run.capacity):
        drawn.append(f"the capacity ({format_mib(run.capacity)}, flat)")
    lines_text = f"lines, in order: {', '.join(drawn)}" if len(drawn) > 1 else drawn[0]
    caption = f"MiB per checkpoint ({lines_text}); x is the checkpoint number"
    caption += " on each rank" * ranked
    if any(len(c.run.samples) > CHART_POINTS for c in columns):
        caption += f"; the run is drawn as {CHART_POINTS} spans at each span's highest reading"
    for c in columns:
        where = f"rank {c.rank} " if ranked else ""
        ooms = [event[0] for event in oom_events(c.run)]
        if ooms:
            caption += "; out of memory at " + ", ".join(
                f"{where}#{i} ({text(checkpoint_name(c.run.samples[i]))})" for i in ooms[:MARKS]
            )
        marked = turns(c.run)
        if marked:
            caption += "; " + ", ".join(
                f"{note} at {where}#{i} ({text(checkpoint_name(c.run.samples[i]))})"
                for i, note in list(marked.items())[:MARKS]
            )
    lines = ["## Memory Over the Run", "", *block, "", caption + "." + more(run)]
    guide = phase_guide(columns[0].run)
    if guide:
        on = f" on rank {columns[0].rank}" if ranked else ""
        lines += ["", f"Checkpoints by phase{on}: {guide}."]
    return lines


def phase_guide(run: Run) -> Markdown:
    """``training e0 #1-21 · validation e0 #22-34 · ...``: where each phase lies on the x axis."""
    c = run.columns
    positions = batch_positions(run)
    starts = key_starts(positions, c.phase, c.epoch)
    lasts = np.append(starts[1:], len(positions))[: len(starts)] - 1
    parts = []
    for first, last in zip(
        positions[starts[:GUIDE_PHASES]].tolist(),
        positions[lasts[:GUIDE_PHASES]].tolist(),
        strict=True,
    ):
        phase, epoch = c.key(first)
        name = text(phase, NAME_CHARS) if phase is not None else "batches"
        parts.append(f"{name}{'' if epoch is None else f' e{epoch}'} #{first}-{last}")
    if len(starts) > GUIDE_PHASES:
        parts.append(f"... {len(starts) - GUIDE_PHASES} more")
    return Markdown(" · ".join(parts))


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
