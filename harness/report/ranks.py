"""The report of a distributed run: one rank per column.

A :class:`MergedRun` is the :class:`~harness.report.run.Run` of the whole run (the merged
verdict, rank 0's header and samples) plus every rank's own part (:class:`RankRun`). The
Memory Profile, the chart and the Memory Analysis give each rank its own column (or line),
and each rank's DataLoader workers theirs (``r1 worker 0``);
Configuration names the rank, world size and backend of any run whose header has them, and
Logs lists every rank's timeline. Nothing here writes a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

import harness.report.memory as memory
from harness.core.markdown import Markdown, code, fenced, link_to, plain, strong, table, text
from harness.core.records import HolderRecord
from harness.core.units import format_mib
from harness.core.wording import plural
from harness.measure.sample import Sample
from harness.report.chart import as_floats, memory_chart
from harness.report.memory import (
    NAME_CHARS,
    NOTE_CHARS,
    AnalysisRow,
    analysis_rows,
    profile_rows,
    status,
)
from harness.report.run import Run, as_int, checkpoint_name
from harness.report.workers import (
    PROFILE_NOTE,
    budget_note,
    children_total,
    growth_cells,
    memory_cells,
    sampling_note,
    worker_roles,
)
from harness.verdict.model import CheckStatus, Verdict

if TYPE_CHECKING:
    from harness.attribution import Share

MAX_COLUMNS = 8
"""Ranks shown side by side in the tables; a larger run shows its first ones and says so."""


@dataclass(frozen=True)
class RankRun:
    """One rank of a distributed run, judged on its own: its timeline header and samples, its
    verdict, the holders named on it (and their shares of each finding, while the rank was
    alive), torn lines skipped, and its timeline's path relative to the report."""

    rank: int
    header: Mapping[str, Any]
    samples: Sequence[Sample]
    verdict: Verdict
    holders: Sequence[HolderRecord] = ()
    torn: int = 0
    timeline: str | None = None
    shares: tuple[Share, ...] = ()

    @property
    def run_id(self) -> str | None:
        value = self.header.get("run_id")
        return value if isinstance(value, str) else None

    def view(self, name: str) -> Run:
        """This rank as a run of its own, for the sections that read one."""
        return Run(
            name=name,
            header=self.header,
            samples=self.samples,
            verdict=self.verdict,
            holders=self.holders,
            torn=self.torn,
            timeline=self.timeline,
        )


@dataclass(frozen=True)
class MergedRun(Run):
    """A distributed run as one: ``verdict`` is the merged verdict, ``header`` and ``samples``
    are rank 0's (the header with the ranks' run ids), ``ranks`` every rank's part."""

    ranks: tuple[RankRun, ...] = ()


def ranks_of(run: Run) -> tuple[RankRun, ...]:
    """The ranks of a merged run; empty for any other run."""
    return run.ranks if isinstance(run, MergedRun) else ()


def profile(run: Run) -> list[str]:
    """The Memory Profile: one column per rank for a merged run, else the run's own."""
    return rank_profile(run) if isinstance(run, MergedRun) else memory.single_profile(run)


def chart(run: Run) -> list[str]:
    """The chart of the run: one line per rank for a merged run, else the run's own."""
    return rank_chart(run) if isinstance(run, MergedRun) else memory.single_chart(run)


def analysis(run: Run) -> list[str]:
    """The Memory Analysis: one column per rank for a merged run, else the run's own."""
    return rank_analysis(run) if isinstance(run, MergedRun) else memory.single_analysis(run)


def rank_rows(run: Run) -> list[tuple[str, str]]:
    """Configuration rows: ``Ranks`` for a merged run (world size, backend, each rank's status,
    run id and timeline), ``Rank`` for one rank's own report; none for a one-process run."""
    header = run.header
    backend = f"backend {text(header.get('backend') or 'n/a', 40)}"
    ranks = ranks_of(run)
    if ranks:
        parts = [
            f"rank {r.rank} {strong(r.verdict.status)} (run {text((r.run_id or 'n/a')[:12])}"
            + (f", {code(r.timeline)}" if r.timeline else "")
            + ")"
            for r in ranks
        ]
        size = as_int(header.get("world_size")) or len(ranks)
        return [("Ranks", Markdown(f"world size {size}, {backend}: {'; '.join(parts)}"))]
    rank, world = as_int(header.get("rank")), as_int(header.get("world_size"))
    if rank is None or world is None:
        return []
    return [("Rank", Markdown(f"{rank} of world size {world}, {backend}"))]


