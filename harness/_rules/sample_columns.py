"""A timeline's samples as columns: what the statistics pass (:mod:`harness._rules.context`)
and the report read of every sample, one numpy array per field and metric, from a
:class:`~harness._timeline.store.SampleStore`'s own columns or built once from a list of samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import harness._core.labels as labels
import harness._measure.sample as schema
from harness._measure.sample import Sample
from harness._timeline.store import NONE, SampleStore

Key = tuple[str | None, int | None]
"""A group's ``(phase, epoch)``."""


class Columns:
    """What the statistics pass and the report read of every sample, as arrays: one per field
    of :data:`~harness._measure.sample.FIELDS`, read as an attribute by its name (a ``text`` field
    as codes into ``strings``; an ``int`` field as int64 with :data:`~harness._timeline.store.NONE`
    for None; ``float`` and ``bool`` fields as they are; a ``note`` field as ``{position: text}``,
    the ``note`` field as ``notes``), whether a sample is an OOM event, a failed check or a
    per-batch reading of a loop, and each metric's readings as floats with a mask of where it
    was read."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self._samples = samples
        self._store = samples if isinstance(samples, SampleStore) else None
        self._present: dict[str, np.ndarray] = {}
        self._values: dict[str, np.ndarray] = {}
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
        self.oom = self._marked("event", labels.OOM)
        self.check_failed = self._marked("event", labels.CHECK_FAILED)
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

    def _marked(self, field: str, text: str) -> np.ndarray:
        """Where the sparse field ``field`` holds ``text``."""
        found = np.zeros(len(self.batch), dtype=bool)
        found[[i for i, value in self.sparse[field].items() if value == text]] = True
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

    @property
    def metric_names(self) -> list[str]:
        """Every metric any sample holds, in order of first appearance."""
        names = self.__dict__.get("_names")
        if names is None:
            if self._store is not None:
                names = list(self._store.metric_names)
            else:
                names = list(dict.fromkeys(m for s in self._samples for m in s.metrics))
            self.__dict__["_names"] = names
        return names

    def present(self, metric: str) -> np.ndarray:
        """Where ``metric`` was read."""
        found = self._present.get(metric)
        if found is None:
            if self._store is not None:
                stored = self._store.metric(metric)
                found = np.zeros(len(self.batch), bool) if stored is None else stored != NONE
            else:
                read = [s.get(metric) is not None for s in self._samples]
                found = np.array(read, dtype=bool).reshape(-1)
            self._present[metric] = found
        return found

    def values(self, metric: str) -> np.ndarray:
        """Readings of ``metric`` as floats, 0 where absent."""
        found = self._values.get(metric)
        if found is None:
            if self._store is not None:
                stored = self._store.metric(metric)
                if stored is None:  # zeroed pages: no memory until written
                    found = np.zeros(len(self.batch), dtype=np.float64)
                else:
                    found = stored.astype(np.float64)
                    found[stored == NONE] = 0
                    del stored
            else:
                read = [s.get(metric) or 0 for s in self._samples]
                found = np.array(read, dtype=np.float64).reshape(-1)
            self._values[metric] = found
        return found


def _int_column(values: list[int | None]) -> np.ndarray:
    return np.array([NONE if v is None else v for v in values], dtype=np.int64).reshape(-1)
