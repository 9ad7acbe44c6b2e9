"""A history read as series: one per test, machine fingerprint and metric, in run order.

Reading stays bounded whatever the history's length: columns are read a batch at a time as
parquet keeps them (strings as dictionaries, mapped to small integers once per batch, not per
row), and only the last ``window`` runs of each series are kept (older ones are dropped each
time :data:`COMPACT` rows have gathered).
"""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from harness._core.errors import BadInput
from harness._history.archive import History, scan

COMPACT = 1 << 18
"""Rows gathered (beyond those kept) before the runs beyond each series' window are dropped."""
VALUES = ("peak", "growth")


class SeriesNames:
    """Strings as small integers, assigned as they are first met. Each file brings its own
    dictionary: mostly the one before it again (its integers are kept for that), or a few
    values (a run's commit: looked up one by one)."""

    FEW = 64

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.last: tuple[pa.Array, np.ndarray] | None = None

    def ids(self, column: pa.Array) -> np.ndarray:
        """Each value's integer (-1 for a null), from a dictionary column."""
        if not isinstance(column, pa.DictionaryArray):
            column = column.dictionary_encode()
        values = column.dictionary
        if values.type != pa.string():
            values = values.cast(pa.string())
        if self.last is not None and self.last[0].equals(values):
            table = self.last[1]
        else:
            table = self._table(values)
            self.last = values, table
        indices = _numbers(column.indices, -1)
        if not len(table):
            return np.full(len(indices), -1, np.int32)
        return np.where(indices >= 0, table[np.maximum(indices, 0)], -1).astype(np.int32)

    def _table(self, values: pa.Array) -> np.ndarray:
        if len(values) > self.FEW:
            known = pa.array(self.names, pa.string())
            found = pc.index_in(values, value_set=known).fill_null(-1).to_numpy(False)
            new = (found < 0) & pc.is_valid(values).to_numpy(zero_copy_only=False)
            if not new.any():
                return found.astype(np.int32)
        table = np.full(len(values), -1, np.int32)
        for i, name in enumerate(values.to_pylist()):
            if name is not None:
                table[i] = self.index.setdefault(name, len(self.index))
                if table[i] == len(self.names):
                    self.names.append(name)
        return table


@dataclass(frozen=True)
class HistorySeries:
    """One test's runs on one machine for one metric, oldest first: each run's commit, time
    (microseconds since the epoch), peak and growth (NaN where unknown)."""

    test: str
    fingerprint: str
    metric: str | None
    commits: list[str | None]
    times: np.ndarray
    peak: np.ndarray
    growth: np.ndarray

    def values(self, name: str) -> np.ndarray:
        return self.peak if name == "peak" else self.growth


@dataclass(frozen=True)
class Selection:
    """Which rows a reading takes: tests matching ``test`` (a glob; a plain text matches as a
    part of the id), runs since ``since`` (microseconds), one ``metric``, one ``fingerprint``
    and, when given, only the ``tests`` named."""

    test: str | None = None
    since: int | None = None
    metric: str | None = None
    fingerprint: str | None = None
    tests: frozenset[str] | None = None

    def where(self) -> ds.Expression | None:
        parts = []
        if self.since is not None:
            at = datetime.datetime.fromtimestamp(self.since / 1e6, datetime.UTC)
            parts.append(ds.field("time") >= pa.scalar(at, pa.timestamp("us", tz="UTC")))
        if self.metric is not None:
            parts.append(ds.field("metric") == self.metric)
        if self.fingerprint is not None:
            parts.append(ds.field("fingerprint") == self.fingerprint)
        if not parts:
            return None
        found = parts[0]
        for part in parts[1:]:
            found &= part
        return found

    def matcher(self) -> re.Pattern[str] | None:
        if self.test is None:
            return None
        glob = self.test if any(c in self.test for c in "*?[") else f"*{self.test}*"
        return re.compile(fnmatch.translate(glob))


COLUMNS = ("test", "fingerprint", "metric", "commit", "time", *VALUES)


