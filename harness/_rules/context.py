"""What every rule reads: the samples, the rules, and one statistics pass per ``(phase, epoch)``.

A group's *series* is its most frequent per-batch label (events left out), ordered by batch,
in one metric: ``rules.metric`` if every sample of the series has it, else ``rss``. Its *fit*
(after ``warmup`` batches) and *peak* are computed once, here, and read by the rules.

The pass reads columns, not samples: labels and phases as codes, epochs, batches and each
metric as numpy arrays (a :class:`~harness._timeline.store.SampleStore`'s own columns, or columns
built once from a list), so a million checkpoints cost a few numpy passes and one trend per group.
Positions (:class:`Positions`) are numpy-backed sequences of ints. ``ctx.samples`` is what
was given: a store builds each :class:`Sample` when it is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple, overload

import numpy as np

from harness._core.units import format_size
from harness._measure.sample import STRIDE, Sample
from harness._rules.fit import Fit
from harness._rules.measures import Measure, parts_grown, primary
from harness._rules.sample_columns import Columns, Key
from harness._timeline.store import NONE
from harness._verdict.model import Check, CheckStatus, Evidence
from harness._verdict.options import Rules

FALLBACK_METRIC = "rss"


class Peak(NamedTuple):
    """A group's highest reading: where (``at``, in ``metric``), and its ``rise`` above the
    reading of ``base`` at ``start``."""

    at: int
    metric: str
    start: int
    base: str
    value: int
    rise: int


class Positions(Sequence[int]):
    """Sample positions kept as one int64 array, read as Python ints (a list's worth of
    them would cost 36 bytes each instead of 8)."""

    __slots__ = ("array",)

    def __init__(self, positions: Sequence[int] | np.ndarray = ()) -> None:
        self.array = np.asarray(positions, dtype=np.int64).reshape(-1)

    def __len__(self) -> int:
        return len(self.array)

    def __array__(
        self, dtype: np.typing.DTypeLike | None = None, copy: bool | None = None
    ) -> np.ndarray:
        """The positions to numpy as they are (never a Python int per position)."""
        found = self.array if dtype is None else self.array.astype(dtype, copy=False)
        return found.copy() if copy and found is self.array else found

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Positions: ...
    def __getitem__(self, index: int | slice) -> int | Positions:
        if isinstance(index, slice):
            return Positions(self.array[index])
        return int(self.array[index])

    def __iter__(self) -> Iterator[int]:
        for at in range(0, len(self.array), 4096):  # a block of Python ints at a time
            yield from self.array[at : at + 4096].tolist()

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and bool((self.array == value).any())

    def index(self, value: int, start: int = 0, stop: int | None = None) -> int:
        found = np.flatnonzero(self.array[start:stop] == value)
        if not len(found):
            raise ValueError(f"{value} is not in the positions")
        return start + int(found[0])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Positions):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (list, tuple)):
            return self.array.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Positions({self.array.tolist()!r})"


@dataclass
class Group:
    """One ``(phase, epoch)`` with per-batch samples: positions of all its samples, its series
    (the batches of its label where the metric was read, of ``batches``), the judged part of
    it (after warm-up), the metric, the fit and the peak. Where the label's batch numbers do not
    ascend (shuffled, or restarting with each of several loaders) the loop is fitted in the
    checkpoints' order."""

    key: Key
    indices: Sequence[int]
    label: str
    looped: Sequence[int]
    metric: str | None
    series: Sequence[int]
    judged: Sequence[int] = field(default_factory=Positions)
    batches: int = 0
    start: int | None = None
    end: int | None = None
    fit: Fit | None = None
    peak: Peak | None = None
    confirms: list[tuple[str, Fit]] = field(default_factory=list)
    """The loop fitted on each series that must confirm the measure's growth
    (:attr:`Measure.confirms`), by name."""

    @property
    def phase(self) -> str | None:
        return self.key[0]

    @property
    def epoch(self) -> int | None:
        return self.key[1]

    @property
    def scope(self) -> str:
        return scope(*self.key)


class CheckLog:
    """What a rule records its outcomes in: :meth:`check` appends to ``checks``."""

    checks: list[Check]

    def check(
        self,
        rule: str,
        scope: str,
        status: CheckStatus | str,
        details: str,
        measured: float | None = None,
        limit: int | None = None,
    ) -> Check:
        """Record one rule's outcome on one scope."""
        made = Check(rule, scope, CheckStatus(status), details, measured, limit)
        self.checks.append(made)
        return made


