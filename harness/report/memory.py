"""The report's memory sections: the Memory Profile (one line per named checkpoint and a few
per loop, in the shape of the hand-written incident report), the chart of the whole run, and
the Memory Analysis table (one row per phase and epoch with the verdict's statistics).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

import harness.core.labels as labels
from harness.core.markdown import Markdown, code, fenced, plain, strong, table, text
from harness.core.units import echo_size, format_mib, format_rate, format_size
from harness.core.wording import plural
from harness.report.chart import CHART_POINTS, memory_chart, shows_capacity
from harness.report.run import (
    Run,
    as_int,
    checkpoint_name,
    oom_events,
    turns,
    unbatched,
)
from harness.report.workers import (
    PROFILE_NOTE,
    budget_note,
    children_total,
    growth_cells,
    memory_cells,
    sampling_note,
    worker_roles,
)
from harness.timeline.store import NONE
from harness.verdict.model import CheckStatus, PhaseStats
from harness.verdict.options import Rules

WORKERS = "children"
"""The chart's name for the workers' total."""
PROFILE_BATCH_ROWS = 6
"""About how many rows a run of per-batch checkpoints gets in the Memory Profile (first, every
Nth, highest, last)."""
HIGHEST_MARGIN = 2**20 // 10
"""How far a loop's highest reading must rise above its first and last to get its own row."""
NOTE_CHARS = 120
NAME_CHARS = 120
"""Characters kept of a note, and of a checkpoint's name, in the Memory Profile."""


def single_profile(run: Run) -> list[str]:
    lines = ["## Memory Profile", ""]
    if not run.samples:
        return [*lines, "No checkpoint was recorded."]
    metric, against = run.metric, run.capacity_metric
    capacity = run.capacity
    rows = profile_rows(run)
    width = max(len(name) for name, _, _ in rows) + 1
    right = f"{plain(against, 40)} / capacity" if capacity else plain(against, 40)
    roles = worker_roles(run)
    header = [f"{'checkpoint':<{width}}", *(f"{plain(r, 40):>10}" for r in roles)]
    header.append(f"{plain(metric, 40):>10}")
    if against != metric:
        header.append(right)
    elif capacity:
        header[-1] += " / capacity"
    body = ["  ".join(header)]
    for name, i, notes in rows:
        sample = run.samples[i]
        cells = [f"{name + ':':<{width}}", *(f"{v:>10}" for v in memory_cells(run, i, roles))]
        cells.append(f"{format_mib(run.reading(sample)):>10}")
        used = as_int(sample.get(against))
        if against != metric:
            cells.append(format_mib(used))
        if used is not None and capacity:
            cells[-1] += f" / {format_mib(capacity)} ({100 * used / capacity:.1f}% utilization)"
        if notes:
            cells[-1] += f"  ({'; '.join(notes)})"
        body.append("  ".join(cells).rstrip())
    explained = "; per-batch checkpoints: first, every Nth, highest and last of each loop"
    capacity_text = (
        f"; utilization is {code(against)} against the capacity ({format_mib(capacity)})"
        if capacity
        else ""
    )
    lines.append(
        f"{code(metric)} at each named checkpoint"
        + (explained if batch_runs(run) else "")
        + capacity_text
        + f". {plural(len(run.samples), 'checkpoint')} in all."
        + (f" {PROFILE_NOTE}" if roles else "")
    )
    return [*lines, "", *fenced("text", body)]


def single_chart(run: Run) -> list[str]:
    series = {run.metric: run.readings(run.metric)}
    against = run.capacity_metric
    if against != run.metric:
        filling = run.readings(against)
        if shows_capacity({against: filling}, run.capacity):
            series[against] = filling
    children = children_total(run)
    if children is not None:
        series[WORKERS] = children
    names = list(series)
    block = memory_chart(series, capacity=run.capacity)
    if not block:
        return []
    drawn: list[str] = [
        code(m) if m != WORKERS else "the children's judged memory in all"
        for m in names
        if not np.isnan(series[m]).all()
    ]
    if shows_capacity(series, run.capacity):
        drawn.append(f"the capacity ({format_mib(run.capacity)}, flat)")
    lines_text = f"lines, in order: {', '.join(drawn)}" if len(drawn) > 1 else drawn[0]
    caption = f"MiB per checkpoint ({lines_text}); x is the checkpoint number"
    if len(run.samples) > CHART_POINTS:
        caption += f"; the run is drawn as {CHART_POINTS} spans at each span's highest reading"
    ooms = [event[0] for event in oom_events(run)]
    if ooms:
        caption += "; out of memory at " + ", ".join(
            f"#{i} ({text(checkpoint_name(run.samples[i]))})" for i in ooms[:3]
        )
    marked = turns(run)
    if marked:
        caption += "; " + ", ".join(
            f"{note} at #{i} ({text(checkpoint_name(run.samples[i]))})"
            for i, note in list(marked.items())[:3]
        )
    lines = ["## Memory Over the Run", "", *block, "", caption + "."]
    guide = phase_guide(run)
    if guide:
        lines += ["", f"Checkpoints by phase: {guide}."]
    return lines


