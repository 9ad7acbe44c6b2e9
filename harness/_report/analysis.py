"""The Memory Analysis: one row per phase and epoch with the verdict's statistics, a set of
figures for each run shown (one per rank of a merged run), each worker role's judged growth and
the status, which names the ranks that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from harness._core.markdown import Markdown, plain, strong, table, text
from harness._core.units import echo_size, format_mib, format_rate, format_size
from harness._report.ranks import Shown, more, side_by_side
from harness._report.run import NAME_CHARS, Run, key_starts
from harness._report.workers import budget_note, growth_cells, sampling_note, worker_roles
from harness._rules.measures import part_name
from harness._timeline.store import NONE
from harness._verdict.model import CheckStatus, PhaseStats
from harness._verdict.options import Rules


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


FIGURES = (
    ("Start", "start"),
    ("End", "end"),
    ("Growth", "growth"),
    ("Peak rise", "peak"),
    ("Slope", "slope"),
)
"""The figures each run shown gets a column of; each rank of a merged run gets the last three."""
RANK_FIGURES = FIGURES[2:]


def analysis(run: Run) -> list[str]:
    """The Memory Analysis section."""
    lines = ["## Memory Analysis", ""]
    columns = side_by_side(run)
    ranked = columns[0].rank is not None
    per_column = [_by_scope(analysis_rows(c.run)) for c in columns]
    scopes = list(dict.fromkeys(s for rows in per_column for s in rows))
    if not scopes:
        return [*lines, "No phase has per-batch checkpoints to analyse."]
    figures = RANK_FIGURES if ranked else FIGURES
    roles = [worker_roles(c.run) for c in columns]
    header = ["Phase", "Metric", "Batches"]
    header += [f"{title} r{c.rank}" if ranked else title for c in columns for title, _ in figures]
    header += ["Budget", *(c.head(r) for c, own in zip(columns, roles, strict=True) for r in own)]
    header.append("Status")
    body: list[list[str]] = []
    for scope in scopes:
        rows = [by_scope.get(scope) for by_scope in per_column]
        present = [row for row in rows if row is not None]
        cells = [
            present[0].phase,
            " · ".join(dict.fromkeys(row.metric for row in present)),
            " · ".join(dict.fromkeys(row.batches for row in present)),
        ]
        for row in rows:
            cells += [getattr(row, f) if row else "n/a" for _, f in figures]
        cells.append(present[0].budget)
        for c, own in zip(columns, roles, strict=True):
            cells += growth_cells(c.run, present[0].phase, own)
        cells.append(_statuses(columns, rows))
        body.append(cells)
    lines += [_explained(run, ranked, any(roles)), "", *table(header, body)]
    return [*lines, "", more(run).strip()] if more(run) else lines


def _explained(run: Run, ranked: bool, workers: bool) -> str:
    said = (
        "Per phase and epoch, every figure in the row's metric: batches judged (after the "
        f"warm-up of {run.verdict.rules.warmup}) of those recorded; start and end readings; "
        "growth after the warm-up (the fitted level at the loop's last batch less at its first "
        "judged one, every batch weighed alike, read or not) and slope (per batch, after the "
        "growth's onset where it starts late); "
        "peak rise is the highest reading's rise above the start (the high-water mark where "
        "the probe has one, in the metric it marks, named when it is another one); budget is "
        "`max_growth`. Phases outside the rules' `phase` are shown unjudged."
    )
    if ranked:
        said += (
            " Each rank has its own columns (`r0` is rank 0) for growth, peak rise and slope; "
            "batches are one value when every rank has the same, and Status names the ranks "
            "that failed."
        )
    if workers:
        named = " (`r1 worker 0` for rank 1's)" if ranked else ""
        said += (
            f" A worker role's column{named} is its growth against {budget_note(run)}. "
            f"{sampling_note(run)}"
        )
    return said


def _by_scope(rows: list[AnalysisRow]) -> dict[tuple[str, int], AnalysisRow]:
    """``rows`` by their phase's name and how many rows of that name came before."""
    seen: dict[str, int] = {}
    keyed = {}
    for row in rows:
        n = seen[row.phase] = seen.get(row.phase, -1) + 1
        keyed[row.phase, n] = row
    return keyed


def _statuses(columns: Sequence[Shown], rows: Sequence[AnalysisRow | None]) -> str:
    """The row's status: a single run's own; for ranks ``PASS``, or the failing ones
    (``**FAIL** (rank 0)``)."""
    if columns[0].rank is None:
        return rows[0].status if rows[0] is not None else "n/a"
    found = [row.status.strip("*") if row is not None else "n/a" for row in rows]
    for worst in [s for s in reversed(CheckStatus) if s.rank >= CheckStatus.WARN.rank]:
        ranks = [str(c.rank) for c, s in zip(columns, found, strict=True) if s == worst]
        if ranks:
            return Markdown(f"{status(worst)} (rank {', '.join(ranks)})")
    return found[0] if len(set(found)) == 1 else " · ".join(found)


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
    starts = key_starts(order, c.phase, c.epoch)
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
    rows += [phase_row(p, run.verdict.rules) for p in judged.values()]
    for p in run.verdict.beside:  # the measures judged beside the rules' metric
        row = phase_row(p, run.verdict.rules)
        rows.append(row._replace(phase=f"{row.phase} · {part_name(p.metric or '')}"))
    return rows


def scope_label(phase: Any, epoch: Any) -> str:
    """``validation epoch 0``; ``(no phase)`` for samples outside any phase (not escaped)."""
    name = plain(phase, NAME_CHARS) if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {plain(epoch, 20)}"


def status(value: str) -> Markdown:
    """A check's or phase's status, in bold when it failed."""
    return strong(value) if value in (CheckStatus.FAIL, CheckStatus.ERROR) else text(value)
