"""Writing the JSONL timeline: one header line, then one line per sample, each written whole
(its keys and their encoding follow :data:`harness._measure.sample.FIELDS`).

Each line is copied into a window of the file mapped into memory (:data:`WINDOW` bytes over
its end, moved on as it fills), not written with a system call: the page cache holds the bytes
as soon as they are copied, so a process killed mid-run (even by SIGKILL or the OOM killer)
leaves complete lines that all parse, plus at most its last write cut short (a copy need not
make its bytes in order) and the zeros reserved past it, which
:func:`~harness._timeline.jsonl.read_timeline` reads as the file's end. One kind of
line waits in memory: a loop's batch between two stride readings
(:data:`~harness._measure.sample.STRIDE`) has its line written with the next line, so SIGKILL loses
those of the batches after the last reading (fewer than the stride's step), never a reading. Only a
machine that goes down loses the lines its disk had not been given. The space a window needs is
reserved before it is mapped (``posix_fallocate``), so a full disk or a file size limit is an
``OSError`` there, never a ``SIGBUS``; at a phase's end (a sample whose ``edge`` is ``END``)
and on close the file is cut back to the bytes written. Pages written are dropped from the
process's mapping every :data:`RELEASED` bytes (the page cache keeps them), so the timeline
adds at most that much to the process's resident memory, never a growth a rule could judge.

The file is created as a new one, never through a link, and held locked while the run lives;
what happens when its name is taken is :mod:`harness._timeline.claim`'s.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import operator
import os
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import harness._measure.sample as schema
from harness._core.fsio import make_folders
from harness._core.labels import END, Raised
from harness._measure.sample import FORMAT, METRICS, Field, Sample, line_order
from harness._timeline.claim import claim, write_all

WINDOW = 1 << 16
"""Bytes of the timeline mapped at a time (a line longer than that gets a window its size)."""
RELEASED = 1 << 14
"""Bytes written between two releases of the window's written pages from resident memory."""
_UNRESERVED = {errno.EOPNOTSUPP, errno.EINVAL}
"""``posix_fallocate``'s errors on a file system that cannot reserve: the file is extended."""

_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def _encode(record: Mapping[str, Any]) -> bytes:
    """One line; values JSON cannot hold (paths, dtypes in a config) are written as text."""
    return (_ENCODER.encode(record) + "\n").encode()


def _any_line(sample: Sample) -> bytes:
    """``sample``'s line by the encoder's generic path, whatever its values' types."""
    return _encode({**sample.__dict__, "metrics": dict(sample.metrics)})


Encoder = Callable[[Any], str | None]


def _whole(value: Any) -> str | None:
    return str(value) if type(value) is int else None


def _finite(value: Any) -> str | None:
    return float.__repr__(value) if type(value) is float and math.isfinite(value) else None


def _flag(value: Any) -> str | None:
    return ("true" if value else "false") if type(value) is bool else None


def _string(value: Any) -> str | None:
    return _ENCODER.encode(value) if type(value) is str else None


def _readings(metrics: Any) -> str | None:
    readings = []
    for name, value in metrics.items():
        if type(name) is not str or (value is not None and type(value) is not int):
            return None
        readings.append(f"{_ENCODER.encode(name)}:{'null' if value is None else value}")
    return f"{{{','.join(readings)}}}"


_KINDS: dict[str, Encoder] = {
    "text": _string,
    "int": _whole,
    "float": _finite,
    "bool": _flag,
    "note": _string,
}
"""Each kind of field's JSON text, or None for a value not of the types built here."""
_NULLABLE = {"text", "int", "note"}
"""The kinds whose fields may be None (a text field only when it is not required)."""

Plan = list[tuple[str, str, Encoder, bool]]


def _encoders(fields: tuple[Field, ...]) -> Plan:
    """Each key of a sample line: its name, its JSON text with the colon, its encoder, and
    whether it may be null."""
    kinds = {f.name: f for f in fields}
    plan: Plan = []
    for name in line_order(fields):
        if name == METRICS:
            plan.append((name, f'"{name}":', _readings, False))
            continue
        f = kinds[name]
        plan.append((name, f'"{name}":', _KINDS[f.kind], f.kind in _NULLABLE and not f.required))
    return plan


_KEPT = ("text", "bool", "note")
"""Kinds whose values repeat from line to line (a label, a phase, a flag): a line's text for
them is built once per combination met."""
_MAX_FRAMES = 256
"""Combinations kept: few, so the writer's memory never grows with a run."""