class Context(CheckLog):
    """The judged samples and rules, the groups' statistics, and the checks recorded so far.

    ``samples`` may be a list or a :class:`~harness._timeline.store.SampleStore` (read in columns,
    its samples built only where a rule reads one)."""

    def __init__(
        self,
        samples: Sequence[Sample],
        rules: Rules,
        *,
        columns: Columns | None = None,
        measure: Measure | None = None,
    ) -> None:
        self.samples = samples
        self.rules = rules
        self.measure = measure or primary(rules.metric)
        """What the rules judge here: the rules' metric, or a measure beside it, which has no
        fallback to rss."""
        self.beside = measure is not None
        self.checks: list[Check] = []
        self.columns = columns if columns is not None else Columns(samples)
        self.loop_positions = Positions(np.flatnonzero(self.columns.looped))
        self.groups = self._groups()

    def phases_seen(self) -> list[str]:
        """The phases that have per-batch samples, in timeline order."""
        return list(dict.fromkeys(str(g.phase) for g in self.groups if g.phase is not None))

    # -- the statistics pass ------------------------------------------------------------------

    def _groups(self) -> list[Group]:
        columns = self.columns
        n = len(columns.batch)
        if not n:
            return []
        phase, epoch = columns.phase, columns.epoch
        order = np.lexsort((epoch, phase))  # stable: positions ascending within a key
        keys_differ = (np.diff(phase[order]) != 0) | (np.diff(epoch[order]) != 0)
        bounds = np.concatenate(([0], np.flatnonzero(keys_differ) + 1, [n]))
        segments = [order[a:b] for a, b in pairwise(bounds)]
        segments.sort(key=lambda positions: int(positions[0]))  # in order of first appearance
        groups = []
        for indices in segments:
            looped = indices[columns.looped[indices]]
            if len(looped):
                first = int(indices[0])
                key = columns.key(first)
                groups.append(self._group(key, indices, looped))
        return groups

    def _group(self, key: Key, indices: np.ndarray, looped: np.ndarray) -> Group:
        """One group's statistics. ``indices`` ascend; every array taken from them is a view
        where it can be (a whole phase of one label is one series), so a phase of a million
        batches costs a few arrays of its length, not a dozen."""
        columns = self.columns
        codes = columns.label[looped]
        counts = np.bincount(codes)
        most = np.flatnonzero(counts == counts.max())
        # the first seen among the most frequent labels
        code = int(most[0]) if len(most) == 1 else int(codes[np.argmax(np.isin(codes, most))])
        label = columns.strings[code]
        assert label is not None
        series = looped if counts[code] == len(looped) else looped[codes == code]
        del codes
        metric = self._choose_metric(series)
        group = Group(key, Positions(indices), label, Positions(looped), metric, Positions())
        if metric is None:
            return group
        group.batches = len(series)
        batches = columns.batch[series]
        batches[batches == NONE] = 0
        # a loop is fitted by its batch numbers where they ascend, else in the checkpoints' order
        in_order = len(batches) < 2 or bool((batches[1:] > batches[:-1]).all())
        x = batches if in_order else np.arange(len(series))
        end = x[-1]  # the loop's last batch, read or not
        runs = np.arange(len(series))  # each batch's number in the loop, from 0
        present = columns.present(metric)
        if not present[series].all():
            read = present[series]
            series, x, runs = series[read], x[read], runs[read]
        group.series = Positions(series)
        if not len(series):
            return group
        cut = int(np.searchsorted(x, x[0] + self.rules.warmup))
        judged = series[cut:]  # x ascends: those after warm-up are a suffix
        group.judged = Positions(judged)
        read = present[indices]
        group.start = int(indices[np.argmax(read)])
        group.end = int(indices[len(read) - 1 - np.argmax(read[::-1])])
        del read
        x, runs = x[cut:], runs[cut:]
        group.fit = Fit.of(x, columns.values(metric)[judged], end=end, in_order=in_order, runs=runs)
        for series in self.measure.confirms:  # the same loop, in the series that confirm it
            first, *rest = (columns.values(m)[judged] for m in series)
            values = first - sum(rest) if rest else first
            fit = Fit.of(x, values, end=end, in_order=in_order, runs=runs)
            if fit is not None:
                group.confirms.append(("-".join(series), fit))
        del x, runs
        group.peak = self._peak(indices, group.start, metric)
        return group

    def _choose_metric(self, series: np.ndarray) -> str | None:
        """The rule's metric if every sample has it or it was read on a stride (see
        :func:`strided`), else rss if every sample has it, else the one read most often
        (samples without it are then left out: the fit is of what was read)."""
        counts: dict[str, int] = {}
        fallback = () if self.beside else (FALLBACK_METRIC,)
        for m in dict.fromkeys((self.rules.metric, *fallback)):
            read = self.columns.present(m)[series]
            counts[m] = int(np.count_nonzero(read))
            if len(series) and (
                counts[m] == len(series) or (m == self.rules.metric and strided(read))
            ):
                return m
        best = max(counts, key=lambda m: counts[m])
        return best if counts[best] else None

    _PEAK_BLOCK = 1 << 16
    """Samples whose rises :meth:`_peak` compares at a time."""

    def _peak(self, indices: np.ndarray, start: int, metric: str) -> Peak:
        """The group's highest reading and its rise above the reading at ``start``. A sample's
        ``peak`` (high-water mark since the previous checkpoint) is read against the metric it
        is the mark of: allocated on CUDA, rss on CPU. The first sample's own ``peak`` covers
        time before the phase and is not used. The rises are compared as floats, a block of
        samples at a time (the first highest wins); the winner's is then computed exactly from
        its sample."""
        first = self.samples[start]
        first_value = first.get(metric) or 0
        best = Peak(start, metric, start, metric, first_value, 0)
        after = indices[np.searchsorted(indices, start, side="right") :]
        levels = [first.get(base) for base in ("allocated", FALLBACK_METRIC, metric)]
        top, highest = -1, -np.inf
        for at in range(0, len(after), self._PEAK_BLOCK):
            block = after[at : at + self._PEAK_BLOCK]
            rises = self._rises(block, metric, levels, float(first_value))
            found = int(np.argmax(rises))
            if rises[found] > highest:
                top, highest = at + found, float(rises[found])
        if not highest > 0:
            return best
        i = int(after[top])
        s = self.samples[i]
        base = peak_base(s, metric)
        high_value, base_value = s.get("peak"), first.get(base)
        if high_value is not None and base_value is not None:
            return Peak(i, "peak", start, base, high_value, high_value - base_value)
        value = s.get(metric) or 0
        return Peak(i, metric, start, metric, value, value - first_value)

    def _rises(
        self, at: np.ndarray, metric: str, levels: list[int | None], first_value: float
    ) -> np.ndarray:
        """The rise of each sample at ``at`` (as floats; -inf where it has no reading): its
        ``peak`` above the level at the start of the base it is the mark of (``levels``: of
        allocated, rss and ``metric``, see :func:`peak_base`), else ``metric`` above
        ``first_value``."""
        columns = self.columns
        rises = np.full(len(at), -np.inf)
        high = columns.present("peak")[at]
        peaks = columns.values("peak")[at]
        has_reserved = columns.present("reserved")[at]
        has_rss = columns.present(FALLBACK_METRIC)[at]
        for level, where_base in zip(
            levels,
            (has_reserved, ~has_reserved & has_rss, ~has_reserved & ~has_rss),
            strict=True,
        ):
            if level is not None:
                chosen = where_base & high
                rises[chosen] = peaks[chosen] - float(level)
        unset = np.isneginf(rises) & columns.present(metric)[at]
        rises[unset] = columns.values(metric)[at][unset] - first_value
        return rises

    # -- helpers for rules --------------------------------------------------------------------

    def values(self, positions: Sequence[int], metric: str) -> tuple[np.ndarray, np.ndarray]:
        """Batch indices (None as 0) and readings of ``metric`` (absent as 0) at ``positions``,
        as floats (exact: memory sizes are far below 2**53)."""
        at = np.asarray(positions, dtype=np.intp)
        batch = self.columns.batch[at]
        batch[batch == NONE] = 0
        return batch.astype(np.float64), self.columns.values(metric)[at]

    def value(self, i: int, metric: str) -> int:
        """The reading of ``metric`` at position ``i`` (0 when absent: callers check first)."""
        return self.samples[i].get(metric) or 0

    def pair_metric(self, a: int, b: int) -> str | None:
        """The first of the rule's metric and rss (for the rules' own metric) that both
        positions have."""
        fallback = () if self.beside else (FALLBACK_METRIC,)
        for m in dict.fromkeys((self.rules.metric, *fallback)):
            if self.samples[a].get(m) is not None and self.samples[b].get(m) is not None:
                return m
        return None

    def parts(self, first: int, last: int) -> str:
        """``: Python objects +5.5MiB, malloc +1.5MiB``: what the judged measure's parts grew
        by between two positions (empty where it has no parts read at both)."""
        grown = parts_grown(self.measure, self.columns, first, last)
        return f": {grown}" if grown else ""

    def evidence(self, i: int, metric: str | None) -> Evidence:
        s = self.samples[i]
        value = s.get(metric) if metric else None
        return Evidence(i, s.label, s.phase, s.epoch, s.batch, metric, value, s.collected)


