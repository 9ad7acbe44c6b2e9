"""Reading a large timeline in columns: pyarrow's JSON reader parses the sample lines in
blocks, against the schema :data:`harness._measure.sample.FIELDS` gives, straight into a
:class:`~harness._timeline.store.SampleStore` (a few tens of bytes per sample, a million lines in
seconds). A file this reader cannot describe exactly (an empty line, a field of another type,
a number beyond 64 bits) is left to the line-by-line reader, which names the line at fault.
Metrics the header does not name (workers' roles, known only as they come) are declared from
the end record; a killed run has none, so each is declared at the block where it first
appears, and the parse resumes there."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from harness._core.errors import BadInput
from harness._core.labels import OOM
from harness._measure.sample import METRICS, line_order
from harness._timeline.checks import Timeline, check_end, check_header, derived
from harness._timeline.store import NONE, SampleStore

PARSE_BLOCK = 1 << 18
"""Bytes pyarrow parses at a time: memory stays near the store's size, whatever the file's
(reading 1M lines peaks at 154 MB resident with 256 KiB blocks, 201 MB with 1 MiB ones, for
0.3 s more)."""
SCAN_BLOCK = 2 << 20
"""Bytes looked at a time for what the columnar reader leaves to the line reader."""
COLUMNS_FROM = 4 << 20
"""Files from this size on are read in columns; smaller ones (tens of thousands of lines) by
the line reader, which is quick enough there and leaves no parser's memory in the process."""


MAX_METRICS = 1024
"""Most metric names a file read in columns may hold; more go to the line reader."""


_ARROW = {"text": "string", "note": "string", "int": "int64", "float": "float64", "bool": "bool_"}
"""The pyarrow type (a function of ``pyarrow``) each kind of field is parsed as."""


class _Range(io.RawIOBase):
    """Bytes ``start`` to ``stop`` of an open file, read with ``pread``."""

    def __init__(self, fd: int, start: int, stop: int) -> None:
        self._fd, self._at, self._stop = fd, start, stop

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self._stop - self._at)
        if wanted <= 0:
            return 0
        got = os.preadv(self._fd, [memoryview(buffer)[:wanted]], self._at)
        self._at += got
        return got


def read_columns(file: BinaryIO) -> Timeline | None:
    """The timeline in ``file`` (open at its start) read in columns, or None when it needs the
    line-by-line reader (see :func:`harness._timeline.jsonl.read_timeline`)."""
    try:
        import pyarrow.json
    except ImportError:
        return None
    fd = file.fileno()
    size = os.fstat(fd).st_size
    if size < COLUMNS_FROM:
        return None
    first = file.readline()
    start = len(first)
    if not first.endswith(b"\n"):
        return None
    try:
        header = json.loads(first)
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or "leakgate_timeline" not in header:
        return None
    try:
        check_header(header)
    except BadInput:
        return None
    stop, end, torn = _tail(fd, start, _data_end(fd, size))
    if stop is None:
        return None
    metrics = header.get("metrics")
    met = end.get("metrics", []) if end is not None else []  # names met on the way (roles)
    if isinstance(metrics, list) and isinstance(met, list):
        metrics = metrics + met
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        return None
    store = SampleStore()
    if stop > start:
        if _has_unusual_lines(fd, start, stop):
            return None
        known = list(dict.fromkeys(metrics))
        at, read = start, 0  # where the current parse began, and the samples before it
        while True:
            try:
                _parse(fd, at, stop, known, store, header["leakgate_timeline"])
                break
            except (pyarrow.ArrowException, ValueError, OverflowError):
                # a metric the header did not name (a worker's, in a killed run without the
                # end record that lists them) is declared and the parse resumes at its block
                at = _line_start(fd, at, len(store) - read)
                read = len(store)
                met = _new_metrics(fd, at, stop, known)
                if not met or len(known) + len(met) > MAX_METRICS:
                    return None
                known += met
            except _Refused:
                return None
    store.freeze()
    return Timeline(header, store, torn, end, reader="columns")


