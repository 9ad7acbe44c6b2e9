"""Whose timeline file it is: how a writer claims its name.

A writer creates its timeline as a new file (``O_CREAT | O_EXCL |
O_NOFOLLOW``) and holds an exclusive ``flock`` on it until it closes, so a live run's file can
be told from a finished one's. When the name asked for, ``<name>.jsonl``, is taken:

- by a timeline no live writer holds (an earlier run of the same test, finished or killed):
  a new file, header written, is renamed over it, as a rerun replaces that run's report and
  verdict. The earlier file's bytes are never appended to or truncated;
- by a timeline a live writer holds (a second session running the same test into the same
  folder), or by an empty file (a writer between creating and locking it): the new timeline
  is ``<name>.<run id>.jsonl`` (the first 12 characters of the header's ``run_id``), also
  created exclusively. The writer's ``path`` says which name was used; the run's report and
  verdict should take its stem, so that the two runs keep their own files;
- by a symbolic link, a folder, or anything but a regular file: ``FileExistsError`` naming the
  path, and nothing is written (a link is never followed).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness._core.fsio import create_exclusive, file_mode

_RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
_ID_CHARS = 12
_ATTEMPTS = 3


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _run_id(header: Mapping[str, Any]) -> str:
    """The part of the header's run id a second name takes (a fresh one when it has none)."""
    given = header.get("run_id")
    if isinstance(given, str) and _RUN_ID.fullmatch(given):
        return given[:_ID_CHARS]
    return uuid.uuid4().hex[:_ID_CHARS]


def claim(wanted: Path, line: bytes, header: Mapping[str, Any]) -> tuple[Path, int]:
    """Create the timeline, ``line`` (its header) written and locked: at ``wanted`` when it is
    free or holds a finished run's timeline, else at the name of ``header``'s run id. Returns
    the path and descriptor."""
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
    other = wanted.with_name(f"{wanted.stem}.{_run_id(header)}{wanted.suffix}")
    fd = create_exclusive(other)
    _begin(fd, line, other)
    return other, fd


def _begin(fd: int, line: bytes, path: Path) -> None:
    """Lock a new timeline and write its header; on failure close it and remove ``path``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        write_all(fd, line)
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
