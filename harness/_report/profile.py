"""The Memory Profile: one line per named checkpoint and a few per loop, in the shape of the
hand-written incident report, with a column of readings for each run shown (one per rank of a
merged run, matched by label, phase, epoch and batch), the device's utilization where its
capacity is known, and each DataLoader worker role's judged memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness._core.markdown import code, fenced, plain
from harness._core.units import format_mib
from harness._core.wording import plural
from harness._report.ranks import Shown, more, side_by_side
from harness._report.run import (
    NAME_CHARS,
    Run,
    as_int,
    batch_positions,
    checkpoint_name,
    key_starts,
    oom_events,
    turns,
    unbatched,
)
from harness._report.workers import PROFILE_NOTE, memory_cells, worker_roles
from harness._rules.measures import part_name, shown_parts

PROFILE_BATCH_ROWS = 6
"""About how many rows a run of per-batch checkpoints gets in the Memory Profile (first, every
Nth, highest, last)."""
HIGHEST_MARGIN = 2**20 // 10
"""How far a loop's highest reading must rise above its first and last to get its own row."""
NOTE_CHARS = 120
"""Characters kept of a note in the Memory Profile."""
CELL = 10
"""The least width of a column of figures."""

RowKey = tuple[int, ...]
Column = tuple[str, list[str], bool]
"""A column of the profile: its heading, a cell per row, and whether it is text (aligned left)
rather than a figure (aligned right)."""


def profile(run: Run) -> list[str]:
    """The Memory Profile section."""
    lines = ["## Memory Profile", ""]
    columns = side_by_side(run)
    if not any(c.run.samples for c in columns):
        return [*lines, "No checkpoint was recorded."]
    codes: dict[str | None, int] = {}
    matched = [_keys(c.run, codes) for c in columns]
    keys, names, notes = _rows(columns, matched)
    found = [_find(k, keys) for k in matched]
    del matched
    positions = [[where.get(k) for k in keys] for where in found]  # None: not on that run
    readings = [
        _readings(c, at, run.metric) for c, at in zip(columns, positions, strict=True)
    ]  # each run's readings side by side, then what fills each one's device
    figures = [own[0] for own in readings] + [fill for own in readings for fill in own[1:]]
    figures += [part for c, at in zip(columns, positions, strict=True) for part in _parts(c, at)]
    roles = [worker_roles(c.run) for c in columns]
    for c, at, own in zip(columns, positions, roles, strict=True):
        by_row = [["-"] * len(own) if i is None else memory_cells(c.run, i, own) for i in at]
        figures += [(c.head(role), [row[n] for row in by_row], False) for n, role in enumerate(own)]
    width = max(len(n) for n in names.values()) + 1
    widths = [max(CELL, len(head), *map(len, cells)) for head, cells, _ in figures]
    aligned = ["<" if left else ">" for _, _, left in figures]
    heads = [f"{h:{a}{w}}" for (h, _, _), a, w in zip(figures, aligned, widths, strict=True)]
    body = ["  ".join([f"{'checkpoint':<{width}}", *heads]).rstrip()]
    for row, key in enumerate(keys):
        name = names[key]
        line = "  ".join(
            [f"{name + ':':<{width}}"]
            + [f"{c[row]:{a}{w}}" for (_, c, _), a, w in zip(figures, aligned, widths, strict=True)]
        )
        if notes[key]:
            line += f"  ({'; '.join(plain(n, NOTE_CHARS) for n in notes[key])})"
        body.append(line.rstrip())
    lines.append(_caption(run, columns) + (f" {PROFILE_NOTE}" if any(roles) else ""))
    return [*lines, "", *fenced("text", body)]


def _readings(c: Shown, at: list[int | None], metric: str) -> list[Column]:
    """``c``'s readings in ``metric`` at positions ``at`` (``n/a`` where it has no such
    checkpoint), and what fills its device against the capacity where that is known (text,
    left-aligned, after the figure it starts with)."""
    view = c.run
    against, capacity = view.capacity_metric, view.capacity
    samples = [None if i is None else view.samples[i] for i in at]
    used = [None if s is None else as_int(s.get(against)) for s in samples]
    utilization = [
        f" / {format_mib(capacity)} ({100 * u / capacity:.1f}% utilization)"
        if u is not None and capacity
        else ""
        for u in used
    ]
    head = plain(metric, 40) if c.rank is None else f"rank {c.rank}"
    readings = [format_mib(None if s is None else view.reading(s)) for s in samples]
    filled = " / capacity" * bool(capacity)
    if against == metric:
        cells = [f"{r:>{CELL}}{u}" for r, u in zip(readings, utilization, strict=True)]
        return [(f"{head:>{CELL}}{filled}", cells, bool(capacity))]
    fills = [format_mib(u) + rest for u, rest in zip(used, utilization, strict=True)]
    return [(head, readings, False), (c.head(plain(against, 40)) + filled, fills, True)]


