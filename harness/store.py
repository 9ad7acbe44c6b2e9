"""A recorder's samples kept as columns of numbers: a few tens of bytes per checkpoint.

Labels and phases are interned (a table of distinct strings, an index per sample), numbers
live in ``array`` columns, notes in a sparse dict. The store reads as a sequence of
:class:`~harness.sample.Sample`, built on access, and knows its own size (:meth:`nbytes`), so
the recorder can leave its own storage out of host-memory readings.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from harness.sample import Sample

_NONE = -(2**63)
"""The integer column value that stands for None."""


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

    def _intern(self, text: str | None) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self._strings)
            self._strings.append(text)
        return found

    def append(self, sample: Sample) -> None:
        n = len(self._label)
        self._label.append(self._intern(sample.label))
        self._phase.append(self._intern(sample.phase))
        self._epoch.append(_NONE if sample.epoch is None else sample.epoch)
        self._batch.append(_NONE if sample.batch is None else sample.batch)
        self._time.append(sample.time)
        self._collected.append(sample.collected)
        for name, value in sample.metrics.items():
            column = self._metrics.get(name)
            if column is None:
                column = self._metrics[name] = array("q", [_NONE]) * n
            column.append(_NONE if value is None else value)
        for column in self._metrics.values():
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
        return (self._sample(i) for i in range(len(self)))

    def _sample(self, i: int) -> Sample:
        label = self._strings[self._label[i]]
        assert label is not None
        return Sample(
            label,
            self._strings[self._phase[i]],
            _value(self._epoch[i]),
            _value(self._batch[i]),
            self._time[i],
            _metrics(self._metrics, i),
            bool(self._collected[i]),
            self._notes.get(i),
        )

    def nbytes(self) -> int:
        """Bytes the columns hold now (their allocated capacity)."""
        columns: list[array] = [
            self._label,
            self._phase,
            self._epoch,
            self._batch,
            self._time,
            self._collected,
            *self._metrics.values(),
        ]
        return sum(sys.getsizeof(c) for c in columns) + sys.getsizeof(self._notes)


def _value(stored: int) -> int | None:
    return None if stored == _NONE else stored


def _metrics(columns: Mapping[str, array[int]], i: int) -> dict[str, int | None]:
    return {name: _value(column[i]) for name, column in columns.items()}
