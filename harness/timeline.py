"""The JSONL timeline: one header line, then one line per sample, each written whole.

Each line goes to the file in one unbuffered write, so a process killed mid-run (even by
SIGKILL) leaves complete lines that all parse, plus at most one torn last line, which
:func:`read_timeline` skips and counts.

Whose file it is. A writer creates its timeline as a new file (``O_CREAT | O_EXCL |
O_NOFOLLOW``) and holds an exclusive ``flock`` on it until it closes, so a live run's file can
be told from a finished one's. When the name asked for, ``<name>.jsonl``, is taken:

- by a timeline no live writer holds (an earlier run of the same test, finished or killed):
  a new file, header written, is renamed over it, as a rerun replaces that run's report and
  verdict. The earlier file's bytes are never appended to or truncated;
- by a timeline a live writer holds (a second session running the same test into the same
  folder), or by an empty file (a writer between creating and locking it): the new timeline
  is ``<name>.<run id>.jsonl`` (the first 12 characters of the header's ``run_id``), also
  created exclusively. :attr:`TimelineWriter.path` says which name was used; the run's report
  and verdict should take its stem, so that the two runs keep their own files;
- by a symbolic link, a folder, or anything but a regular file: ``FileExistsError`` naming the
  path, and nothing is written (a link is never followed).

:func:`read_timeline` checks every line it returns: a header that is an object, and samples
whose fields have their types (``ValueError`` naming the file, the line and the field).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import math
import os
import re
import stat
import tempfile
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from harness.fsio import create_exclusive, file_mode, open_regular
from harness.sample import Sample
from harness.store import NONE, SampleStore
from harness.units import parse_size
from harness.verdict import size_fields

FORMAT = 2
"""Version of the timeline format, written in the header as ``leakgate_timeline``. Version 2
adds the end record (``{"leakgate_end": {"error": ...}}``, written once the run is judged);
version 1 timelines still read."""

MAX_DEPTH = 64
"""How deeply a header's values may nest (a run's config is a few levels deep)."""
MAX_BYTES = 2**63
"""The largest magnitude a reading, a size rule, an epoch or a batch number may have."""
_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_ID_CHARS = 12
_ATTEMPTS = 3

_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def _encode(record: Mapping[str, Any]) -> bytes:
    """One line; values JSON cannot hold (paths, dtypes in a config) are written as text."""
    return (_ENCODER.encode(record) + "\n").encode()


_TEXTS: dict[str, str] = {}
"""JSON text of the names written so far (labels, phases, metric names)."""
_MAX_TEXTS = 4096


def _text(value: str) -> str:
    found = _TEXTS.get(value)
    if found is None:
        found = _ENCODER.encode(value)
        if len(_TEXTS) < _MAX_TEXTS:
            _TEXTS[value] = found
    return found


def _sample_line(sample: Sample) -> bytes | None:
    """The line :func:`_encode` writes for ``sample``, or None when a field is not of the
    types built here (None, str, int, a float time, a bool ``collected``)."""
    label, phase, epoch, batch = sample.label, sample.phase, sample.epoch, sample.batch
    time, collected, note = sample.time, sample.collected, sample.note
    if (
        type(label) is not str
        or (phase is not None and type(phase) is not str)
        or (epoch is not None and type(epoch) is not int)
        or (batch is not None and type(batch) is not int)
        or type(time) is not float
        or not math.isfinite(time)
        or type(collected) is not bool
        or (note is not None and type(note) is not str)
    ):
        return None
    readings = []
    for name, value in sample.metrics.items():
        if type(name) is not str or (value is not None and type(value) is not int):
            return None
        readings.append(f"{_text(name)}:{'null' if value is None else value}")
    return (
        f'{{"label":{_text(label)},"phase":{"null" if phase is None else _text(phase)},'
        f'"epoch":{"null" if epoch is None else epoch},'
        f'"batch":{"null" if batch is None else batch},'
        f'"time":{float.__repr__(time)},"metrics":{{{",".join(readings)}}},'
        f'"collected":{"true" if collected else "false"},'
        f'"note":{"null" if note is None else _ENCODER.encode(note)}}}\n'
    ).encode()


class TimelineWriter:
    """Streams a timeline to ``path`` (or, when a live run holds that name, to the name
    :attr:`path` gives: see the module's notes); the header is written on construction.

    Raises ``OSError`` naming the path when it cannot be written; no file is left behind then.
    """

    def __init__(self, path: str | os.PathLike[str], header: Mapping[str, Any]) -> None:
        wanted = Path(path)
        line = _encode({"leakgate_timeline": FORMAT, **header})
        try:
            try:
                wanted.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise OSError(error.errno, error.strerror, str(path)) from None
            self.path, fd = _claim(wanted, line, _run_id(header))
        except OSError as error:
            text = f"cannot write the timeline ({error.strerror or error})"
            if error.errno is None:
                raise OSError(f"{text}: {error.filename or path}") from None
            raise OSError(error.errno, text, error.filename or str(path)) from None
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)  # closed when dropped, like a file

    def _write(self, line: bytes) -> None:
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as error:
            raise OSError(
                error.errno, f"cannot write the timeline ({error.strerror})", str(self.path)
            ) from None

    def write(self, sample: Sample) -> None:
        """Append one sample line, equal to ``sample.to_dict()`` encoded. Built by hand when
        every number is an int (a float for ``time``), with each label's JSON text kept:
        the encoder's generic path costs several times more per checkpoint."""
        line = _sample_line(sample)
        if line is None:
            line = _encode({**sample.__dict__, "metrics": dict(sample.metrics)})
        self._write(line)

    def end(self, error: str | None) -> None:
        """Write the end record: the run finished (``error``: what it raised, if anything)."""
        self._write(_encode({"leakgate_end": {"error": error}}))

    def close(self) -> None:
        """Close the file, which ends this writer's hold on its name."""
        self._close()


def _run_id(header: Mapping[str, Any]) -> str:
    """The part of the header's run id a second name takes (a fresh one when it has none)."""
    given = header.get("run_id")
    if isinstance(given, str) and _RUN_ID.fullmatch(given):
        return given[:_ID_CHARS]
    return uuid.uuid4().hex[:_ID_CHARS]


def _claim(wanted: Path, line: bytes, run_id: str) -> tuple[Path, int]:
    """Create the timeline, header written and locked: at ``wanted`` when it is free or holds
    a finished run's timeline, else at the run id's name. Returns the path and descriptor."""
    for _ in range(_ATTEMPTS):
        try:
            fd = create_exclusive(wanted)
        except FileExistsError:
            taken = _take_over(wanted, line)
            if taken == "held":
                break
            if isinstance(taken, int):
                return wanted, taken
            continue  # the name changed hands while we looked: look again
        _begin(fd, line, wanted)
        return wanted, fd
    other = wanted.with_name(f"{wanted.stem}.{run_id}{wanted.suffix}")
    fd = create_exclusive(other)
    _begin(fd, line, other)
    return other, fd


def _begin(fd: int, line: bytes, path: Path) -> None:
    """Lock a new timeline and write its header; on failure close it and remove ``path``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as error:
        with contextlib.suppress(OSError):
            if _same_entry(path, os.fstat(fd)):
                os.unlink(path)
        os.close(fd)
        raise OSError(error.errno, error.strerror, str(path)) from None


def _take_over(wanted: Path, line: bytes) -> int | str:
    """Replace a finished run's timeline at ``wanted``; return the new file's descriptor,
    ``"held"`` when a live writer owns the name, or ``"moved"`` when it changed meanwhile."""
    try:
        old = os.open(wanted, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "moved"
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FileExistsError(
                errno.EEXIST, "a symbolic link is in the way", str(wanted)
            ) from None
        raise OSError(error.errno, error.strerror, str(wanted)) from None
    try:
        if not stat.S_ISREG(os.fstat(old).st_mode):
            raise FileExistsError(errno.EEXIST, "something not a file is in the way", str(wanted))
        try:
            fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held"
        info = os.fstat(old)
        if info.st_size == 0:
            return "held"
        if not _same_entry(wanted, info):
            return "moved"
        try:
            fd, temporary = tempfile.mkstemp(
                dir=wanted.parent, prefix=f".{wanted.name[:200]}.", suffix=".tmp"
            )
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(wanted)) from None
        try:
            os.fchmod(fd, file_mode())
        except OSError as error:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise OSError(error.errno, error.strerror, str(wanted)) from None
        try:
            _begin(fd, line, Path(temporary))
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(wanted)) from None
        try:
            os.replace(temporary, wanted)
        except OSError as error:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise OSError(error.errno, error.strerror, str(wanted)) from None
        return fd
    finally:
        os.close(old)


def _same_entry(path: Path, info: os.stat_result) -> bool:
    """Whether ``path`` (not followed) is the file ``info`` describes."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


@dataclass(frozen=True)
class Timeline:
    """A timeline as read back: ``torn`` counts skipped incomplete last lines (0 or 1); ``end``
    is the end record (``error``: what the run raised), None when the run did not write one.
    ``samples`` is a :class:`~harness.store.SampleStore` when read from a file."""

    header: dict[str, Any]
    samples: Sequence[Sample]
    torn: int = 0
    end: dict[str, Any] | None = None

    @property
    def error(self) -> str | None:
        """What the run raised, as its end record says."""
        return self.end.get("error") if self.end is not None else None


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a timeline; a last line cut short by a killed writer is skipped and counted.

    Raises ``ValueError`` (one line: the file, the line, the field) when the file has no
    header, a line before the last is damaged, or a line's fields do not have their types;
    ``OSError`` when it cannot be read.

    From :data:`COLUMNS_FROM` bytes on, the sample lines are parsed in blocks by pyarrow's JSON
    reader, against the schema the writer writes, straight into a
    :class:`~harness.store.SampleStore` (a few tens of bytes per sample, a million lines in
    seconds). Anything that schema does not hold (a field of
    the wrong type, an unknown field, a number beyond 64 bits, an empty line) sends the whole
    file through the line-by-line reader below, which names the line and field at fault.
    """
    with open_regular(path) as file:
        fast = _read_columns(file)
        if fast is not None:
            return fast
        file.seek(0)
        lines = file.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    records: list[tuple[int, Any]] = []
    torn = 0
    for number, line in enumerate(lines, start=1):
        try:
            records.append((number, json.loads(line)))
        except RecursionError:
            raise ValueError(f"{path}:{number}: nested too deeply") from None
        except ValueError:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a JSON line") from None
            torn = 1
    if (
        not records
        or not isinstance(records[0][1], dict)
        or "leakgate_timeline" not in records[0][1]
    ):
        raise ValueError(f"{path}: not a leakgate timeline (no header line)")
    (_, header), *rest = records
    try:
        check_header(header)
    except ValueError as exc:
        raise ValueError(f"{path}:1: header{exc}") from None
    samples = []
    end = None
    for number, record in rest:
        if end is not None:
            raise ValueError(f"{path}:{number}: a line after the end record")
        if isinstance(record, dict) and "leakgate_end" in record:
            end = record["leakgate_end"]
            if not isinstance(end, dict) or not isinstance(end.get("error"), (str, type(None))):
                raise ValueError(f"{path}:{number}: end record: expected {{'error': text or null}}")
            continue
        try:
            samples.append(sample_of(record))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: sample{exc}") from None
    return Timeline(header, samples, torn, end)


_BLOCK = 1 << 18
"""Bytes pyarrow parses at a time: memory stays near the store's size, whatever the file's
(reading 1M lines peaks at 154 MB resident with 256 KiB blocks, 201 MB with 1 MiB ones, for
0.3 s more)."""
COLUMNS_FROM = 4 << 20
"""Files from this size on are read in columns; smaller ones (tens of thousands of lines) by
the line reader, which is quick enough there and leaves no parser's memory in the process."""


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


def _read_columns(file: BinaryIO) -> Timeline | None:
    """The timeline read in columns, or None when it needs the line-by-line reader (see
    :func:`read_timeline`), from ``file`` open at its start."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
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
    except ValueError:
        return None
    stop, end, torn = _tail(fd, start, size)
    if stop is None:
        return None
    metrics = header.get("metrics")
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        return None
    store = SampleStore()
    if stop > start:
        if _has_unusual_lines(fd, start, stop):
            return None
        schema = pa.schema(
            [
                ("label", pa.string()),
                ("phase", pa.string()),
                ("epoch", pa.int64()),
                ("batch", pa.int64()),
                ("time", pa.float64()),
                ("metrics", pa.struct([(m, pa.int64()) for m in dict.fromkeys(metrics)])),
                ("collected", pa.bool_()),
                ("note", pa.string()),
            ]
        )
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
        stream = io.BufferedReader(_Range(fd, start, stop), _BLOCK)
        try:
            reader = pj.open_json(
                stream,
                read_options=pj.ReadOptions(block_size=_BLOCK),
                parse_options=options,
                memory_pool=pa.system_memory_pool(),
            )
            for batch in reader:
                if not _add_batch(store, batch):
                    return None
        except (pa.ArrowException, ValueError, OverflowError):
            return None
    return Timeline(header, store, torn, end)


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
        if not isinstance(end, dict) or not isinstance(end.get("error"), (str, type(None))):
            return None, None, 0
        return last_start, end, 0
    return size, None, 0


def _has_unusual_lines(fd: int, start: int, stop: int) -> bool:
    """Empty lines, end records or NaN among the sample lines: the line reader's to judge."""
    at, overlap = start, b""
    while at < stop:
        chunk = overlap + os.pread(fd, min(_BLOCK * 8, stop - at), at)
        at += len(chunk) - len(overlap)
        if b"\n\n" in chunk or b"leakgate_end" in chunk or chunk.startswith(b"\n"):
            return True
        overlap = chunk[-16:]
    return False


def _add_batch(store: SampleStore, batch: Any) -> bool:
    """Append one record batch; False when it holds what a sample may not (a missing label,
    a null where a value is required, a reading of more than 2**63 bytes)."""
    import numpy as np
    import pyarrow.compute as pc

    n = batch.num_rows
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    if columns["label"].null_count or columns["time"].null_count:
        return False
    if columns["collected"].null_count or columns["metrics"].null_count:
        return False
    texts = {}
    for name in ("label", "phase"):
        encoded = pc.dictionary_encode(columns[name])
        table = encoded.dictionary.to_pylist()
        codes = encoded.indices.fill_null(len(table)).to_numpy(zero_copy_only=False)
        texts[name] = ([*table, None], codes)
    label, phase = texts["label"], texts["phase"]
    numbers = {}
    for name in ("epoch", "batch"):
        column = columns[name]
        values = column.fill_null(NONE).to_numpy(zero_copy_only=False)
        if int((values == NONE).sum()) != column.null_count:
            return False  # -2**63 itself: the line reader keeps it
        numbers[name] = values
    time = columns["time"].to_numpy(zero_copy_only=False)
    if not bool(np.isfinite(time).all()):
        return False
    readings = {}
    struct = columns["metrics"]
    for i, field in enumerate(struct.type):
        column = struct.field(i)
        values = column.fill_null(NONE).to_numpy(zero_copy_only=False)
        if int((values == NONE).sum()) != column.null_count:
            return False
        readings[field.name] = values
    notes = {}
    if columns["note"].null_count < n:
        note = columns["note"]
        for at in np.flatnonzero(note.is_valid().to_numpy(zero_copy_only=False)).tolist():
            notes[at] = note[at].as_py()
    collected = columns["collected"].to_numpy(zero_copy_only=False)
    store.extend_columns(
        label[0],
        label[1],
        phase[0],
        phase[1],
        numbers["epoch"],
        numbers["batch"],
        time,
        collected,
        readings,
        notes,
    )
    return True


def check_header(header: Mapping[str, Any]) -> None:
    """Check what is read from a header: nesting, numbers JSON cannot round-trip, and the
    types of ``meta``, ``config``, ``rules``, ``run_id``, ``started`` and ``capacity``.

    Raises ``ValueError`` whose message starts with the field's path (``.meta.rules``)."""
    check_tree(header)
    for key in ("meta", "config", "rules"):
        expect(header.get(key), (Mapping, type(None)), f".{key}", "an object")
    meta = header.get("meta")
    if isinstance(meta, Mapping):
        expect(meta.get("rules"), (Mapping, type(None)), ".meta.rules", "an object")
        expect(meta.get("test"), (str, type(None)), ".meta.test", "a string")
    expect(header.get("run_id"), (str, type(None)), ".run_id", "a string")
    for key in ("started", "capacity"):
        value = header.get(key)
        if value is not None and (finite_number(value) is None or abs(value) > MAX_BYTES):
            raise ValueError(f".{key}: expected a finite number, got {shown(value)}")
    stored = [(".rules", header.get("rules"))]
    if isinstance(meta, Mapping):
        stored.append((".meta.rules", meta.get("rules")))
    for where, rules in stored:
        if not isinstance(rules, Mapping):
            continue
        for name in size_fields():
            value = rules.get(name)
            if value is not None:
                _check_size(value, f"{where}.{name}")


def sample_of(record: Any) -> Sample:
    """A sample from one timeline line, its fields checked.

    Raises ``ValueError`` whose message starts with the field (``.metrics.rss``)."""
    if not isinstance(record, dict):
        raise ValueError(f": expected an object, got {shown(record)}")
    label = record.get("label")
    if not isinstance(label, str):
        raise ValueError(f".label: expected a string, got {shown(label)}")
    expect(record.get("phase"), (str, type(None)), ".phase", "a string")
    expect(record.get("note"), (str, type(None)), ".note", "a string")
    expect(record.get("collected", False), (bool,), ".collected", "true or false")
    for key in ("epoch", "batch"):
        value = record.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_BYTES
        ):
            raise ValueError(f".{key}: expected a whole number, got {shown(value)}")
    if "time" in record and finite_number(record["time"]) is None:
        raise ValueError(f".time: expected a finite number, got {shown(record['time'])}")
    metrics = record.get("metrics")
    expect(metrics, (dict, type(None)), ".metrics", "an object")
    for name, value in (metrics or {}).items():
        if value is not None and (finite_number(value) is None or abs(value) > MAX_BYTES):
            raise ValueError(f".metrics.{name}: expected bytes or null, got {shown(value)}")
    return Sample.from_dict(record)


