"""What a report is built from (:class:`Run`) and the facts about a run that every section
reads: how many epochs it completed, whether it reached its end, where it ran out of memory and
how a checkpoint is named. Nothing here writes markdown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

import harness._core.labels as labels
from harness._core.markdown import plain
from harness._core.records import HolderRecord
from harness._measure.sample import Sample
from harness._rules.per_run import group_ooms
from harness._rules.sample_columns import Columns
from harness._timeline.store import NONE
from harness._verdict.model import Kind, Verdict

SHOWN_FALLBACK = "rss"
NAME_CHARS = 120
"""Characters kept of a checkpoint's or a phase's name in the report."""


@dataclass(frozen=True)
class Run:
    """Everything a report is built from.

    ``header`` is the timeline header (``config``, ``meta``, device, capacity, versions);
    ``holders`` the attribution of held memory (dicts with ``path``, ``container``, ``items``,
    ``bytes``, ``phase``, ``sites``, any of them missing); ``torn`` the torn lines skipped when
    the timeline was read back; ``timeline`` and ``verdict_file`` the paths of those files
    relative to the report, for its Logs section.
    """

    name: str
    header: Mapping[str, Any]
    samples: Sequence[Sample]
    verdict: Verdict
    title: str | None = None
    holders: Sequence[HolderRecord] = ()
    torn: int = 0
    timeline: str | None = None
    verdict_file: str | None = None

    @property
    def config(self) -> Mapping[str, Any]:
        """The header's ``config`` (the run's settings), empty when absent."""
        return as_mapping(self.header.get("config"))

    @property
    def meta(self) -> Mapping[str, Any]:
        """The header's ``meta`` (anything else about the run), empty when absent."""
        return as_mapping(self.header.get("meta"))

    @property
    def capacity(self) -> int | None:
        """The device's bytes (emulated or real) from the header, if known."""
        return as_int(self.header.get("capacity"))

    @cached_property
    def columns(self) -> Columns:
        """The samples as arrays, read once for every section."""
        return Columns(self.samples)

    @cached_property
    def metric(self) -> str:
        """The metric the profile and chart show: the rules' metric where samples have it,
        else ``rss``, else the probe's primary metric."""
        for m in (self.verdict.rules.metric, SHOWN_FALLBACK):
            if self.columns.present(m).any():
                return m
        primary = self.header.get("primary")
        return primary if isinstance(primary, str) and primary else self.verdict.rules.metric

    @cached_property
    def capacity_metric(self) -> str:
        """The metric that fills the device, as the header says (its probe's
        ``capacity_metric``: what an emulated capacity counts), where samples have it; else
        :attr:`metric`. For a header written before it kept one, the samples tell: ``reserved``
        where they have it (a caching allocator's), else ``rss``."""
        metric = self.header.get("capacity_metric")
        if not isinstance(metric, str):
            metric = "reserved" if self.columns.present("reserved").any() else "rss"
        return metric if self.columns.present(metric).any() else self.metric

    def reading(self, sample: Sample) -> int | None:
        """``sample``'s bytes in :attr:`metric`."""
        return as_int(sample.get(self.metric))

    def readings(self, metric: str) -> np.ndarray:
        """Every sample's bytes in ``metric`` (float64), NaN where it was not read."""
        return np.where(self.columns.present(metric), self.columns.values(metric), np.nan)

    def times(self) -> np.ndarray:
        """The samples' finite times, in timeline order."""
        times = self.columns.time
        return times[np.isfinite(times)]


def epochs(run: Run) -> tuple[int, int | None]:
    """Epochs completed (distinct epochs with an ``EPOCH_END``) and planned (``config.epochs``)."""
    ends = run.columns.labelled(lambda label: label == "EPOCH_END")
    return len(np.unique(run.columns.epoch[ends])), as_int(run.config.get("epochs"))


def ended(run: Run) -> bool | None:
    """Whether the run reached its end checkpoint; ``None`` when it has no start one either."""
    seen = [label for label in run.columns.distinct_labels() if label]
    if any(map(labels.is_run_end, seen)):
        return True
    return False if any(map(labels.is_run_start, seen)) else None