class _Refused(Exception):
    """A batch holds what a sample may not: the line reader names it."""


def _parse(
    fd: int, start: int, stop: int, metrics: list[str], store: SampleStore, version: int
) -> None:
    """Parse the sample lines from byte ``start`` to ``stop`` with the metrics ``metrics`` into
    ``store``, a batch at a time; pyarrow's error when a line does not fit the schema. Lines
    of a format ``version`` before 3 have their event and edge derived."""
    import pyarrow as pa
    import pyarrow.json as pj

    kinds = {f.name: getattr(pa, _ARROW[f.kind])() for f in store.fields}
    kinds[METRICS] = pa.struct([(m, pa.int64()) for m in metrics])
    types = pa.schema([(name, kinds[name]) for name in line_order(store.fields)])
    options = pj.ParseOptions(explicit_schema=types, unexpected_field_behavior="error")
    stream = io.BufferedReader(_Range(fd, start, stop), PARSE_BLOCK)
    reader = pj.open_json(
        stream,
        read_options=pj.ReadOptions(block_size=PARSE_BLOCK),
        parse_options=options,
        memory_pool=pa.system_memory_pool(),
    )
    for batch in reader:
        if not _add_batch(store, batch, version):
            raise _Refused


def _line_start(fd: int, at: int, lines: int) -> int:
    """Where the line ``lines`` lines after the one starting at byte ``at`` starts."""
    while lines:
        chunk = os.pread(fd, SCAN_BLOCK, at)
        found = chunk.count(b"\n")
        if found < lines:
            if not chunk:
                return at
            at, lines = at + len(chunk), lines - found
            continue
        cut = -1
        for _ in range(lines):
            cut = chunk.index(b"\n", cut + 1)
        return at + cut + 1
    return at


def _new_metrics(fd: int, at: int, stop: int, known: list[str]) -> list[str]:
    """The metric names beyond ``known`` in the block of lines from byte ``at`` (the one
    pyarrow could not parse), in the order they come; empty when that block has none."""
    block = os.pread(fd, min(PARSE_BLOCK, stop - at), at)
    if at + len(block) < stop:
        block += os.pread(fd, 1 << 16, at + len(block)).split(b"\n", 1)[0]
    met: dict[str, None] = {}
    for line in block.split(b"\n"):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        readings = record.get(METRICS) if isinstance(record, dict) else None
        if isinstance(readings, dict):
            met.update(dict.fromkeys(readings))
    return [m for m in met if m not in known]


def _tail(fd: int, start: int, size: int) -> tuple[int | None, dict[str, Any] | None, int]:
    """Where the sample lines stop, the end record, and whether the last line is torn: the
    last line is read here, as the line-by-line reader reads it. ``None`` for where when the
    file ends in a way only that reader describes."""
    step = 4096
    while True:
        at = max(start, size - step)
        tail = os.pread(fd, size - at, at)
        body = tail[:-1] if tail.endswith(b"\n") else tail
        cut = body.rfind(b"\n")
        if cut >= 0 or at == start:
            break
        step *= 4
    last_start = at + cut + 1
    last = body[cut + 1 :]
    if not last:
        return start, None, 0
    try:
        record = json.loads(last)
    except RecursionError:
        return None, None, 0
    except ValueError:
        return last_start, None, 1
    if isinstance(record, dict) and "leakgate_end" in record:
        end = record["leakgate_end"]
        try:
            check_end(end)
        except BadInput:
            return None, None, 0  # the line reader names what is wrong with it
        return last_start, end, 0
    return size, None, 0


def _data_end(fd: int, size: int) -> int:
    """Where the file's bytes end: before the zeros a killed writer reserved past its lines."""
    while size:
        at = max(0, size - 4096)
        kept = os.pread(fd, size - at, at).rstrip(b"\0")
        if kept:
            return at + len(kept)
        size = at
    return 0