def _check_size(value: Any, where: str) -> None:
    try:
        size = parse_size(value, what=where)
    except (ValueError, ArithmeticError):
        raise ValueError(f"{where}: not a size: {shown(value)}") from None
    if size > MAX_BYTES:
        raise ValueError(f"{where}: {shown(value)} is more than 2**63 bytes")


def check_tree(root: Any) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and integers beyond a float's range; the
    error names where (its first four steps)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack:
        value, steps = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                raise ValueError(f"{_path(steps)}: an integer beyond a float's range") from None
        elif isinstance(value, (dict, list)):
            if len(steps) >= MAX_DEPTH:
                raise ValueError(f"{_path(steps)}: nested more than {MAX_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                step = f".{key}" if isinstance(value, dict) else f"[{key}]"
                stack.append((item, (*steps, step)))


def _path(steps: tuple[str, ...]) -> str:
    return "".join(steps[:4]) + ("..." if len(steps) > 4 else "")


def expect(value: Any, types: tuple[type, ...], where: str, wanted: str) -> None:
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ValueError(f"{where}: expected {wanted}, got {shown(value)}")


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float; None for anything else (bools, text, inf, huge ints)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: Any) -> str:
    """A value for a one-line message: its type, and its text when short."""
    kind = {dict: "an object", list: "a list", type(None): "null"}.get(type(value))
    if kind is not None:
        return kind
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__} {text[:30]}..."