class AnalysisRow(NamedTuple):
    """One row of the Memory Analysis, as text: every figure but ``peak`` is in ``metric``;
    ``peak`` names its own metric when it is another one."""

    phase: str
    batches: str
    start: str
    end: str
    growth: str
    peak: str
    slope: str
    budget: str
    status: str
    metric: str


ANALYSIS_COLUMNS = (
    ("Phase", "phase"),
    ("Metric", "metric"),
    ("Batches", "batches"),
    ("Start", "start"),
    ("End", "end"),
    ("Growth", "growth"),
    ("Peak rise", "peak"),
    ("Slope", "slope"),
    ("Budget", "budget"),
    ("Status", "status"),
)


def single_analysis(run: Run) -> list[str]:
    rows = analysis_rows(run)
    lines = ["## Memory Analysis", ""]
    if not rows:
        return [*lines, "No phase has per-batch checkpoints to analyse."]
    roles = worker_roles(run)
    lines += [
        "Per phase and epoch, every figure in the row's metric: batches judged (after the "
        f"warm-up of {run.verdict.rules.warmup}) of those recorded; start and end readings; "
        "growth after the warm-up (the fitted level at the loop's last batch less at its first "
        "judged one, every batch weighed alike, read or not) and slope (per batch, after the "
        "growth's onset where it starts late); "
        "peak rise is the highest reading's rise above the start (the high-water mark where "
        "the probe has one, in the metric it marks, named when it is another one); budget is "
        "`max_growth`. Phases outside the rules' `phase` are shown unjudged."
        + (
            f" A worker role's column is its growth against {budget_note(run)}. "
            f"{sampling_note(run)}"
            if roles
            else ""
        ),
        "",
        *table(
            [title for title, _ in ANALYSIS_COLUMNS] + roles,
            [
                [getattr(row, field) for _, field in ANALYSIS_COLUMNS]
                + growth_cells(run, row.phase, roles)
                for row in rows
            ],
        ),
    ]
    return lines


def profile_rows(run: Run) -> list[tuple[str, int, list[str]]]:
    """(name, position, notes) for each row of the Memory Profile. An out-of-memory event
    seen by several samples (see :func:`oom_events`) is one row, at its first sample with a
    reading, with every sample's note."""
    ooms: dict[int, list[int]] = {}
    for event in oom_events(run):
        shown = next((i for i in event if run.reading(run.samples[i]) is not None), event[0])
        ooms.update({i: [] for i in event})
        ooms[shown] = event
    keep: dict[int, list[str]] = {}
    values, present = run.columns.values(run.metric), run.columns.present(run.metric)
    for positions in batch_runs(run):
        step = nice_step(math.ceil(len(positions) / PROFILE_BATCH_ROWS))
        chosen = {0, len(positions) - 1, *range(0, len(positions), step)}
        measured = np.flatnonzero(present[positions])
        if len(measured):  # a batch off the probe's stride shows the last one read before it
            at = np.searchsorted(measured, sorted(chosen), side="right") - 1
            chosen = {int(measured[max(k, 0)]) for k in at}
            readings = values[positions[measured]]
            top = int(np.argmax(readings))
            if readings[top] >= max(readings[0], readings[-1]) + HIGHEST_MARGIN:
                high = int(measured[top])
                chosen.add(high)
                keep[int(positions[high])] = ["highest of the loop"]
        for k in chosen:
            keep.setdefault(int(positions[k]), [])
    for i, mark in turns(run).items():
        keep.setdefault(i, []).append(mark)
    listed = set(keep) | set(ooms) | set(unbatched(run)) | set(run.columns.notes)
    rows = []
    for i in sorted(listed):
        s = run.samples[i]
        if i in ooms and not ooms[i]:
            continue  # shown on its event's row
        notes = list(keep.get(i, []))
        if s.collected:
            notes.append("after gc")
        for j in ooms.get(i) or [i]:
            note = run.samples[j].note
            if note and plain(note, NOTE_CHARS) not in notes:
                notes.append(plain(note, NOTE_CHARS))
        name = plain(checkpoint_name(s), NAME_CHARS)
        rows.append((f"[OOM ERROR] {name}" if i in ooms else name, i, notes))
    return rows