class _LineFormat:
    """A recorder's sample line, the one built by hand: the text of the fields of
    :data:`_KEPT` kinds is built once for each combination of their values met (a line's
    *frame*), with a slot for each number and reading filled at every line. The bytes are those
    :func:`_encode` writes for the same sample (the general path every other line takes), in
    about a quarter of its time."""

    def __init__(self, fields: tuple[Field, ...]) -> None:
        self.plan = _encoders(fields)
        kinds = {f.name: f.kind for f in fields}
        kept = [name for name, *_ in self.plan if kinds.get(name) in _KEPT]
        getter = operator.itemgetter(*kept) if kept else (lambda values: ())
        self._kept = getter if len(kept) != 1 else (lambda values: (getter(values),))
        self._numbers = [e for e in self.plan if e[0] not in kept and e[0] != METRICS]
        numbers = operator.itemgetter(*(entry[0] for entry in self._numbers))
        self._number_values = numbers if len(self._numbers) > 1 else lambda v: (numbers(v),)
        self._recorded: dict[Any, tuple[tuple[str, ...], str]] = {}
        self._unread: dict[Any, tuple[tuple[str, ...], str]] = {}

    def recorded(self, sample: Sample, unread: bool = False) -> bytes | None:
        """The line of a sample whose numbers are ints, finite floats or None and whose
        readings are ints or None, as the recorder's are (None where a kept value is not of its
        kind): one frame for each kept value and
        metric names in their order, with a slot for each number and reading, put in as
        ``%s`` writes it (one step for a path that runs on cold caches). ``unread``: none of
        its metrics was read (a loop's batch between two stride readings), and the readings'
        text, the same at every such line, is in the frame."""
        frames = self._unread if unread else self._recorded
        values = sample.__dict__
        kept = self._kept(values)
        found = frames.get(kept)
        names = tuple(sample.metrics)
        if found is None or found[0] != names:
            frame = self._frame(sample, readings=not unread)
            if frame is None:
                return None
            found = (names, frame)
            if len(frames) < _MAX_FRAMES:
                frames[kept] = found
        filled = self._number_values(values)
        if not unread:
            filled += tuple(sample.metrics.values())
        if None in filled:
            filled = tuple("null" if value is None else value for value in filled)
        return (found[1] % filled).encode()

    def _frame(self, sample: Sample, readings: bool) -> str | None:
        """The line with ``%s`` where each number's value goes, and with ``readings`` each
        metric's; None when another value is not of its type."""
        slots = {entry[0] for entry in self._numbers}
        parts = []
        for name, key, encode, nullable in self.plan:
            if name in slots:
                parts.append(key + "%s")
                continue
            if name == METRICS and readings:
                if not all(type(metric) is str for metric in sample.metrics):
                    return None
                texts = (
                    f"{_ENCODER.encode(metric).replace('%', '%%')}:%s" for metric in sample.metrics
                )
                parts.append(f"{key}{{{','.join(texts)}}}")
                continue
            value = sample.__dict__[name]
            text = "null" if value is None and nullable else encode(value)
            if text is None:
                return None
            parts.append(key + text.replace("%", "%%"))
        return f"{{{','.join(parts)}}}\n"


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
                make_folders(wanted.parent)
            except OSError as error:
                raise OSError(error.errno, error.strerror, str(path)) from None
            self.path, fd = claim(wanted, line, header)
        except OSError as error:
            text = f"cannot write the timeline ({error.strerror or error})"
            if error.errno is None:
                raise OSError(f"{text}: {error.filename or path}") from None
            raise OSError(error.errno, text, error.filename or str(path)) from None
        self._file = _Appended(fd)
        self._format = _LineFormat(schema.FIELDS)
        self._waiting: list[Sample] = []  # unread batches whose lines go with the next line
        self.wait = self._waiting.append
        """``wait(sample)``: a loop's batch between two stride readings, none of whose metrics
        was read. Its line waits for the next line written, or the writer's close or end, and
        is built then with the others, on caches that the first leaves warm: a training step
        leaves them cold for each alone."""
        # closed when dropped, like a file, with the waiting lines, and cut to what was written
        self._close = weakref.finalize(self, _finish, self._file, self._format, self._waiting)

    def _write(self, line: bytes) -> None:
        if self._waiting:
            line = _waited(self._format, self._waiting) + line
        try:
            self._file.append(line)
        except OSError as error:
            raise self._failed(error) from None

    def _failed(self, error: OSError) -> OSError:
        return OSError(error.errno, f"cannot write the timeline ({error.strerror})", str(self.path))

    def write(self, sample: Sample) -> None:
        """Append one sample line, ``sample.to_dict()`` encoded. A phase's end cuts the file
        back to its lines."""
        self._append(_any_line(sample), sample)

    def write_recorded(self, sample: Sample) -> None:
        """:meth:`write` for a sample a recorder made, its line built from a kept frame
        (:class:`_LineFormat`): the general encoder's path costs several times more per
        checkpoint."""
        self._append(self._format.recorded(sample) or _any_line(sample), sample)

    def _append(self, line: bytes, sample: Sample) -> None:
        self._write(line)
        if sample.edge == END:
            self._trim()

    def _trim(self) -> None:
        try:
            self._file.trim()
        except OSError as error:
            raise self._failed(error) from None

    def end(self, error: Raised | None, details: Mapping[str, Any] | None = None) -> None:
        """Write the end record: the run finished (``error``: what it raised, if anything, its
        type and message apart), with ``details``: what its report needs to be rebuilt (rules,
        holders, shares) and the metrics the samples held beyond the header's (``metrics``:
        children's roles, known only as they came), so that the columnar reader can declare
        them."""
        raised = None if error is None else {"type": error.type, "message": error.message}
        self._write(_encode({"leakgate_end": {"error": raised, **(details or {})}}))
        self._trim()

    def close(self) -> None:
        """Write the lines still waiting, cut the file to the bytes written and close it,
        which ends this writer's hold on its name."""
        try:
            if self._waiting and os.getpid() == self._file.owner:
                self._write(b"")
        finally:
            self._close()


