"""A run appended to a history, and the creep gate over what the history then holds.

Both front ends append the same way (:func:`record`): ``pytest --memreport-history`` each
test's verdict, ``leakgate gate --history`` each gated verdict. :func:`creep_lines` judges
each appended row's series on its own machine fingerprint, never across fingerprints.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness._core.errors import BadInput
from harness._core.markdown import plain
from harness._core.units import format_size
from harness._core.wording import plural
from harness._history.archive import History, HistoryPlace, HistoryRow, append, open_history
from harness._history.creep import (
    MIN_POINTS,
    MIN_RUNS,
    Creep,
    CreepLimit,
    by_commit,
    creep,
    point_text,
)
from harness._history.series import VALUES, Selection, read_series


def record(
    given: str | os.PathLike[str], summaries: Sequence[Mapping[str, Any]], source: str
) -> tuple[History, list[HistoryRow]]:
    """Append one run, a row per verdict's :func:`~harness._history.archive.history_summary`, to the
    history at ``given`` (made when new); the history and the rows appended."""
    history = open_history(given, mode="append")
    rows = HistoryPlace.here().rows(summaries, source)
    append(history, rows)
    return history, rows


def append_session(given: str, summaries: Sequence[Mapping[str, Any]]) -> str:
    """A pytest session's tests appended as one run; the line that says so, or that says why
    the history was not written (the verdicts stand either way)."""
    try:
        _, rows = record(given, summaries, "pytest")
    except (BadInput, OSError) as exc:
        return f"leakgate warning: history not appended ({exc})"
    return f"leakgate history: appended {plural(len(rows), 'test')} to {given}"


@dataclass(frozen=True)
class CreepReport:
    """What the creep gate found: ``crept`` (a problem line each), ``notes`` (too little
    history to decide)."""

    crept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def creep_lines(
    history: History, rows: Sequence[HistoryRow], limit: CreepLimit, *, min_bytes: float
) -> CreepReport:
    """Each row's series (its test, fingerprint and metric, its last ``limit.runs`` runs, the
    row's own among them) judged by :func:`~harness._history.creep.creep`, peak and growth."""
    report = CreepReport()
    for fingerprint, metric in sorted({(r.fingerprint, r.metric) for r in rows}, key=str):
        mine = {r.test: r for r in rows if (r.fingerprint, r.metric) == (fingerprint, metric)}
        chosen = Selection(metric=metric, fingerprint=fingerprint, tests=frozenset(mine))
        for series in read_series(history, chosen, window=limit.runs):
            row = mine.get(series.test)
            if row is None or series.metric != metric:
                continue
            points = {n: by_commit(series.commits, series.values(n), series.times) for n in VALUES}
            answers = {n: creep(c, limit, min_bytes=min_bytes) for n, c in points.items()}
            test = plain(series.test)
            if all(a.crept is None for a in answers.values()):
                why = _too_little(answers.values())
                report.notes.append(f"creep: {test}: {why}: nothing decided")
            for name, answer in answers.items():
                if answer.crept:
                    held = f"now {row.holder}" if row.holder else "no holder named now"
                    since = point_text(answer.since, answer.since_time, 10)
                    report.crept.append(
                        f"creep: {test} {name} {_moved(answer.first, answer.last)} over the "
                        f"last {answer.runs} runs ({points[name].kinds()}; trend "
                        f"{format_size(answer.rise, signed=True)}, p={answer.p:.2g}), more "
                        f"than {limit}, since {since}; {held}"
                    )
    return report


def _moved(first: float, last: float) -> str:
    """``100.0MiB -> 180.2MiB (+80.2%)``: a window's first and last commits' values."""
    share = f" ({(last - first) / abs(first):+.1%})" if first else ""
    return f"{format_size(first)} -> {format_size(last)}{share}"


def _too_little(answers: Iterable[Creep]) -> str:
    """Why a series decides nothing: too few runs, or runs on too few commits."""
    runs, points = max((a.runs, a.commits) for a in answers)
    if runs < MIN_RUNS:
        return f"not enough history ({runs} comparable runs, {MIN_RUNS} needed)"
    return (
        f"not enough history ({runs} comparable runs on {plural(points, 'commit')}; a trend "
        f"needs {MIN_POINTS})"
    )