def _has_unusual_lines(fd: int, start: int, stop: int) -> bool:
    """Empty lines, end records or zero bytes (a write a killed writer left unfinished) among
    the sample lines: the line reader's to judge. Each
    block is read with the last bytes of the one before it, so that what spans a boundary is
    seen; only the first block's leading newline is an empty line of its own (a later one is
    the end of a line the block before it holds)."""
    at, overlap = start, b""
    while at < stop:
        chunk = overlap + os.pread(fd, min(SCAN_BLOCK, stop - at), at)
        at += len(chunk) - len(overlap)
        if b"\n\n" in chunk or b"leakgate_end" in chunk or b"\0" in chunk:
            return True
        if not overlap and chunk.startswith(b"\n"):
            return True
        overlap = chunk[-16:]
    return False


def _add_batch(store: SampleStore, batch: Any, version: int) -> bool:
    """Append one record batch; False when it holds what a sample may not (a missing label,
    a null where a value is required, -2**63 in a whole-number column, a time not finite).
    In a version 1 or 2 timeline each sample's event and edge are derived
    (:func:`~harness._timeline.checks.derived`): once per label, then once per note."""
    import numpy as np
    import pyarrow.compute as pc

    n = batch.num_rows
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    if columns[METRICS].null_count:
        return False
    values: dict[str, Any] = {}
    for f in store.fields:
        column = columns[f.name]
        if f.kind == "note":
            valid = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
            values[f.name] = {at: column[at].as_py() for at in valid.tolist()}
        elif f.kind == "text":
            if f.required and column.null_count:
                return False
            encoded = pc.dictionary_encode(column)
            table = encoded.dictionary.to_pylist()
            codes = encoded.indices.fill_null(len(table)).to_numpy(zero_copy_only=False)
            values[f.name] = ([*table, None], codes)
        elif f.kind == "int":
            found = _whole(column)
            if found is None:
                return False
            values[f.name] = found
        elif column.null_count:
            return False
        else:
            found = column.to_numpy(zero_copy_only=False)
            if f.kind == "float" and not bool(np.isfinite(found).all()):
                return False
            values[f.name] = found
    if version < 3:
        _derive(values)
    readings = {}
    struct = columns[METRICS]
    for i, member in enumerate(struct.type):
        found = _whole(struct.field(i))
        if found is None:
            return False
        readings[member.name] = found
    store.extend_columns(n, values, readings)
    return True


def _derive(values: dict[str, Any]) -> None:
    """The ``event`` and ``edge`` of an old timeline's samples, from the labels and notes in
    ``values``: judged once per label, then once per note."""
    import numpy as np

    labels, codes = values["label"]
    found = [derived(label, None) if label is not None else (None, None) for label in labels]
    for at, name in enumerate(("event", "edge")):
        by_label = np.array([f[at] is not None for f in found], dtype=bool)[codes]
        values[name] = {i: found[codes[i]][at] for i in np.flatnonzero(by_label).tolist()}
    for i, note in values["note"].items():
        label = labels[codes[i]]
        if label is not None and derived(label, note)[0] == OOM:
            values["event"][i] = OOM


def _whole(column: Any) -> Any:
    """An int64 column with :data:`~harness._timeline.store.NONE` for null; None when it holds
    -2**63 itself (the line reader refuses it, naming the line)."""
    values = column.fill_null(NONE).to_numpy(zero_copy_only=False)
    return None if int((values == NONE).sum()) != column.null_count else values


class _NoPandas:
    """A finder that says pandas is not installed."""

    @staticmethod
    def find_spec(name: str, *_: object) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not needed to read a timeline", name=name)


@contextlib.contextmanager
def pyarrow_without_pandas() -> Iterator[None]:
    """pyarrow imports pandas, where it is installed, the first time it turns a column into
    numpy: 25 MiB and 0.2 s of a report on a million checkpoints (306 against 282 MB peak,
    measured). Reading a timeline needs none of it, so a command's own process (``leakgate report``,
    ``gate``, ``merge``) tells pyarrow there is no pandas while it reads (unless pandas was
    already imported)."""
    if "pandas" in sys.modules:
        yield
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        yield
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
