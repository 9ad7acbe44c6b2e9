"""The JSONL timeline: one header line, then one line per sample, then the end record.

Three rooms: :mod:`harness._timeline.writer` writes it (whose file it is, lines copied into
a mapped file), :mod:`harness._timeline.checks` says what a line may hold,
:mod:`harness._timeline.columns` reads a large file in columns. This module reads a timeline
(:func:`read_timeline`), line by line where it must (:func:`read_lines`), and keeps the
names callers import.

:func:`read_timeline` checks every line it returns: a header that is an object of a format
version it reads, and samples whose fields have their types (:class:`~harness._core.errors.BadInput`
naming the file, the line and the field).
"""

from __future__ import annotations

import json
import os
from typing import Any

import harness._timeline.columns as timeline_columns
from harness._core.errors import BadInput
from harness._core.fsio import open_regular, read_regular
from harness._core.json_values import MAX_DEPTH, check_tree, expect, finite_number, shown
from harness._measure.sample import FORMAT
from harness._timeline.checks import (
    INT64_BOUND,
    READS,
    Timeline,
    check_end,
    check_header,
    is_int64,
    sample_of,
)
from harness._timeline.writer import TimelineWriter

__all__ = [
    "FORMAT",
    "INT64_BOUND",
    "MAX_DEPTH",
    "READS",
    "Timeline",
    "TimelineWriter",
    "check_header",
    "check_tree",
    "expect",
    "finite_number",
    "is_int64",
    "read_lines",
    "read_timeline",
    "sample_of",
    "shown",
]


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a timeline; a last line cut short by a killed writer is skipped and counted, and
    the first zero byte, which such a writer reserved past its lines or left in its last write,
    ends the file.

    Raises :class:`~harness._core.errors.BadInput` (one line: the file, the line, the field) when
    the file has no header, a format version it does not read, a line before the last is
    damaged, or a line's fields do not have their types; ``OSError`` when it cannot be read.

    From :data:`~harness._timeline.columns.COLUMNS_FROM` bytes on, the file is read in columns
    (:mod:`harness._timeline.columns`); anything that reader cannot describe exactly (a field of
    the wrong type, an unknown field, a number beyond 64 bits, an empty line) sends the whole
    file through :func:`read_lines`, which names the line and field at fault.
    """
    with open_regular(path) as file:
        fast = timeline_columns.read_columns(file)
        if fast is not None:
            return fast
        file.seek(0)
        return read_lines(path, file.read())


def read_lines(path: str | os.PathLike[str], data: bytes | None = None) -> Timeline:
    """:func:`read_timeline`'s line-by-line reader: every line parsed and checked on its own,
    so that an error names its line and field. ``data`` is the file's bytes when the caller
    has read them already."""
    data = read_regular(path) if data is None else data
    data, torn = _before_zeros(data)
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    records: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append((number, json.loads(line)))
        except RecursionError:
            raise BadInput("nested too deeply", path=path, line=number) from None
        except ValueError:
            if number < len(lines):
                raise BadInput("not a JSON line", path=path, line=number) from None
            torn = 1
    if (
        not records
        or not isinstance(records[0][1], dict)
        or "leakgate_timeline" not in records[0][1]
    ):
        raise BadInput("not a leakgate timeline (no header line)", path=path)
    (_, header), *rest = records
    try:
        check_header(header)
    except BadInput as exc:
        raise _located(exc, path, 1, "header") from None
    samples = []
    end = None
    for number, record in rest:
        if end is not None:
            raise BadInput("a line after the end record", path=path, line=number)
        if isinstance(record, dict) and "leakgate_end" in record:
            end = record["leakgate_end"]
            try:
                check_end(end)
            except BadInput as exc:
                raise _located(exc, path, number, "end record") from None
            continue
        try:
            samples.append(sample_of(record, header["leakgate_timeline"]))
        except BadInput as exc:
            raise _located(exc, path, number, "sample") from None
    return Timeline(header, samples, torn, end)


def _before_zeros(data: bytes) -> tuple[bytes, int]:
    """``data`` up to the line that holds its first zero byte, and whether that line had
    anything else (1: torn). A line never holds one (JSON escapes it): zeros are what the writer
    reserved past its lines, and, where it was killed in the middle of a write, the part of
    that last write not made yet, which can come before bytes of it that were."""
    zero = data.find(b"\0")
    if zero < 0:
        return data, 0
    start = data.rfind(b"\n", 0, zero) + 1
    return data[:start], int(bool(data[start:].strip(b"\0\n")))


def _located(exc: BadInput, path: str | os.PathLike[str], line: int, what: str) -> BadInput:
    """``exc`` (about a field of one record) placed at ``path``'s ``line``."""
    return BadInput(exc.problem, path=path, line=line, field=what + (exc.field or ""))