def _parts(c: Shown, at: list[int | None]) -> list[Column]:
    """A column for each place the run read beside its metric, where it has readings: the
    live heap's parts (``malloc``, Python objects, a library's pool), what no counter explains,
    the host beside a device (:mod:`harness._rules.measures`)."""
    view = c.run
    columns = []
    for metric in shown_parts(view.verdict.rules.metric, view.columns.metric_names):
        if not view.columns.present(metric).any():
            continue
        cells = ["-" if i is None else format_mib(as_int(view.samples[i].get(metric))) for i in at]
        columns.append((c.head(plain(part_name(metric), 40)), cells, False))
    return columns


def _caption(run: Run, columns: Sequence[Shown]) -> str:
    ranked = columns[0].rank is not None
    text = f"{code(run.metric)} at each named checkpoint" + ", one column per rank" * ranked
    if any(batch_runs(c.run) for c in columns):
        text += "; per-batch checkpoints: first, every Nth, highest and last of each loop"
        text += " on any rank" * ranked
    if run.capacity:
        text += (
            f"; utilization is {code(run.capacity_metric)} against the capacity "
            f"({format_mib(run.capacity)})"
        )
    if ranked:
        counts = ", ".join(f"rank {c.rank}: {len(c.run.samples)}" for c in columns)
        return f"{text}. Checkpoints in all: {counts}.{more(run)}"
    return f"{text}. {plural(len(run.samples), 'checkpoint')} in all."


def _rows(
    columns: Sequence[Shown], own: Sequence[tuple[np.ndarray, ...]]
) -> tuple[list[RowKey], dict[RowKey, str], dict[RowKey, list[str]]]:
    """The rows each column's own profile would show (``own``: its samples' keys), matched by
    checkpoint and in the order of the first column that has each, with their names and notes
    (a rank's named when there are several)."""
    order: dict[RowKey, tuple[int, int]] = {}
    names: dict[RowKey, str] = {}
    notes: dict[RowKey, list[str]] = {}
    for column, (c, keys) in enumerate(zip(columns, own, strict=True)):
        for name, i, found in profile_rows(c.run):
            key = tuple(int(k[i]) for k in keys)
            order.setdefault(key, (i, column))
            names.setdefault(key, name)
            notes.setdefault(key, [])
            for note in found:
                tagged = note if len(columns) == 1 else f"rank {c.rank}: {note}"
                if tagged not in notes[key]:
                    notes[key].append(tagged)
    return sorted(order, key=lambda k: order[k]), names, notes


def profile_rows(run: Run) -> list[tuple[str, int, list[str]]]:
    """(name, position, notes) for each row of the Memory Profile. An out-of-memory event
    seen by several samples (see :func:`~harness._report.run.oom_events`) is one row, at its
    first sample with a reading, with every sample's note."""
    ooms: dict[int, list[int]] = {}
    for event in oom_events(run):
        first = next((i for i in event if run.reading(run.samples[i]) is not None), event[0])
        ooms.update({i: [] for i in event})
        ooms[first] = event
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
    starts = key_starts(positions, c.label, c.phase, c.epoch, adjacent=True)
    return np.split(positions, starts[1:])


def nice_step(at_least: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 25, 50, 100, ... that is at least ``at_least``."""
    scale = 1
    while True:
        for base in (1, 2, 5, 10, 20, 25, 50):
            if base * scale >= at_least:
                return base * scale
        scale *= 100


def _keys(view: Run, codes: dict[str | None, int]) -> tuple[np.ndarray, ...]:
    """A key per sample that matches the same checkpoint on another rank, as columns: label
    and phase (as ``codes``, one table for every rank), epoch, batch and how many samples with
    those four came before."""
    c = view.columns
    table = np.array([codes.setdefault(t, len(codes)) for t in c.strings], dtype=np.int64)
    four = (table[c.label], table[c.phase], c.epoch, c.batch)
    order = np.lexsort(four[::-1])  # stable: positions ascending among equal keys
    starts = key_starts(order, *four)
    new = np.zeros(len(order), dtype=bool)
    new[starts] = True
    before = np.empty(len(order), dtype=np.int64)
    before[order] = np.arange(len(order)) - starts[np.cumsum(new) - 1]
    return (*four, before)


def _find(keys: tuple[np.ndarray, ...], wanted: Sequence[RowKey]) -> dict[Any, int]:
    """The position of each of ``wanted`` among the samples whose keys are ``keys`` (those
    it has): both sorted together, a wanted key just after the sample with the same key."""
    if not wanted:
        return {}
    n = len(keys[0])
    asked = np.array(wanted, dtype=np.int64).reshape(len(wanted), len(keys))
    both = [np.concatenate((k, asked[:, i])) for i, k in enumerate(keys)]
    mark = np.concatenate((np.zeros(n, dtype=np.int8), np.ones(len(wanted), dtype=np.int8)))
    order = np.lexsort((mark, *both[::-1]))
    at = np.flatnonzero(order >= n)
    before = order[at - 1]
    same = (at > 0) & (before < n)
    for column in both:
        same &= column[before] == column[order[at]]
    return {
        wanted[order[a] - n]: int(b)
        for a, b in zip(at[same].tolist(), before[same].tolist(), strict=True)
    }