def read_series(history: History, selection: Selection, *, window: int) -> list[HistorySeries]:
    """The history's series that ``selection`` takes, each its last ``window`` runs. Where it
    names its ``tests``, one ``fingerprint`` and one ``metric`` (the gate's reading), the
    newest runs are read first, and no further once each test has its ``window``."""
    names = {c: SeriesNames() for c in ("test", "fingerprint", "metric", "commit")}
    kept = _Kept(window)
    taken = _Taken(selection)
    one_each = None not in (selection.tests, selection.fingerprint, selection.metric)
    counts = np.zeros(0, np.int64)
    for batch in scan(history, COLUMNS, selection.where(), newest_first=one_each):
        tests = names["test"].ids(batch.column("test"))
        keep = taken(tests, names["test"].names)
        if not keep.all():
            batch, tests = batch.filter(pa.array(keep)), tests[keep]
        if not len(tests):
            continue
        ids = [names[c].ids(batch.column(c)) for c in ("fingerprint", "metric", "commit")]
        times = pc.cast(batch.column("time"), pa.int64()).to_numpy(zero_copy_only=False)
        values = [_floats(batch.column(v)) for v in VALUES]
        kept.add(tests, *ids, times, *values)
        if one_each and selection.tests is not None:
            counts = np.pad(counts, (0, len(taken.wanted) - len(counts)))
            counts += np.bincount(tests, minlength=len(counts))
            met = counts[taken.wanted]
            if len(met) == len(selection.tests) and met.min() >= window:
                break
    return list(kept.series(names))


class _Taken:
    """Which tests a selection takes, asked once for each test met."""

    def __init__(self, selection: Selection) -> None:
        self.matcher = selection.matcher()
        self.named = selection.tests
        self.wanted = np.zeros(0, bool)

    def __call__(self, tests: np.ndarray, known: list[str]) -> np.ndarray:
        if self.matcher is None and self.named is None:
            return np.ones(len(tests), bool)
        if len(self.wanted) < len(known):
            more = [self._takes(name) for name in known[len(self.wanted) :]]
            self.wanted = np.concatenate([self.wanted, np.array(more, bool)])
        taken = np.zeros(len(tests), bool)
        named = tests >= 0
        taken[named] = self.wanted[tests[named]]
        return taken

    def _takes(self, name: str) -> bool:
        matched = self.matcher is None or self.matcher.match(name) is not None
        return matched and (self.named is None or name in self.named)


def _floats(column: pa.Array) -> np.ndarray:
    return _numbers(column, np.nan).astype(np.float64, copy=False)


def _numbers(column: pa.Array, missing: float) -> np.ndarray:
    """A column as numpy, ``missing`` for its nulls (filled only where there are some)."""
    if column.null_count:
        column = column.fill_null(missing)
    return column.to_numpy(zero_copy_only=False)


class _Kept:
    """Rows gathered in columns, each series cut to its last ``window`` runs now and then."""

    FIELDS = ("test", "fingerprint", "metric", "commit", "time", *VALUES)

    def __init__(self, window: int) -> None:
        self.window = window
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.rows = self.kept = 0

    def add(self, *columns: np.ndarray) -> None:
        self.chunks.append(columns)
        self.rows += len(columns[0])
        if self.rows >= COMPACT + self.kept:
            self.compact()

    def compact(self) -> tuple[np.ndarray, ...]:
        """The rows kept, sorted by series then time, only each series' last ``window``."""
        if not self.chunks:
            return tuple(np.array([]) for _ in self.FIELDS)
        cols = tuple(np.concatenate(c) for c in zip(*self.chunks, strict=True))
        order = np.lexsort((cols[4], cols[2], cols[1], cols[0]))
        cols = tuple(c[order] for c in cols)
        key = np.stack(cols[:3], axis=1)
        starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1)])
        ends = np.r_[starts[1:], len(key)]
        from_end = np.repeat(ends, ends - starts) - np.arange(len(key))
        keep = from_end <= self.window
        cols = tuple(c[keep] for c in cols)
        self.chunks, self.rows = [cols], len(cols[0])
        self.kept = self.rows
        return cols

    def series(self, names: dict[str, SeriesNames]) -> Iterator[HistorySeries]:
        test, fingerprint, metric, commit, time, peak, growth = self.compact()
        if not len(test):
            return
        key = np.stack([test, fingerprint, metric], axis=1)
        starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1)])
        for a, b in zip(starts, np.r_[starts[1:], len(test)], strict=True):
            if fingerprint[a] < 0:
                raise BadInput(f"a run of {names['test'].names[test[a]]} has no fingerprint")
            yield HistorySeries(
                names["test"].names[test[a]],
                names["fingerprint"].names[fingerprint[a]],
                names["metric"].names[metric[a]] if metric[a] >= 0 else None,
                [names["commit"].names[c] if c >= 0 else None for c in commit[a:b]],
                time[a:b],
                peak[a:b],
                growth[a:b],
            )
