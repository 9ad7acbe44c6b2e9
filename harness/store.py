"""A recorder's samples kept as columns of numbers: a few tens of bytes per checkpoint.

Labels and phases are interned (a table of distinct strings, an index per sample), numbers
live in ``array`` columns, notes in a sparse dict. The store reads as a sequence of
:class:`~harness.sample.Sample`, built on access (iteration builds them a chunk at a time), and
knows its own size (:meth:`nbytes`), so the recorder can leave its own storage out of
host-memory readings. Statistics read whole columns as numpy arrays (:meth:`codes`,
:meth:`numbers`, :meth:`metric`) instead of a million samples; a timeline is read straight
into a store (:meth:`extend_columns`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import overload

import numpy as np

from harness.sample import Sample

_NONE = -(2**63)
"""The integer column value that stands for None."""
NONE = _NONE
_EMPTY = sys.getsizeof(array("I"))
"""An empty column's size: the rest of a column's size is its capacity."""
_CHUNK = 4096
"""Samples built at a time while iterating."""
_new = object.__new__
_set = object.__setattr__


class SampleStore(Sequence[Sample]):
    """Samples in columns; ``append``, ``clear``, ``len``, indexing and slicing."""

    def __init__(self) -> None:
        self._strings: list[str | None] = [None]
        self._index: dict[str | None, int] = {None: 0}
        self.clear()

    def clear(self) -> None:
        """Forget every sample (the string table stays)."""
        self._label = array("I")
        self._phase = array("I")
        self._epoch = array("q")
        self._batch = array("q")
        self._time = array("d")
        self._collected = array("b")
        self._metrics: dict[str, array[int]] = {}
        self._notes: dict[int, str] = {}
        self._all: list[array] = []
        # nbytes() is cached while no column can have grown: every column appended in
        # lockstep (so all share one capacity, in items), no more rows than that capacity, no
        # new note.
        self._lockstep = True
        self._room = -1
        self._noted = 0
        self._size = 0

    def _intern(self, text: str | None) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self._strings)
            self._strings.append(text)
        return found

    def append(self, sample: Sample) -> None:
        n = len(self._label)
        index = self._index
        label, phase = index.get(sample.label), index.get(sample.phase)
        self._label.append(self._intern(sample.label) if label is None else label)
        self._phase.append(self._intern(sample.phase) if phase is None else phase)
        epoch, batch = sample.epoch, sample.batch
        self._epoch.append(_NONE if epoch is None else epoch)
        self._batch.append(_NONE if batch is None else batch)
        self._time.append(sample.time)
        self._collected.append(sample.collected)
        columns = self._metrics
        for name, value in sample.metrics.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = array("q", [_NONE]) * n
                self._lockstep = self._lockstep and not n
            column.append(_NONE if value is None else value)
        if len(sample.metrics) != len(columns):
            for column in columns.values():
                if len(column) == n:
                    column.append(_NONE)
        if sample.note is not None:
            self._notes[n] = sample.note

    def __len__(self) -> int:
        return len(self._label)

    @overload
    def __getitem__(self, index: int) -> Sample: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...
    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return [self._sample(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("sample index out of range")
        return self._sample(index % n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[Sample]:
        n = len(self)
        for start in range(0, n, _CHUNK):
            yield from self._rows(start, min(n, start + _CHUNK))

    def _sample(self, i: int) -> Sample:
        return make_sample(
            self._strings[self._label[i]],
            self._strings[self._phase[i]],
            _value(self._epoch[i]),
            _value(self._batch[i]),
            self._time[i],
            _metrics(self._metrics, i),
            bool(self._collected[i]),
            self._notes.get(i),
        )

    def _rows(self, a: int, b: int) -> list[Sample]:
        """Samples ``a`` to ``b - 1``, each column read in one slice."""
        strings, notes = self._strings, self._notes
        names = list(self._metrics)
        values = [[None if v == _NONE else v for v in c[a:b]] for c in self._metrics.values()]
        metrics = [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]
        if not names:
            metrics = [{} for _ in range(a, b)]
        return [
            make_sample(
                strings[label],
                strings[phase],
                None if epoch == _NONE else epoch,
                None if batch == _NONE else batch,
                time,
                readings,
                bool(collected),
                notes.get(i) if notes else None,
            )
            for i, label, phase, epoch, batch, time, readings, collected in zip(
                range(a, b),
                self._label[a:b],
                self._phase[a:b],
                self._epoch[a:b],
                self._batch[a:b],
                self._time[a:b],
                metrics,
                self._collected[a:b],
                strict=True,
            )
        ]

    # -- columns ------------------------------------------------------------------------------

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> SampleStore:
        """A store holding ``samples``."""
        store = cls()
        for sample in samples:
            store.append(sample)
        return store

    @property
    def strings(self) -> list[str | None]:
        """The table :meth:`codes` index (entry 0 is None)."""
        return self._strings

    def code(self, text: str | None) -> int | None:
        """The code of ``text`` in :attr:`strings`, None when no sample has it."""
        return self._index.get(text)

    def codes(self, field: str) -> np.ndarray:
        """``label`` or ``phase`` of every sample as indices into :attr:`strings` (a copy)."""
        column = self._label if field == "label" else self._phase
        return np.frombuffer(column, dtype=np.uint32).copy()

    def numbers(self, field: str) -> np.ndarray:
        """``epoch``, ``batch`` (int64, :data:`NONE` for None), ``time`` (float64) or
        ``collected`` (bool) of every sample, a copy."""
        if field == "time":
            return np.frombuffer(self._time, dtype=np.float64).copy()
        if field == "collected":
            return np.frombuffer(self._collected, dtype=np.int8).astype(bool)
        column = self._epoch if field == "epoch" else self._batch
        return np.frombuffer(column, dtype=np.int64).copy()

    @property
    def notes(self) -> Mapping[int, str]:
        """Each sample's note, by position (most samples have none)."""
        return self._notes

    @property
    def metric_names(self) -> list[str]:
        return list(self._metrics)

    def metric(self, name: str) -> np.ndarray | None:
        """Readings of ``name`` (int64, :data:`NONE` where absent), a copy; None when no
        sample has the metric."""
        column = self._metrics.get(name)
        return None if column is None else np.frombuffer(column, dtype=np.int64).copy()

    def extend_columns(
        self,
        label: Sequence[str | None],
        label_codes: np.ndarray,
        phase: Sequence[str | None],
        phase_codes: np.ndarray,
        epoch: np.ndarray,
        batch: np.ndarray,
        time: np.ndarray,
        collected: np.ndarray,
        metrics: Mapping[str, np.ndarray],
        notes: Mapping[int, str],
    ) -> None:
        """Append samples given as columns: ``label[label_codes]`` are the labels (likewise
        phases), ``epoch``, ``batch`` and metrics int64 with :data:`NONE` for None, ``notes``
        by position among the new samples."""
        n = len(self)
        added = len(label_codes)
        for own, table, codes in (
            (self._label, label, label_codes),
            (self._phase, phase, phase_codes),
        ):
            local = np.array([self._intern(text) for text in table], dtype=np.uint32)
            own.frombytes(local[np.asarray(codes, dtype=np.intp)].tobytes() if added else b"")
        self._epoch.frombytes(np.asarray(epoch, dtype=np.int64).tobytes())
        self._batch.frombytes(np.asarray(batch, dtype=np.int64).tobytes())
        self._time.frombytes(np.asarray(time, dtype=np.float64).tobytes())
        self._collected.frombytes(np.asarray(collected, dtype=np.int8).tobytes())
        for name in metrics.keys() - self._metrics.keys():
            self._metrics[name] = array("q", [_NONE]) * n
            self._lockstep = self._lockstep and not n
        for name, column in self._metrics.items():
            given = metrics.get(name)
            if given is None:
                column.extend(array("q", [_NONE]) * added)
            else:
                column.frombytes(np.asarray(given, dtype=np.int64).tobytes())
        for i, note in notes.items():
            self._notes[n + i] = note

    def nbytes(self) -> int:
        """Bytes the columns hold now (their allocated capacity)."""
        if self._lockstep and len(self._label) <= self._room and len(self._notes) == self._noted:
            return self._size
        self._size = sum(map(sys.getsizeof, self._columns())) + sys.getsizeof(self._notes)
        self._room = (sys.getsizeof(self._label) - _EMPTY) // self._label.itemsize
        self._noted = len(self._notes)
        return self._size

    def _columns(self) -> list[array]:
        if len(self._all) != 6 + len(self._metrics):
            self._all = [
                self._label,
                self._phase,
                self._epoch,
                self._batch,
                self._time,
                self._collected,
                *self._metrics.values(),
            ]
        return self._all


def make_sample(
    label: str | None,
    phase: str | None,
    epoch: int | None,
    batch: int | None,
    time: float,
    metrics: dict[str, int | None],
    collected: bool,
    note: str | None,
) -> Sample:
    """A :class:`Sample` without the frozen dataclass's per-field ``__setattr__`` calls (its
    fields are not checked: the recorder and the store give them their types)."""
    sample = _new(Sample)
    _set(
        sample,
        "__dict__",
        {
            "label": label,
            "phase": phase,
            "epoch": epoch,
            "batch": batch,
            "time": time,
            "metrics": metrics,
            "collected": collected,
            "note": note,
        },
    )
    return sample


def _value(stored: int) -> int | None:
    return None if stored == _NONE else stored


def _metrics(columns: Mapping[str, array[int]], i: int) -> dict[str, int | None]:
    return {name: _value(column[i]) for name, column in columns.items()}
