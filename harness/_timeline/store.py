"""A recorder's samples kept as columns of numbers: a few tens of bytes per checkpoint.

The columns follow :data:`harness._measure.sample.FIELDS`: text fields (labels, phases) are interned
(a table of distinct strings, an index per sample), numbers live in ``array`` columns, notes
in a sparse dict. The store reads as a sequence of
:class:`~harness._measure.sample.Sample`, built on access (iteration builds them a chunk at a time),
and knows its own size (:meth:`nbytes`), so the recorder can leave its own storage out of
host-memory readings. Statistics read whole columns as numpy arrays (:meth:`codes`,
:meth:`numbers`, :meth:`metric`) instead of a million samples; a timeline is read straight
into a store (:meth:`extend_columns`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

import harness._measure.sample as schema
from harness._core.errors import BadArgument
from harness._measure.sample import METRICS, Field, Sample, line_order

_NONE = -(2**63)
"""The integer column value that stands for None."""
NONE = _NONE
_CHUNK = 4096
"""Samples built at a time while iterating."""
_ROOM = 2048
"""Bytes a column starts with, and grows by at least. A column never grows an item at a time:
an ``array`` that grows by ``append`` is reallocated through every small size, and glibc keeps
the small chunks it frees in its per-thread cache, which ``mallinfo2`` counts as in use, so
the recorder's own columns read as growth (measured: 10 columns appended 1,000 times in
lockstep read +100 KB against +63 KB of capacity). Chunks of 2 KiB and more go back to
malloc's bins, which ``mallinfo2`` counts as free, so :meth:`SampleStore.nbytes` is what
malloc holds for the columns."""
_new = object.__new__
_set = object.__setattr__


_TYPECODES = {"text": "I", "int": "q", "float": "d", "bool": "b"}
"""The ``array`` typecode of each kind of field kept in a column: text as an index into the
string table, whole numbers as int64 with :data:`NONE` for None."""


class SampleStore(Sequence[Sample]):
    """Samples in columns, one per field of :data:`~harness._measure.sample.FIELDS` (``note`` fields
    sparse, by position) and one per metric; ``append``, ``clear``, ``len``, indexing and
    slicing."""

    def __init__(self) -> None:
        self._fields = schema.FIELDS
        self._strings: list[str | None] = [None]
        self._index: dict[str | None, int] = {None: 0}
        self.clear()

    def clear(self) -> None:
        """Forget every sample (the string table stays)."""
        self._n = 0
        self._columns: dict[str, array] = {
            f.name: _column(_TYPECODES[f.kind], 0) for f in self._fields if f.kind != "note"
        }
        self._sparse: dict[str, dict[int, str]] = {
            f.name: {} for f in self._fields if f.kind == "note"
        }
        columns = self._columns
        self._texts = [(f.name, columns[f.name]) for f in self._fields if f.kind == "text"]
        self._numbers = [
            (f.name, columns[f.name]) for f in self._fields if f.kind in ("int", "float", "bool")
        ]
        self._notes = list(self._sparse.items())
        self._order = line_order(self._fields)
        strings = self._strings
        kinds: dict[str, Callable[[Any], Any]] = {
            "text": strings.__getitem__,
            "int": _value,
            "float": float,
            "bool": bool,
        }
        self._readers = {f.name: kinds[f.kind] for f in self._fields if f.kind != "note"}
        self._metrics: dict[str, array[int]] = {}
        self._all: list[array] = []
        self._room = 0
        self._size = 0
        self._noted = -1
        self._notes_size = 0
        self._frozen = False
        self._resized()

    def freeze(self) -> None:
        """Take no more samples (a timeline read back): :meth:`codes`, :meth:`numbers` and
        :meth:`metric` return the columns in place, read-only, instead of a copy each. (The
        columns are not cut to their length: ``array`` would over-allocate a 16th again.)"""
        self._room = self._n  # the next sample would grow the columns, which a frozen store refuses
        self._frozen = True

    def _intern(self, text: str | None) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self._strings)
            self._strings.append(text)
        return found

    def _resized(self) -> None:
        """Note the columns' capacity after a column was added or grown."""
        self._all = [*self._columns.values(), *self._metrics.values()]
        self._room = min(map(len, self._all))
        self._size = sum(map(sys.getsizeof, self._all))

    def _reserve(self, count: int) -> None:
        """Room for ``count`` samples in every column; one that grows gains at least a 16th of
        its length and :data:`_ROOM` bytes, as ``array`` over-allocates by a 16th."""
        if count <= self._room:
            return
        if self._frozen:
            raise BadArgument("a frozen SampleStore takes no more samples")
        for column in self._all:
            if len(column) < count:
                column.extend(_column(column.typecode, max(len(column) // 16, count - len(column))))
        self._resized()

    def _new_metric(self, name: str, count: int) -> array[int]:
        """A metric column for ``name``, None for the ``count`` samples before it."""
        column = self._metrics[name] = _column("q", count)
        self._resized()
        return column

    def append(self, sample: Sample) -> None:
        values = sample.__dict__
        n = self._fields_row(values)
        for name, notes in self._notes:
            if values[name] is not None:
                notes[n] = values[name]
        metrics = self._metrics
        for name, value in sample.metrics.items():
            found = metrics.get(name)
            column = self._new_metric(name, n + 1) if found is None else found
            column[n] = _NONE if value is None else value
        self._n = n + 1

    def append_unread(self, sample: Sample) -> None:
        """:meth:`append` for a sample none of whose metrics was read and that has no note (a
        loop's batch between two stride readings): a new row's metric columns read None
        already, so only its text and number columns are written."""
        self._n = self._fields_row(sample.__dict__) + 1

    def _fields_row(self, values: dict[str, Any]) -> int:
        """Write the text and number fields of ``values`` in the next row, and return it."""
        n = self._n
        if n == self._room:
            self._reserve(n + 1)
        index = self._index
        for name, column in self._texts:  # (name, column) pairs: no lookup of the column
            text = values[name]
            code = index.get(text)
            column[n] = self._intern(text) if code is None else code
        for name, column in self._numbers:
            value = values[name]
            column[n] = _NONE if value is None else value
        return n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Sample: ...
    @overload
    def __getitem__(self, index: slice) -> list[Sample]: ...
    def __getitem__(self, index: int | slice) -> Sample | list[Sample]:
        if isinstance(index, slice):
            return self._rows(*index.indices(len(self)))
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
            yield from self._rows(start, min(n, start + _CHUNK), 1)

    def _sample(self, i: int) -> Sample:
        values: dict[str, Any] = {}
        for name in self._order:
            if name == METRICS:
                values[name] = {m: _value(column[i]) for m, column in self._metrics.items()}
            elif name in self._sparse:
                values[name] = self._sparse[name].get(i)
            else:
                values[name] = self._readers[name](self._columns[name][i])
        return make_sample(values)

    def _rows(self, a: int, b: int, step: int) -> list[Sample]:
        """Samples ``a``, ``a + step``, ... before ``b``, each column read in one slice."""
        rows = range(a, b, step)
        fields: list[tuple[str, list[Any]]] = []
        strings = self._strings
        for f in self._fields:
            if f.kind == "note":
                notes = self._sparse[f.name]
                fields.append(
                    (f.name, [notes.get(i) for i in rows] if notes else [None] * len(rows))
                )
                continue
            got = self._columns[f.name][a:b:step]
            if f.kind == "text":
                fields.append((f.name, [strings[code] for code in got]))
            elif f.kind == "int":
                fields.append((f.name, [None if v == _NONE else v for v in got]))
            elif f.kind == "bool":
                fields.append((f.name, [bool(v) for v in got]))
            else:
                fields.append((f.name, got.tolist()))
        names = list(self._metrics)
        values = [[None if v == _NONE else v for v in c[a:b:step]] for c in self._metrics.values()]
        metrics = [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]
        fields.append((METRICS, metrics if names else [{} for _ in rows]))
        by_name = dict(fields)
        keys = self._order
        columns = [by_name[key] for key in keys]
        return [
            make_sample(dict(zip(keys, row, strict=True))) for row in zip(*columns, strict=True)
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
    def fields(self) -> tuple[Field, ...]:
        """The fixed fields this store keeps (:data:`~harness._measure.sample.FIELDS` when made)."""
        return self._fields

    @property
    def strings(self) -> list[str | None]:
        """The table :meth:`codes` index (entry 0 is None)."""
        return self._strings

    def code(self, text: str | None) -> int | None:
        """The code of ``text`` in :attr:`strings`, None when no sample has it."""
        return self._index.get(text)

    def codes(self, field: str) -> np.ndarray:
        """A ``text`` field of every sample as indices into :attr:`strings` (a copy, or the
        column itself once frozen)."""
        return self._read(self._columns[field], np.uint32)

    def numbers(self, field: str) -> np.ndarray:
        """An ``int`` (int64, :data:`NONE` for None), ``float`` (float64) or ``bool`` field of
        every sample (a copy, or the column itself once frozen)."""
        column = self._columns[field]
        if column.typecode == "b":
            return self._read(column, np.int8).view(bool)
        return self._read(column, _DTYPES[column.typecode])

    def _read(self, column: array, dtype: type) -> np.ndarray:
        """``column`` as numpy: a copy, or in place and read-only when frozen."""
        found: np.ndarray = np.frombuffer(column, dtype=dtype, count=self._n)
        if not self._frozen:
            return found.copy()
        found.flags.writeable = False
        return found

    def sparse(self, field: str) -> Mapping[int, str]:
        """A ``note`` field's values, by position (most samples have none)."""
        return self._sparse[field]

    @property
    def notes(self) -> Mapping[int, str]:
        """Each sample's note, by position (most samples have none)."""
        return self._sparse["note"]

    @property
    def metric_names(self) -> list[str]:
        return list(self._metrics)

    def metric(self, name: str) -> np.ndarray | None:
        """Readings of ``name`` (int64, :data:`NONE` where absent; a copy, or the column
        itself once frozen); None when no sample has the metric."""
        column = self._metrics.get(name)
        return None if column is None else self._read(column, np.int64)

    def extend_columns(
        self,
        count: int,
        fields: Mapping[str, Any],
        metrics: Mapping[str, np.ndarray],
    ) -> None:
        """Append ``count`` samples given as columns, by field name: a ``text`` field as
        ``(table, codes)`` (its values are ``table[codes]``), ``int`` fields and metrics as
        int64 with :data:`NONE` for None, ``float`` and ``bool`` fields as arrays, ``note``
        fields as ``{position among the new samples: text}``."""
        n = self._n
        for name in metrics:
            if name not in self._metrics:
                self._new_metric(name, n)
        self._reserve(n + count)

        def put(column: array, values: np.ndarray) -> None:
            np.frombuffer(column, dtype=values.dtype)[n : n + count] = values

        for f in self._fields:
            given = fields[f.name]
            if f.kind == "note":
                self._sparse[f.name].update((n + i, text) for i, text in given.items())
            elif f.kind == "text":
                table, codes = given
                local = np.array([self._intern(text) for text in table], dtype=np.uint32)
                chosen = local[np.asarray(codes, dtype=np.intp)] if count else local[:0]
                put(self._columns[f.name], chosen)
            else:
                column = self._columns[f.name]
                dtype = np.int8 if column.typecode == "b" else _DTYPES[column.typecode]
                put(column, np.asarray(given, dtype=dtype))
        for name, readings in metrics.items():
            put(self._metrics[name], np.asarray(readings, dtype=np.int64))
        self._n = n + count

    def nbytes(self) -> int:
        """Bytes the columns hold now (their allocated capacity)."""
        noted = sum(map(len, self._sparse.values()))
        if noted != self._noted:
            self._noted = noted
            self._notes_size = sum(map(sys.getsizeof, self._sparse.values()))
        return self._size + self._notes_size


_DTYPES = {"q": np.int64, "d": np.float64, "I": np.uint32}


def _column(typecode: str, count: int) -> array:
    """An empty column with room for ``count`` samples and at least :data:`_ROOM` bytes (ints
    read as None until written)."""
    filler = array(typecode, [_NONE if typecode == "q" else 0])
    return filler * max(count, _ROOM // filler.itemsize)


def _value(stored: int) -> int | None:
    return None if stored == _NONE else stored


def make_sample(values: dict[str, Any]) -> Sample:
    """A :class:`Sample` holding ``values`` (every field, by name, and ``metrics``), without the
    frozen dataclass's per-field ``__setattr__`` calls (its fields are not checked: the
    recorder, the store and the readers give them their types)."""
    sample = _new(Sample)
    _set(sample, "__dict__", values)
    return sample
