"""A distributed run in the report: a :class:`MergedRun` is the :class:`~harness._report.run.Run`
of the whole run (the merged verdict, rank 0's header and samples) plus every rank's own part
(:class:`RankRun`). :func:`side_by_side` gives the memory sections their columns, one per rank (a
single run is a list of one); Configuration names the rank, world size and backend of any run
whose header has them (:func:`rank_rows`), and Logs lists every rank's timeline
(:func:`rank_logs`). Nothing here writes a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness._core.markdown import Markdown, code, link_to, strong, text
from harness._core.records import HolderRecord
from harness._core.wording import plural
from harness._measure.sample import Sample
from harness._report.run import Run, as_int
from harness._verdict.model import Verdict

if TYPE_CHECKING:
    from harness._attribution.findings import Share

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


@dataclass(frozen=True)
class Shown:
    """One column of the memory sections: a whole run (``rank`` None) or one rank of a merged
    run, as a run of its own."""

    rank: int | None
    run: Run

    def head(self, name: str) -> str:
        """A column's heading: ``name`` for a whole run, ``r1 name`` for rank 1."""
        return name if self.rank is None else f"r{self.rank} {name}"


def side_by_side(run: Run) -> list[Shown]:
    """What the memory sections show side by side: each rank of a merged run (the first
    :data:`MAX_COLUMNS`), else the run itself, a list of one."""
    ranks = ranks_of(run)
    if not ranks:
        return [Shown(None, run)]
    return [Shown(r.rank, r.view(run.name)) for r in ranks[:MAX_COLUMNS]]


def more(run: Run) -> str:
    """`` Ranks 8 and up (2 more) are left out here.`` where a merged run has more ranks than
    columns; else nothing."""
    hidden = len(ranks_of(run)) - MAX_COLUMNS
    return f" Ranks {MAX_COLUMNS} and up ({hidden} more) are left out here." if hidden > 0 else ""


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


__all__ = [
    "MAX_COLUMNS",
    "MergedRun",
    "RankRun",
    "Shown",
    "more",
    "rank_logs",
    "rank_rows",
    "ranks_of",
    "side_by_side",
]
