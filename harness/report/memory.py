"""The report's memory sections: the Memory Profile (one line per named checkpoint and a few
per loop, in the shape of the hand-written incident report), the chart of the whole run, and
the Memory Analysis table (one row per phase and epoch with the verdict's statistics).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from harness.chart import MAX_POINTS, memory_chart, shows_capacity
from harness.markdown import Markdown, code, fenced, plain, strong, table, text
from harness.report.run import Run, as_int, checkpoint_name, oom_events
from harness.units import echo_size, format_mib, format_rate, format_size
from harness.verdict import PhaseStats, Rules

PROFILE_BATCH_ROWS = 6
"""About how many rows a run of per-batch checkpoints gets in the Memory Profile (first, every
Nth, highest, last)."""
HIGHEST_MARGIN = 2**20 // 10
"""How far a loop's highest reading must rise above its first and last to get its own row."""
NOTE_CHARS = 120
NAME_CHARS = 120
"""Characters kept of a note, and of a checkpoint's name, in the Memory Profile."""


def profile(run: Run) -> list[str]:
    if getattr(run, "ranks", None):  # a distributed run: one column per rank
        from harness.report.ranks import rank_profile

        return rank_profile(run)  # type: ignore[arg-type]
    lines = ["## Memory Profile", ""]
    if not run.samples:
        return [*lines, "No checkpoint was recorded."]
    metric, against = run.metric, run.capacity_metric
    capacity = run.capacity
    rows = profile_rows(run)
    width = max(len(name) for name, _, _ in rows) + 1
    right = f"{plain(against, 40)} / capacity" if capacity else plain(against, 40)
    header = [f"{'checkpoint':<{width}}", f"{plain(metric, 40):>10}"]
    if against != metric:
        header.append(right)
    elif capacity:
        header[-1] += " / capacity"
    body = ["  ".join(header)]
    for name, i, notes in rows:
        sample = run.samples[i]
        cells = [f"{name + ':':<{width}}", f"{format_mib(run.reading(sample)):>10}"]
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
        + f". {len(run.samples)} checkpoints in all."
    )
    return [*lines, "", *fenced("text", body)]