def unbatched(run: Run) -> list[int]:
    """Positions of the samples that are not per-batch readings (phase events, OOMs)."""
    return np.flatnonzero(run.columns.batch == NONE).tolist()


def batch_positions(run: Run) -> np.ndarray:
    """Positions of the per-batch samples, the OOM reports left out (a reading over the
    capacity is a batch's)."""
    reports = run.columns.labelled(labels.reports_oom)
    return np.flatnonzero((run.columns.batch != NONE) & ~reports)


def key_starts(positions: np.ndarray, *keys: np.ndarray, adjacent: bool = False) -> np.ndarray:
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


def oom_positions(run: Run) -> set[int]:
    """Positions of the samples where the run ran out of memory: its OOM events, and the OOM
    findings' evidence (when it points at this timeline)."""
    positions = set(np.flatnonzero(run.columns.oom).tolist())
    for finding in run.verdict.of_kind(Kind.OOM):
        for e in finding.evidence:
            if 0 <= e.index < len(run.samples) and run.samples[e.index].label == e.label:
                positions.add(e.index)
    return positions


def oom_events(run: Run) -> list[list[int]]:
    """The run's out-of-memory events, in timeline order, each the positions of its samples,
    grouped as the oom rule groups them."""
    return group_ooms(run.samples, sorted(oom_positions(run)))


def checkpoint_name(sample: Sample) -> str:
    """``Epoch 0 VALIDATION_BATCH #12``, ``SESSION_START``; an OOM event names its phase."""
    if labels.reports_oom(sample.label) and sample.phase:
        phase = sample.phase
        text = str(phase) if sample.batch is None else f"{phase} batch {sample.batch}"
    else:
        text = sample.label if sample.batch is None else f"{sample.label} #{sample.batch}"
    return text if sample.epoch is None else f"Epoch {sample.epoch} {text}"


def describe(value: Any, limit: int = 80) -> str:
    """A header value for a person, on one line (not escaped): text as is (up to
    :data:`~harness._core.markdown.LIMIT` characters), a list of texts joined by commas and others
    as compact JSON (up to ``limit``), ``n/a`` for None."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return plain(value) or "n/a"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return plain(", ".join(plain(v, limit) for v in value[:limit]), limit)
    try:
        text = json.dumps(value, default=str, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value))
    return plain(text, limit)


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_int(value: Any) -> int | None:
    """``value`` as an int when it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def turns(run: Run) -> dict[int, str]:
    """Where the growth of a loop with a leak or cache finding started and stopped: the
    position of the loop's last reading at or before that batch, and its note (``leak from
    batch 400``, ``flat from batch 31 (bounded cache)``)."""
    named: dict[tuple[str | None, int | None], Kind] = {
        (f.phase, f.epoch): f.kind
        for f in run.verdict.findings
        if f.kind in (Kind.LEAK, Kind.CACHE)
    }
    c = run.columns
    present = c.present(run.metric)
    found: dict[int, str] = {}
    for stats in run.verdict.phases:
        kind = named.get((stats.phase, stats.epoch))
        if kind is None or stats.metric != run.metric:
            continue
        marks = [(stats.onset, f"{kind} from batch {{}}")]
        if kind == Kind.CACHE:
            marks.append((stats.stopped, "flat from batch {} (bounded cache)"))
        loop = np.flatnonzero(
            (c.batch != NONE)
            & (c.phase == c.strings.index(stats.phase))
            & (c.epoch == (NONE if stats.epoch is None else stats.epoch))
            & (c.label == c.strings.index(stats.label))
        )
        batches = c.batch[loop]
        in_order = bool((batches[1:] > batches[:-1]).all())
        for at, note in marks:
            if at is None or not len(loop):
                continue
            k = int(np.searchsorted(batches, at)) if in_order else round(at)
            read = np.flatnonzero(present[loop[: min(k, len(loop) - 1) + 1]])
            if len(read):
                found[int(loop[read[-1]])] = note.format(f"{at:.0f}")
    return found
