"""File names the harness makes: a test id as a safe file name, a name a user gives checked to
be one, a path a user gives checked to fit the system's limits, a rank's timeline name, the run
and rank read back from one, and a rebuilt copy's name."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from harness._core.errors import BadArgument

MAX_NAME = 200
"""The longest name :func:`check_file_name` takes: room for a suffix and a temporary file's
prefix within a file system's 255 bytes."""
MAX_COMPONENT = 255
"""The most bytes one entry of a path may have (``NAME_MAX`` on Linux and macOS)."""
MAX_PATH = 4096
"""The most bytes a whole path may have (``PATH_MAX`` on Linux)."""
_RANK_SUFFIX = re.compile(r"[._-]rank(\d+)$")


def safe_name(nodeid: str) -> str:
    """A file name for a test id: no separators or dots to climb with, unique by a hash."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", nodeid.replace(".py::", "__")).strip("_")
    return f"{readable[:80]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:8]}"


def check_file_name(name: Any, what: str = "name") -> str:
    """``name`` when it is a plain file name: one entry of the folder it is written to (no
    separator, not ``.`` or ``..``), not hidden (no leading dot), no control characters, at
    most :data:`MAX_NAME` bytes. :func:`safe_name`'s names all are.

    Raises :class:`~harness._core.errors.BadArgument` starting with ``what`` otherwise."""
    if not isinstance(name, str):
        raise BadArgument(f"{what}: expected a string, got {type(name).__name__}")
    if (
        not name
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or not name.isprintable()
        or len(os.fsencode(name)) > MAX_NAME
    ):
        shown = repr(name) if len(name) <= 40 else repr(name[:30] + "...")
        raise BadArgument(
            f"{what} {shown} is not a plain file name (one folder entry, no leading dot, "
            f"printable, at most {MAX_NAME} bytes)"
        )
    return name


def check_path(given: str | os.PathLike[str], what: str, *, folder: bool = False) -> Path:
    """``given`` as a path when the system can open it: no NUL, no entry over
    :data:`MAX_COMPONENT` bytes, at most :data:`MAX_PATH` bytes as an absolute path, less room
    for one file name (:data:`MAX_NAME`) inside it when it is a ``folder`` to write into.

    Raises :class:`~harness._core.errors.BadArgument` whose ``field`` is ``what``, showing the
    path's start only."""
    text = os.fspath(given) if isinstance(given, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise BadArgument(f"expected a path, got {type(given).__name__}", field=what)
    shown = text if len(text) <= 60 else text[:40] + "..."
    if not text or "\0" in text:
        raise BadArgument("expected a path", path=shown or "''", field=what)
    longest = max((len(os.fsencode(part)) for part in Path(text).parts), default=0)
    if longest > MAX_COMPONENT:
        problem = f"an entry of {longest} bytes; at most {MAX_COMPONENT} fit in a folder"
        raise BadArgument(problem, path=shown, field=what)
    room = MAX_PATH - 1 - (MAX_NAME + 1 if folder else 0)
    size = len(os.fsencode(os.path.abspath(text)))
    if size > room:
        problem = f"{size} bytes as an absolute path; at most {room} fit"
        raise BadArgument(problem, path=shown, field=what)
    return Path(text)


def rank_timeline(path: str | os.PathLike[str], rank: int) -> Path:
    """``<stem>.rank<N><suffix>`` for ``path``; unchanged when its stem already names that rank
    (``run.rank1.jsonl``, ``run-rank1.jsonl``)."""
    path = Path(path)
    found = _RANK_SUFFIX.search(path.stem)
    if found is not None and int(found.group(1)) == rank:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def run_name(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """``("run", 1)`` for ``.../run.rank1.jsonl``; None for a name without a rank."""
    stem = Path(path).stem
    found = re.fullmatch(r"(.+)\.rank(\d+)", stem)
    return (found.group(1), int(found.group(2))) if found else None


REBUILT = ".rebuilt"
"""The mark of a report and verdict rebuilt from a timeline beside the run's own."""


def rebuilt(path: str | os.PathLike[str]) -> Path:
    """``<stem>.rebuilt<suffix>`` for ``path``: a rebuilt copy's name beside the original."""
    path = Path(path)
    return path.with_name(f"{path.stem}{REBUILT}{path.suffix}")


def is_rebuilt(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a rebuilt copy (``x.rebuilt.json``), not a run's own file."""
    return Path(path).stem.endswith(REBUILT)