def strided(read: np.ndarray) -> bool:
    """Whether a series read where ``read`` holds was read on a stride: fewer than
    :data:`~harness._measure.sample.STRIDE`'s ``every`` samples in a row unread, anywhere."""
    gaps = np.diff(np.concatenate(([-1], np.flatnonzero(read), [len(read)])))
    return len(gaps) > 1 and int(gaps.max()) <= STRIDE.every


def peak_base(s: Sample, metric: str) -> str:
    """The metric whose high-water mark ``peak`` is: allocated on CUDA, rss on CPU."""
    if s.get("reserved") is not None:
        return "allocated"
    return FALLBACK_METRIC if s.get(FALLBACK_METRIC) is not None else metric


def scope(phase: str | None, epoch: int | None) -> str:
    name = phase if phase is not None else "(no phase)"
    return name if epoch is None else f"{name} epoch {epoch}"


def where(s: Sample) -> str:
    """``VALIDATION_BATCH epoch 0 batch 12``."""
    parts = [s.label]
    if s.epoch is not None:
        parts.append(f"epoch {s.epoch}")
    if s.batch is not None:
        parts.append(f"batch {s.batch}")
    return " ".join(parts)


def rate(slope: float) -> str:
    """Bytes per batch, in the largest binary unit that keeps the number >= 1."""
    return f"{format_size(slope, signed=True)}/batch"
