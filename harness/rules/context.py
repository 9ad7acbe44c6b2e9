"""What every rule reads: the samples, the rules, and one statistics pass per ``(phase, epoch)``.

A group's *series* is its most frequent per-batch label (events left out), ordered by batch,
in one metric: ``rules.metric`` if every sample of the series has it, else ``rss``. Its *fit*
(after ``warmup`` batches) and *peak* are computed once, here, and read by the rules.

The pass reads columns, not samples: labels and phases as codes, epochs, batches and each
metric as numpy arrays (a :class:`~harness.store.SampleStore`'s own columns, or columns built
once from a list), so a million checkpoints cost a few numpy passes and one trend per group.
Positions (:class:`Positions`) are numpy-backed sequences of ints. ``ctx.samples`` is what
was given: a store builds each :class:`Sample` when it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple, overload

import numpy as np

import harness.labels as labels
import harness.sample as schema
from harness.sample import Sample
from harness.stats import Trend, edge_window, robust_delta, trend
from harness.store import NONE, SampleStore
from harness.units import format_size
from harness.verdict import Check, CheckStatus, Evidence, Rules

FALLBACK_METRIC = "rss"
Key = tuple[str | None, int | None]


class Peak(NamedTuple):
    """A group's highest reading: where (``at``, in ``metric``), and its ``rise`` above the
    reading of ``base`` at ``start``."""

    at: int
    metric: str
    start: int
    base: str
    value: int
    rise: int


@dataclass(frozen=True)
class Fit:
    """A series after warm-up: its trend, growth (the larger of slope x span and the robust
    delta), batch span and starting level (median of the first edge window)."""

    trend: Trend
    growth: float
    span: float
    baseline: float

    @classmethod
    def of(cls, x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> Fit | None:
        if len(x) < 2:
            return None
        xs = np.asarray(x, dtype=np.float64)
        ys = np.asarray(y, dtype=np.float64)
        t = trend(xs, ys)
        span = float(xs[-1] - xs[0])
        baseline = float(np.median(ys[: edge_window(len(ys))]))
        return cls(t, max(t.slope * span, robust_delta(ys)), span, baseline)


class Positions(Sequence[int]):
    """Sample positions kept as one int64 array, read as Python ints (a list's worth of
    them would cost 36 bytes each instead of 8)."""

    __slots__ = ("array",)

    def __init__(self, positions: Sequence[int] | np.ndarray = ()) -> None:
        self.array = np.asarray(positions, dtype=np.int64).reshape(-1)

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> Positions: ...
    def __getitem__(self, index: int | slice) -> int | Positions:
        if isinstance(index, slice):
            return Positions(self.array[index])
        return int(self.array[index])

    def __iter__(self) -> Iterator[int]:
        return iter(self.array.tolist())

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
    """One ``(phase, epoch)`` with per-batch samples: positions of all its samples, its series,
    the judged part of it (after warm-up), the metric, the fit and the peak."""

    key: Key
    indices: Sequence[int]
    label: str
    looped: Sequence[int]
    metric: str | None
    series: Sequence[int]
    judged: Sequence[int] = field(default_factory=Positions)
    start: int | None = None
    end: int | None = None
    fit: Fit | None = None
    peak: Peak | None = None

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

    ``samples`` may be a list or a :class:`~harness.store.SampleStore` (read in columns, its
    samples built only where a rule reads one)."""

    def __init__(self, samples: Sequence[Sample], rules: Rules) -> None:
        self.samples = samples
        self.rules = rules
        self.checks: list[Check] = []
        self.columns = Columns(samples)
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
        columns = self.columns
        codes = columns.label[looped]
        found, first, counts = np.unique(codes, return_index=True, return_counts=True)
        most = counts == counts.max()
        code = int(found[most][np.argmin(first[most])])  # the first seen among the most frequent
        label = columns.strings[code]
        assert label is not None
        series = looped[codes == code]
        metric = self._choose_metric(series)
        group = Group(key, Positions(indices), label, Positions(looped), metric, Positions())
        if metric is None:
            return group
        present = columns.present(metric)
        series = series[present[series]]
        batches = np.where(columns.batch[series] == NONE, 0, columns.batch[series])
        ordered = np.argsort(batches, kind="stable")
        series, batches = series[ordered], batches[ordered]
        group.series = Positions(series)
        if not len(series):
            return group
        judged = series[batches >= batches[0] + self.rules.warmup]
        group.judged = Positions(judged)
        readings = indices[present[indices]]
        group.start, group.end = int(readings[0]), int(readings[-1])
        group.fit = Fit.of(*self._floats(judged, metric))
        group.peak = self._peak(indices, group.start, metric)
        return group

    def _floats(self, positions: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """Batch indices (None as 0) and readings (absent as 0) at ``positions``, as floats."""
        batch = self.columns.batch[positions]
        values = self.columns.values(metric)[positions]
        return np.where(batch == NONE, 0, batch).astype(np.float64), values

    def _choose_metric(self, series: np.ndarray) -> str | None:
        """The rule's metric if every sample has it, else rss if every sample has it, else the
        one read most often (samples without it are then left out)."""
        candidates = list(dict.fromkeys((self.rules.metric, FALLBACK_METRIC)))
        counts = {m: int(self.columns.present(m)[series].sum()) for m in candidates}
        for m in candidates:
            if len(series) and counts[m] == len(series):
                return m
        best = max(candidates, key=lambda m: counts[m])
        return best if counts[best] else None

    def _peak(self, indices: np.ndarray, start: int, metric: str) -> Peak:
        """The group's highest reading and its rise above the reading at ``start``. A sample's
        ``peak`` (high-water mark since the previous checkpoint) is read against the metric it
        is the mark of: allocated on CUDA, rss on CPU. The first sample's own ``peak`` covers
        time before the phase and is not used. The rises are compared as floats over the
        whole group at once; the winner's is then computed exactly from its sample."""
        columns = self.columns
        first = self.samples[start]
        first_value = first.get(metric) or 0
        best = Peak(start, metric, start, metric, first_value, 0)
        after = indices[indices > start]
        if not len(after):
            return best
        rises = np.full(len(after), -np.inf)
        high = columns.present("peak")[after]
        peaks = columns.values("peak")[after]
        # the base each sample's peak is read against (see peak_base), and its level at start
        has_reserved = columns.present("reserved")[after]
        has_rss = columns.present(FALLBACK_METRIC)[after]
        for base, where_base in (
            ("allocated", has_reserved),
            (FALLBACK_METRIC, ~has_reserved & has_rss),
            (metric, ~has_reserved & ~has_rss),
        ):
            level = first.get(base)
            if level is not None:
                chosen = where_base & high
                rises[chosen] = peaks[chosen] - float(level)
        unset = np.isneginf(rises) & columns.present(metric)[after]
        rises[unset] = columns.values(metric)[after][unset] - float(first_value)
        top = int(np.argmax(rises))
        if not rises[top] > 0:
            return best
        i = int(after[top])
        s = self.samples[i]
        base = peak_base(s, metric)
        high_value, base_value = s.get("peak"), first.get(base)
        if high_value is not None and base_value is not None:
            return Peak(i, "peak", start, base, high_value, high_value - base_value)
        value = s.get(metric) or 0
        return Peak(i, metric, start, metric, value, value - first_value)

    # -- helpers for rules --------------------------------------------------------------------

    def values(self, positions: Sequence[int], metric: str) -> tuple[list[int], list[int]]:
        """Batch indices (None as 0) and readings of ``metric`` (absent as 0) at ``positions``,
        read from the columns."""
        at = np.asarray(positions, dtype=np.intp)
        batch = self.columns.batch[at]
        return np.where(batch == NONE, 0, batch).tolist(), self.columns.exact(at, metric)

    def value(self, i: int, metric: str) -> int:
        """The reading of ``metric`` at position ``i`` (0 when absent: callers check first)."""
        return self.samples[i].get(metric) or 0

    def pair_metric(self, a: int, b: int) -> str | None:
        """The first of the rule's metric and rss that both positions have."""
        for m in dict.fromkeys((self.rules.metric, FALLBACK_METRIC)):
            if self.samples[a].get(m) is not None and self.samples[b].get(m) is not None:
                return m
        return None

    def evidence(self, i: int, metric: str | None) -> Evidence:
        s = self.samples[i]
        value = s.get(metric) if metric else None
        return Evidence(i, s.label, s.phase, s.epoch, s.batch, metric, value, s.collected)


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


class Columns:
    """What the statistics pass and the report read of every sample, as arrays: one per field
    of :data:`~harness.sample.FIELDS`, read as an attribute by its name (a ``text`` field as
    codes into ``strings``; an ``int`` field as int64 with :data:`~harness.store.NONE` for None;
    ``float`` and ``bool`` fields as they are; a ``note`` field as ``{position: text}``, the
    ``note`` field as ``notes``), whether a sample is an OOM event, a failed check or a
    per-batch reading of a loop, and each metric's readings as floats with a mask of where it
    was read."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self._samples = samples
        self._store = samples if isinstance(samples, SampleStore) else None
        self._metrics: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        fields = schema.FIELDS if self._store is None else self._store.fields
        self._fields = {f.name: f for f in fields}
        self._arrays: dict[str, np.ndarray] = {}
        self.sparse: dict[str, dict[int, str]] = {}
        self.strings: list[str | None] = [None]
        if self._store is not None:
            self.strings = list(self._store.strings)
        index: dict[str | None, int] = {None: 0}

        def code(text: str | None) -> int:
            found = index.get(text)
            if found is None:
                found = index[text] = len(self.strings)
                self.strings.append(text)
            return found

        for f in self._fields.values():
            if f.kind == "float":
                continue  # read when asked for (see __getattr__)
            if self._store is not None:
                store = self._store
                if f.kind == "note":
                    self.sparse[f.name] = dict(store.sparse(f.name))
                elif f.kind == "text":
                    self._arrays[f.name] = store.codes(f.name)
                else:
                    self._arrays[f.name] = store.numbers(f.name)
                continue
            read = [getattr(s, f.name) for s in samples]
            if f.kind == "note":
                self.sparse[f.name] = {i: v for i, v in enumerate(read) if v is not None}
            elif f.kind == "text":
                self._arrays[f.name] = np.array([code(v) for v in read], dtype=np.intp)
            elif f.kind == "int":
                self._arrays[f.name] = _int_column(read)
            else:
                self._arrays[f.name] = np.array(read, dtype=bool).reshape(-1)
        self.notes = self.sparse["note"]
        self.oom = self._labelled(labels.is_oom, self.notes)
        self.check_failed = self._labelled(labels.is_check_failed, self.notes)
        self.looped = (self.batch != NONE) & ~(self.oom | self.check_failed)

    def __getattr__(self, name: str) -> np.ndarray:
        """The array of field ``name``; a ``float`` field (``time``) is read on first use."""
        arrays = self.__dict__.get("_arrays")
        if arrays is None:
            raise AttributeError(name)
        found = arrays.get(name)
        if found is None:
            f = self.__dict__["_fields"].get(name)
            if f is None or f.kind != "float":
                raise AttributeError(name)
            if self._store is not None:
                found = self._store.numbers(name)
            else:
                read = [getattr(s, name) for s in self._samples]
                floats = [v if isinstance(v, (int, float)) else np.nan for v in read]
                found = np.array(floats, dtype=np.float64).reshape(-1)
            arrays[name] = found
        return found

    def _labelled(
        self, predicate: Callable[[labels.Labelled], bool], notes: dict[int, str]
    ) -> np.ndarray:
        """Where ``predicate`` holds: judged once per distinct label, then once per note."""
        found = self.labelled(lambda text: predicate(_Labelled(text, None, None)))
        for i, note in notes.items():
            text = self.strings[self.label[i]]
            if text is not None and predicate(_Labelled(text, None, note)):
                found[i] = True
        return found

    def labelled(self, predicate: Callable[[str], bool]) -> np.ndarray:
        """Where the label satisfies ``predicate`` (judged once per distinct label)."""
        by_label = np.array([text is not None and predicate(text) for text in self.strings])
        return by_label[self.label]

    def where_label(self, predicate: Callable[[str], bool]) -> np.ndarray:
        """Positions whose label satisfies ``predicate``."""
        return np.flatnonzero(self.labelled(predicate))

    def key(self, i: int) -> Key:
        """The ``(phase, epoch)`` of position ``i``."""
        epoch = int(self.epoch[i])
        return self.strings[self.phase[i]], None if epoch == NONE else epoch

    def distinct_labels(self) -> set[str | None]:
        return {self.strings[code] for code in np.unique(self.label).tolist()}

    def _column(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        found = self._metrics.get(metric)
        if found is None:
            if self._store is not None:
                stored = self._store.metric(metric)
                if stored is None:  # zeroed pages: no memory until written
                    present = np.zeros(len(self.batch), dtype=bool)
                    values = np.zeros(len(self.batch), dtype=np.float64)
                else:
                    present = stored != NONE
                    stored[~present] = 0
                    values = stored.astype(np.float64)
                    del stored
            else:
                read = [s.get(metric) for s in self._samples]
                present = np.array([v is not None for v in read], dtype=bool).reshape(-1)
                values = np.array([v or 0 for v in read], dtype=np.float64).reshape(-1)
            found = self._metrics[metric] = (values, present)
        return found

    def exact(self, positions: np.ndarray, metric: str) -> list[int]:
        """Readings of ``metric`` at ``positions`` as they were taken (0 where absent)."""
        if self._store is None:
            return [self._samples[i].get(metric) or 0 for i in positions.tolist()]
        stored = self._store.metric(metric)
        if stored is None:
            return [0] * len(positions)
        found = stored[positions]
        return np.where(found == NONE, 0, found).tolist()

    def values(self, metric: str) -> np.ndarray:
        """Readings of ``metric`` as floats, 0 where absent."""
        return self._column(metric)[0]

    def present(self, metric: str) -> np.ndarray:
        """Where ``metric`` was read."""
        return self._column(metric)[1]


class _Labelled(NamedTuple):
    label: str
    batch: int | None
    note: str | None


def _int_column(values: list[int | None]) -> np.ndarray:
    return np.array([NONE if v is None else v for v in values], dtype=np.int64).reshape(-1)