def rank_profile(run: MergedRun) -> list[str]:
    """The Memory Profile with one column per rank: the checkpoints each rank's own profile
    would show, matched across ranks by label, phase, epoch and batch."""
    lines = ["## Memory Profile", ""]
    shown = run.ranks[:MAX_COLUMNS]
    views = [r.view(run.name) for r in shown]
    if not any(v.samples for v in views):
        return [*lines, "No checkpoint was recorded."]
    order: dict[tuple[Any, ...], tuple[int, int]] = {}
    notes: dict[tuple[Any, ...], list[str]] = {}
    codes: dict[str | None, int] = {}
    keys = [_keys(view, codes) for view in views]
    for column, view in enumerate(views):
        for _, i, found in profile_rows(view):
            key = tuple(int(k[i]) for k in keys[column])
            order.setdefault(key, (i, column))
            for note in found:
                tagged = note if len(views) == 1 else f"rank {shown[column].rank}: {note}"
                if tagged not in notes.setdefault(key, []):
                    notes[key].append(tagged)
    rows = sorted(order, key=lambda k: order[k])
    positions = [_find(own, rows) for own in keys]
    del keys
    names = {k: plain(checkpoint_name(_sample_at(views, positions, k)), NAME_CHARS) for k in rows}
    width = max(len(n) for n in names.values()) + 1
    roles = [worker_roles(view) for view in views]
    heads = [f"rank {r.rank}" for r in shown]
    heads += [f"r{r.rank} {role}" for r, own in zip(shown, roles, strict=True) for role in own]
    cell = max(10, *(len(h) for h in heads))
    body = ["  ".join([f"{'checkpoint':<{width}}", *(f"{h:>{cell}}" for h in heads)])]
    for key in rows:
        cells = [f"{names[key] + ':':<{width}}"]
        for view, where in zip(views, positions, strict=True):
            at = where.get(key)
            reading = None if at is None else view.reading(view.samples[at])
            cells.append(f"{format_mib(reading):>{cell}}")
        for view, where, own in zip(views, positions, roles, strict=True):
            at = where.get(key)
            found = ["-"] * len(own) if at is None else memory_cells(view, at, own)
            cells += [f"{v:>{cell}}" for v in found]
        line = "  ".join(cells)
        if notes.get(key):
            line += f"  ({'; '.join(plain(n, NOTE_CHARS) for n in notes[key])})"
        body.append(line.rstrip())
    counts = ", ".join(f"rank {r.rank}: {len(r.samples)}" for r in shown)
    lines.append(
        f"{code(run.metric)} at each named checkpoint, one column per rank; per-batch "
        "checkpoints: first, every Nth, highest and last of each loop on any rank. Checkpoints "
        f"in all: {counts}.{_more(run)}" + (f" {PROFILE_NOTE}" if any(roles) else "")
    )
    return [*lines, "", *fenced("text", body)]


def rank_chart(run: MergedRun) -> list[str]:
    """The run's memory, one line per rank."""
    shown = run.ranks[:MAX_COLUMNS]
    series: dict[str, Any] = {
        f"rank {r.rank}": r.view(run.name).readings(run.metric) for r in shown
    }
    for r in shown:
        children = children_total(r.view(run.name))
        if children is not None:
            series[f"rank {r.rank} children"] = children
    block = memory_chart(series)
    if not block:
        return []
    drawn = [name for name, values in series.items() if not np.isnan(as_floats(values)).all()]
    caption = (
        f"MiB of {code(run.metric)} per checkpoint, one line per rank and one per rank's "
        "DataLoader workers' total `anon` where it had any (in order: "
        f"{', '.join(drawn)}); x is the checkpoint number on each rank"
    )
    return ["## Memory Over the Run", "", *block, "", f"{caption}.{_more(run)}"]