def _waited(line_format: _LineFormat, waiting: list[Sample]) -> bytes:
    """The lines of the unread batches ``waiting``, which it empties."""
    lines = [line_format.recorded(sample, unread=True) or _any_line(sample) for sample in waiting]
    waiting.clear()
    return b"".join(lines)


def _finish(file: _Appended, line_format: _LineFormat, waiting: list[Sample]) -> None:
    """Close ``file`` (a writer dropped, or the interpreter's exit), with the lines still
    ``waiting`` where they can be written, and only by the process that made them: a forked
    copy's file and lines are its parent's."""
    try:
        if waiting and os.getpid() == file.owner:
            file.append(_waited(line_format, waiting))
    except OSError:
        pass  # a full disk, say: the file keeps the lines it had
    finally:
        file.close()


class _Appended:
    """A file appended to through a window mapped over its end (see the module's notes), from
    where its descriptor ``fd`` stands. Where the file cannot be reopened for mapping (no
    ``/proc``), each line is written with ``os.write`` instead."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.at = self.size = os.lseek(fd, 0, os.SEEK_CUR)  # bytes written; the file's length
        self.window: mmap.mmap | None = None
        self.base = 0  # where the window starts in the file
        self.mapped = _read_write(fd)
        self.owner = os.getpid()  # a forked child's copy never cuts the file its parent writes
        self.release_at = self.at + RELEASED

    def append(self, line: bytes) -> None:
        end = self.at + len(line)
        window = self.window
        if window is None or end > self.size or end - self.base > len(window):
            if self.mapped is None:
                write_all(self.fd, line)
                self.at = self.size = end
                return
            window = self._reach(end)
        window[self.at - self.base : end - self.base] = line
        self.at = end
        if end >= self.release_at:
            self._release(window)

    def _release(self, window: mmap.mmap) -> None:
        """Drop the window's pages below the one being written from the process's resident
        memory (the file keeps them), so that the timeline never reads as the run's growth."""
        done = (self.at - self.base) // mmap.PAGESIZE * mmap.PAGESIZE
        window.madvise(mmap.MADV_DONTNEED, 0, done)
        self.release_at = self.base + done + RELEASED

    def _reach(self, end: int) -> mmap.mmap:
        """The window, moved on when bytes ``at`` to ``end`` fall beyond it, their space
        reserved."""
        assert self.mapped is not None
        window = self.window
        if window is not None and end - self.base <= len(window):
            self._reserve(self.base + len(window))
            return window
        base = self.at - self.at % mmap.ALLOCATIONGRANULARITY
        length = max(WINDOW, -(-(end - base) // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._reserve(base + length)
        self.window = None
        if window is not None:
            window.close()
        self.window = mmap.mmap(self.mapped, length, offset=base)
        self.base = base
        self.release_at = self.at + RELEASED
        return self.window

    def _reserve(self, stop: int) -> None:
        """The file at least ``stop`` bytes long, its blocks allocated where the file system
        can: a full disk raises ``ENOSPC`` here, not a ``SIGBUS`` at a copy."""
        if stop <= self.size:
            return
        try:
            os.posix_fallocate(self.fd, self.size, stop - self.size)
        except OSError as error:
            if error.errno not in _UNRESERVED:
                raise
            os.ftruncate(self.fd, stop)
        self.size = stop

    def trim(self) -> None:
        """Cut the file back to the bytes written."""
        if self.size > self.at:
            os.ftruncate(self.fd, self.at)
            self.size = self.at

    def close(self) -> None:
        try:
            if os.getpid() == self.owner:
                self.trim()
        finally:
            if self.window is not None:
                self.window.close()
            if self.mapped is not None:
                os.close(self.mapped)
            os.close(self.fd)


def _read_write(fd: int) -> int | None:
    """A descriptor that reads and writes the file ``fd`` (written only) opened, which mapping
    needs; None where it cannot be had."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