def chart(run: Run) -> list[str]:
    if getattr(run, "ranks", None):  # a distributed run: one line per rank
        from harness.report.ranks import rank_chart

        return rank_chart(run)  # type: ignore[arg-type]
    series = {run.metric: [run.reading(s) for s in run.samples]}
    against = run.capacity_metric
    if against != run.metric:
        filling = [as_int(s.get(against)) for s in run.samples]
        if shows_capacity({against: filling}, run.capacity):
            series[against] = filling
    names = list(series)
    block = memory_chart(series, capacity=run.capacity)
    if not block:
        return []
    drawn: list[str] = [code(m) for m in names if any(v is not None for v in series[m])]
    if shows_capacity(series, run.capacity):
        drawn.append(f"the capacity ({format_mib(run.capacity)}, flat)")
    lines_text = f"lines, in order: {', '.join(drawn)}" if len(drawn) > 1 else drawn[0]
    caption = f"MiB per checkpoint ({lines_text}); x is the checkpoint number"
    if len(run.samples) > MAX_POINTS:
        caption += f"; the run is drawn as {MAX_POINTS} spans at each span's highest reading"
    ooms = [event[0] for event in oom_events(run)]
    if ooms:
        caption += "; out of memory at " + ", ".join(
            f"#{i} ({text(checkpoint_name(run.samples[i]))})" for i in ooms[:3]
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


def analysis(run: Run) -> list[str]:
    if getattr(run, "ranks", None):  # a distributed run: one column per rank
        from harness.report.ranks import rank_analysis

        return rank_analysis(run)  # type: ignore[arg-type]
    rows = analysis_rows(run)
    lines = ["## Memory Analysis", ""]
    if not rows:
        return [*lines, "No phase has per-batch checkpoints to analyse."]
    lines += [
        "Per phase and epoch, every figure in the row's metric: batches judged (after the "
        f"warm-up of {run.verdict.rules.warmup}) of those recorded; start and end readings; "
        "growth and slope after the warm-up (robust: Theil-Sen slope, medians of the ends); "
        "peak rise is the highest reading's rise above the start (the high-water mark where "
        "the probe has one, in the metric it marks, named when it is another one); budget is "
        "`max_growth`. Phases outside the rules' `phase` are shown unjudged.",
        "",
        *table(
            [title for title, _ in ANALYSIS_COLUMNS],
            [[getattr(row, field) for _, field in ANALYSIS_COLUMNS] for row in rows],
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
    for positions in batch_runs(run):
        step = nice_step(math.ceil(len(positions) / PROFILE_BATCH_ROWS))
        chosen = {0, len(positions) - 1, *range(0, len(positions), step)}
        measured = {
            k: v for k, i in enumerate(positions) if (v := run.reading(run.samples[i])) is not None
        }
        if measured:
            high = max(measured, key=lambda k: measured[k])
            first, last = min(measured), max(measured)
            if measured[high] >= max(measured[first], measured[last]) + HIGHEST_MARGIN:
                chosen.add(high)
                keep[positions[high]] = ["highest of the loop"]
        for k in chosen:
            keep.setdefault(positions[k], [])
    rows = []
    for i, s in enumerate(run.samples):
        if i in ooms and not ooms[i]:
            continue  # shown on its event's row
        if i not in keep and not (s.batch is None or i in ooms or s.note):
            continue
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


def batch_runs(run: Run) -> list[list[int]]:
    """Positions of each run of consecutive per-batch samples of one label, phase and epoch."""
    runs: list[list[int]] = []
    key = None
    for i, s in enumerate(run.samples):
        if s.batch is None or s.label.upper() == "OOM":
            key = None
            continue
        this = (s.label, s.phase, s.epoch)
        if this != key:
            runs.append([])
            key = this
        runs[-1].append(i)
    return runs


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
    spans: list[list[Any]] = []
    for i, s in enumerate(run.samples):
        if s.batch is None or s.label.upper() == "OOM":
            continue
        key = (s.phase, s.epoch)
        if spans and spans[-1][0] == key:
            spans[-1][2] = i
        else:
            spans.append([key, i, i])
    parts = []
    for (phase, epoch), first, last in spans[:12]:
        name = text(phase, NAME_CHARS) if phase is not None else "batches"
        parts.append(f"{name}{'' if epoch is None else f' e{epoch}'} #{first}-{last}")
    if len(spans) > 12:
        parts.append(f"... {len(spans) - 12} more")
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
        scope(p.phase, p.epoch),
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
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, s in enumerate(run.samples):
        groups.setdefault((s.phase, s.epoch), []).append(i)
    rows = []
    for key, positions in groups.items():
        if key in judged:
            rows.append(phase_row(judged.pop(key), run.verdict.rules))
            continue
        batches = [i for i in positions if run.samples[i].batch is not None]
        values = [v for v in (run.reading(run.samples[i]) for i in positions) if v is not None]
        if not batches or not values:
            continue
        rows.append(
            AnalysisRow(
                scope(*key),
                f"-/{len(batches)}",
                format_mib(values[0]),
                format_mib(values[-1]),
                format_size(values[-1] - values[0], signed=True),
                format_size(max(values) - values[0], signed=True),
                "n/a",
                "n/a",
                "not judged",
                run.metric,
            )
        )
    return rows + [phase_row(p, run.verdict.rules) for p in judged.values()]


def scope(phase: Any, epoch: Any) -> str:
    """``validation epoch 0``; ``(no phase)`` for samples outside any phase (not escaped)."""
    name = plain(phase, NAME_CHARS) if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {plain(epoch, 20)}"


def status(value: str) -> Markdown:
    """A check's or phase's status, in bold when it failed."""
    return strong(value) if value in ("FAIL", "ERROR") else text(value)