def rank_analysis(run: MergedRun) -> list[str]:
    """The Memory Analysis with growth, peak rise and slope in one column per rank, and the
    phase's status on every rank."""
    shown = run.ranks[:MAX_COLUMNS]
    lines = ["## Memory Analysis", ""]
    views = [r.view(run.name) for r in shown]
    per_rank = [{row.phase: row for row in analysis_rows(view)} for view in views]
    roles = [worker_roles(view) for view in views]
    scopes: list[str] = []
    for by_scope in per_rank:
        scopes += [s for s in by_scope if s not in scopes]
    if not scopes:
        return [*lines, "No phase has per-batch checkpoints to analyse."]
    header = ["Phase", "Metric", "Batches", "Budget"]
    for r in shown:
        header += [f"Growth r{r.rank}", f"Peak rise r{r.rank}", f"Slope r{r.rank}"]
    header += [f"r{r.rank} {role}" for r, own in zip(shown, roles, strict=True) for role in own]
    header.append("Status")
    body: list[list[str]] = []
    for where in scopes:
        rows = [by_scope.get(where) for by_scope in per_rank]
        present = [row for row in rows if row is not None]
        cells = [
            where,
            " · ".join(dict.fromkeys(row.metric for row in present)),
            " · ".join(dict.fromkeys(row.batches for row in present)),
            present[0].budget,
        ]
        for row in rows:
            cells += [row.growth, row.peak, row.slope] if row is not None else ["n/a"] * 3
        for view, own in zip(views, roles, strict=True):
            cells += growth_cells(view, where, own)
        cells.append(_statuses(shown, rows))
        body.append(cells)
    lines += [
        "Per phase and epoch, each rank in its own columns (`r0` is rank 0), in the row's "
        f"metric: growth and slope after the warm-up of {run.verdict.rules.warmup}, peak rise "
        "as the highest reading's rise above the start; batches judged of those recorded (one "
        "value when every rank has the same). Status names the ranks that failed."
        + (
            " A rank's worker role column (`r1 worker 0`) is its growth against "
            f"{budget_note(run)}. "
            f"{sampling_note(run)}"
            if any(roles)
            else ""
        ),
        "",
        *table(header, body),
    ]
    more = _more(run).strip()
    return [*lines, "", more] if more else lines


def rank_logs(run: Run) -> list[str]:
    """One Logs line per rank's timeline (none for a run that is not merged)."""
    lines = []
    for r in ranks_of(run):
        count = plural(len(r.samples), "checkpoint")
        if r.torn:
            count += f"; {r.torn} torn last line skipped"
        where = link_to(r.timeline, r.timeline) if r.timeline else "not written"
        lines.append(f"- Rank {r.rank} timeline (JSONL): {where} ({count})")
    return lines


def _keys(view: Run, codes: dict[str | None, int]) -> tuple[np.ndarray, ...]:
    """A key per sample that matches the same checkpoint on another rank, as columns: label
    and phase (as ``codes``, one table for every rank), epoch, batch and how many samples with
    those four came before."""
    c = view.columns
    table = np.array([codes.setdefault(t, len(codes)) for t in c.strings], dtype=np.int64)
    four = (table[c.label], table[c.phase], c.epoch, c.batch)
    order = np.lexsort(four[::-1])  # stable: positions ascending among equal keys
    new = np.zeros(len(order), dtype=bool)
    new[:1] = True
    for column in four:
        ordered = column[order]
        new[1:] |= ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(new)
    before = np.empty(len(order), dtype=np.int64)
    before[order] = np.arange(len(order)) - starts[np.cumsum(new) - 1]
    return (*four, before)


def _find(keys: tuple[np.ndarray, ...], wanted: Sequence[tuple[int, ...]]) -> dict[Any, int]:
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


def _sample_at(
    views: Sequence[Run], positions: Sequence[dict[tuple[Any, ...], int]], key: tuple[Any, ...]
) -> Sample:
    for view, where in zip(views, positions, strict=True):
        if key in where:
            return view.samples[where[key]]
    raise KeyError(key)


def _statuses(shown: Sequence[RankRun], rows: Sequence[AnalysisRow | None]) -> str:
    """``PASS``, or the failing ranks: ``**FAIL** (rank 0)``."""
    found = [row.status.strip("*") if row is not None else "n/a" for row in rows]
    for worst in [s for s in reversed(CheckStatus) if s.rank >= CheckStatus.WARN.rank]:
        ranks = [str(r.rank) for r, s in zip(shown, found, strict=True) if s == worst]
        if ranks:
            return Markdown(f"{status(worst)} (rank {', '.join(ranks)})")
    return found[0] if len(set(found)) == 1 else " · ".join(found)


def _more(run: MergedRun) -> str:
    hidden = len(run.ranks) - MAX_COLUMNS
    return f" Ranks {MAX_COLUMNS} and up ({hidden} more) are left out here." if hidden > 0 else ""


__all__ = [
    "MergedRun",
    "RankRun",
    "analysis",
    "chart",
    "profile",
    "rank_analysis",
    "rank_chart",
    "rank_logs",
    "rank_profile",
    "rank_rows",
    "ranks_of",
]