def batch_runs(run: Run) -> list[np.ndarray]:
    """Positions of each run of consecutive per-batch samples of one label, phase and epoch."""
    c = run.columns
    positions = batch_positions(run)
    if not len(positions):
        return []
    return np.split(positions, _starts(positions, c.label, c.phase, c.epoch, adjacent=True)[1:])


def batch_positions(run: Run) -> np.ndarray:
    """Positions of the per-batch samples, the OOM reports left out (a reading over the
    capacity is a batch's)."""
    reports = run.columns.labelled(labels.reports_oom)
    return np.flatnonzero((run.columns.batch != NONE) & ~reports)


def _starts(positions: np.ndarray, *keys: np.ndarray, adjacent: bool = False) -> np.ndarray:
    """Indices into ``positions`` where a run of equal ``keys`` starts (and, with
    ``adjacent``, where the previous position is not the one just before)."""
    new = np.zeros(len(positions), dtype=bool)
    new[:1] = True
    for key in keys:
        values = key[positions]
        new[1:] |= values[1:] != values[:-1]
    if adjacent:
        new[1:] |= np.diff(positions) != 1
    return np.flatnonzero(new)


def nice_step(at_least: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 25, 50, 100, ... that is at least ``at_least``."""
    scale = 1
    while True:
        for base in (1, 2, 5, 10, 20, 25, 50):
            if base * scale >= at_least:
                return base * scale
        scale *= 100


def phase_guide(run: Run) -> Markdown:
    """``training e0 #1-21 · validation e0 #22-34 · ...``: where each phase lies on the x axis."""
    c = run.columns
    positions = batch_positions(run)
    starts = _starts(positions, c.phase, c.epoch)
    lasts = np.append(starts[1:], len(positions))[: len(starts)] - 1
    parts = []
    for first, last in zip(
        positions[starts[:12]].tolist(), positions[lasts[:12]].tolist(), strict=True
    ):
        phase, epoch = c.key(first)
        name = text(phase, NAME_CHARS) if phase is not None else "batches"
        parts.append(f"{name}{'' if epoch is None else f' e{epoch}'} #{first}-{last}")
    if len(starts) > 12:
        parts.append(f"... {len(starts) - 12} more")
    return Markdown(" · ".join(parts))


def phase_row(p: PhaseStats, rules: Rules) -> AnalysisRow:
    if p.budget is None:
        budget = "n/a"
    elif p.budget == rules.max_growth:
        budget = echo_size(rules.shown("max_growth"), p.budget)
    else:
        budget = format_size(p.budget)
    peak = format_size(p.peak_rise, signed=True)
    if p.peak_rise is not None and p.peak_metric and p.peak_metric != p.metric:
        peak += f" ({p.peak_metric})"
    return AnalysisRow(
        scope_label(p.phase, p.epoch),
        f"{p.judged}/{p.batches}",
        format_mib(p.start),
        format_mib(p.end),
        format_size(p.growth, signed=True),
        peak,
        format_rate(p.slope),
        budget,
        status(p.status),
        p.metric or "n/a",
    )


def analysis_rows(run: Run) -> list[AnalysisRow]:
    """One row per phase and epoch with batches, in timeline order: the verdict's statistics
    where the rules judged it, else start, end, change and peak of the readings."""
    judged = {(p.phase, p.epoch): p for p in run.verdict.phases}
    c = run.columns
    values, present = c.values(run.metric), c.present(run.metric)
    order = np.lexsort((c.epoch, c.phase))
    starts = _starts(order, c.phase, c.epoch)
    groups = sorted(np.split(order, starts[1:]), key=lambda g: int(g[0])) if len(order) else []
    rows = []
    for positions in groups:
        key = c.key(positions[0])
        if key in judged:
            rows.append(phase_row(judged.pop(key), run.verdict.rules))
            continue
        batches = int(np.count_nonzero(c.batch[positions] != NONE))
        readings = values[positions[present[positions]]]
        if not batches or not len(readings):
            continue
        first, last, top = int(readings[0]), int(readings[-1]), int(readings.max())
        rows.append(
            AnalysisRow(
                scope_label(*key),
                f"-/{batches}",
                format_mib(first),
                format_mib(last),
                format_size(last - first, signed=True),
                format_size(top - first, signed=True),
                "n/a",
                "n/a",
                "not judged",
                run.metric,
            )
        )
    return rows + [phase_row(p, run.verdict.rules) for p in judged.values()]


def scope_label(phase: Any, epoch: Any) -> str:
    """``validation epoch 0``; ``(no phase)`` for samples outside any phase (not escaped)."""
    name = plain(phase, NAME_CHARS) if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {plain(epoch, 20)}"


def status(value: str) -> Markdown:
    """A check's or phase's status, in bold when it failed."""
    return strong(value) if value in (CheckStatus.FAIL, CheckStatus.ERROR) else text(value)
