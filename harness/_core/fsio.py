"""Writing files so that a reader, a crash or a full disk never sees half of one.

:func:`write_atomic` writes a whole file or nothing: the bytes go to a new temporary file in
the target's own folder, are flushed to disk, and the temporary file is renamed over the
target. A failed write (a full disk, a killed process) leaves the previous file as it was. The
rename replaces whatever entry has the target's name, a symbolic link included: nothing is ever
written through a link to a file elsewhere.

:func:`create_exclusive` opens a new file for streaming (a timeline): it fails when anything,
a link included, already has the name, so a run never appends to or truncates another's file.

:func:`write_output` writes a file a user named: ``/dev/stdout``, ``/dev/stderr`` and
``/dev/fd/N`` are this process's own descriptors and are written to as they are (reopening one
that is redirected to a file would write over the file from its start); a character device or a
FIFO (``/dev/null``, a link to one) is written as a stream, since a rename would replace it;
anything else behind a link is refused, never replaced; a regular file or a new name is written
atomically. :func:`output_kind` says which, before any work is done.

:func:`make_folders` makes a folder and its missing parents, one level after another (no
recursion, however deep the path); :func:`make_folder` also refuses a link in its place.
:func:`probe_folder` says, before any work is done, whether a folder could be made or written
into, by making and removing one entry where the real write would make its first.

:func:`open_regular` and :func:`read_regular` open an input only when it is a regular file: a
FIFO would block the reader until some writer came, ``/dev/zero`` would never end, a socket
cannot be read at all. Every input the commands read goes through them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Literal

EXCLUSIVE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_CLOEXEC
"""Flags of :func:`create_exclusive`: a new file, never one (or a link) already there."""
OWN_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}
"""The names of this process's own output streams, besides ``/dev/fd/N``."""
_OWN_FD = re.compile(r"/(?:dev/fd|proc/self/fd)/(\d+)")

_umask: int | None = None


def file_mode() -> int:
    """The mode a new file gets under this process's umask (``0o644`` under ``022``)."""
    global _umask
    if _umask is None:
        _umask = _read_umask()
    return 0o666 & ~_umask


def _read_umask() -> int:
    """The umask, read from ``/proc`` where it can be (setting it, the only portable way to
    read it, briefly changes it for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8), whole or not at all.

    Raises ``OSError`` whose ``filename`` is ``path`` when the folder cannot be written, the
    disk is full, or ``path`` is a folder; the previous file, if any, is then unchanged and no
    temporary file is left behind.
    """
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    folder = target.parent
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{target.name[:200]}.", suffix=".tmp")
    except OSError as error:
        raise _naming(error, target) from None
    try:
        try:
            os.fchmod(fd, file_mode())
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise _naming(error, target) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_folder(folder)
    return target


def create_exclusive(path: str | os.PathLike[str]) -> int:
    """Open a new file at ``path`` for writing and return its descriptor.

    Raises ``FileExistsError`` when anything has that name (a file, a folder, a symbolic link,
    even a dangling one), and ``OSError`` naming ``path`` when it cannot be created.
    """
    try:
        return os.open(path, EXCLUSIVE, file_mode())
    except OSError as error:
        raise _naming(error, Path(path)) from None


def output_kind(path: str | os.PathLike[str]) -> Literal["descriptor", "stream", "file"]:
    """How :func:`write_output` writes ``path``: ``"descriptor"`` for this process's own stream
    (:func:`own_descriptor`), ``"stream"`` for a character device or a FIFO (links followed),
    ``"file"`` for a regular file or a new name.

    Raises ``OSError`` naming ``path`` for what neither fits: a descriptor that is not open for
    writing, a folder, a socket, a block device, or a link to anything but a stream (replacing
    the link would lose it, following it would write through it).
    """
    fd = own_descriptor(path)
    if fd is not None:
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError as error:
            raise _naming(error, Path(path)) from None
        if flags & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, f"descriptor {fd} is not open for writing", str(path))
        return "descriptor"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "file"
    except OSError as error:
        raise _naming(error, Path(path)) from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            raise OSError(errno.ELOOP, "a link to nothing, never replaced", str(path)) from None
        if not _is_stream(mode):
            raise OSError(errno.ELOOP, f"a link to {_kind(mode)}, never replaced", str(path))
    if not _is_stream(mode):
        _check_regular(mode, path)
    return "stream"


def own_descriptor(path: str | os.PathLike[str]) -> int | None:
    """The descriptor ``path`` names when it is one of this process's own streams
    (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``), else None."""
    text = os.path.normpath(os.fspath(path))
    if text in OWN_STREAMS:
        return OWN_STREAMS[text]
    found = _OWN_FD.fullmatch(text)
    return None if found is None else int(found.group(1))


def write_output(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` as :func:`output_kind` says: to this process's own
    descriptor, through to a stream, or atomically (:func:`write_atomic`). Raises ``OSError``
    naming ``path``."""
    if output_kind(path) == "file":
        return write_atomic(path, data)
    payload = data.encode() if isinstance(data, str) else data
    own = own_descriptor(path)
    if own is not None:
        for stream in (sys.stdout, sys.stderr):  # what Python holds for them goes first
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        try:
            _write_all(own, payload)
        except OSError as error:
            raise _naming(error, Path(path)) from None
        return Path(path)
    try:
        # Without blocking: a FIFO that nobody reads is refused (ENXIO), never waited on.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise _naming(error, Path(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not _is_stream(mode):  # swapped for something else since it was looked at
            raise OSError(errno.EINVAL, f"{_kind(mode)}, not a stream", str(path))
        os.set_blocking(fd, True)
        _write_all(fd, payload)
    except OSError as error:
        raise _naming(error, Path(path)) from None
    finally:
        os.close(fd)
    return Path(path)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def make_folder(path: str | os.PathLike[str]) -> Path:
    """Make the folder ``path`` (and its parents) unless it is there; ``OSError`` naming it
    when a link (even to a folder) or anything but a folder has its name: what is written
    into it stays where it was meant to be."""
    folder = Path(path)
    try:
        make_folders(folder)
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise OSError(errno.ELOOP, "a link, never followed", str(folder))
    except OSError as error:
        raise _naming(error, folder) from None
    return folder


def make_folders(path: str | os.PathLike[str]) -> Path:
    """Make the folder ``path`` and its missing parents (``mkdir -p``), from the nearest one
    there down, level by level: no recursion, however many levels. ``OSError`` naming the
    entry that could not be made (``FileExistsError`` for a file in a folder's place)."""
    folder = Path(path)
    missing = []
    for entry in (folder, *folder.parents):
        if os.path.isdir(entry):
            break
        missing.append(entry)
    for entry in reversed(missing):
        try:
            os.mkdir(entry)
        except FileExistsError:
            if not os.path.isdir(entry):
                raise
    return folder


def probe_folder(path: str | os.PathLike[str]) -> None:
    """Raise ``OSError`` naming the nearest entry of ``path`` that is there when a file could
    not be written into the folder ``path`` (made with its parents where missing): that entry
    is not a folder (``a_file/sub``), or it takes no new entry (``/proc/x``, a read-only
    folder). It is asked by making and removing one entry there, as the write would: a file
    when ``path`` is there, else a folder; nothing is left behind."""
    folder = Path(path)
    nearest = folder
    while not os.path.lexists(nearest) and nearest != nearest.parent:
        nearest = nearest.parent
    if not os.path.isdir(nearest):
        raise OSError(errno.ENOTDIR, "not a folder", str(nearest))
    try:
        if nearest == folder:
            fd, made = tempfile.mkstemp(dir=nearest, prefix=".leakgate-probe-")
            os.close(fd)
            os.unlink(made)
        else:
            os.rmdir(tempfile.mkdtemp(dir=nearest, prefix=".leakgate-probe-"))
    except OSError as error:
        raise _naming(error, nearest) from None


def _is_stream(mode: int) -> bool:
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open ``path`` for reading in binary, links followed, when it is a regular file.

    Raises ``OSError`` naming ``path`` before anything blocks (:func:`check_regular`). The kind
    is checked before opening (opening a device can act on it) and again on the open
    descriptor, which is opened without blocking (a FIFO swapped in between is caught, not
    waited on).
    """
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise _naming(error, Path(path)) from None
    try:
        _check_regular(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike[str]) -> None:
    """Raise ``OSError`` naming ``path`` unless it is a regular file (links followed):
    ``IsADirectoryError`` for a folder, and one whose ``strerror`` says what it is (``a FIFO,
    not a regular file``) for a FIFO, a socket or a device."""
    try:
        _check_regular(os.stat(path).st_mode, path)
    except OSError as error:
        raise _naming(error, Path(path)) from None


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The bytes of ``path``, a regular file (see :func:`open_regular`)."""
    with open_regular(path) as file:
        return file.read()


def _check_regular(mode: int, path: str | os.PathLike[str]) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    raise OSError(errno.EINVAL, f"{_kind(mode)}, not a regular file", str(path))


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in words: ``a regular file``, ``a FIFO``..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def would_replace(output: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether writing ``output`` with :func:`write_atomic` would replace ``path`` or the file
    it names: the same folder entry (folders' links followed), ``path`` being a link to that
    entry, or ``output`` being another hard link to ``path``'s file.

    A link planted at ``output`` itself is not followed (the write replaces the link), so it
    does not count.
    """
    target = _entry(output)
    if target is None:
        return False
    if target == _entry(path):
        return True
    try:
        if target == Path(path).resolve():
            return True
        if not os.path.islink(output) and os.path.exists(output) and os.path.exists(path):
            return os.path.samefile(output, path)
    except (OSError, RuntimeError, ValueError):
        return False
    return False


def same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name one folder: the same path once links are resolved, or the
    same folder on disk (a bind mount, another spelling on a case-insensitive system)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _entry(path: str | os.PathLike[str]) -> Path | None:
    """The folder entry a write to ``path`` replaces: its folder resolved, its name as given."""
    given = Path(path)
    try:
        return given.parent.resolve() / given.name
    except (OSError, RuntimeError, ValueError):
        return None


def _naming(error: OSError, path: Path) -> OSError:
    """``error`` with ``path`` as its file name (the right subclass: ``FileExistsError``...)."""
    if error.errno is None:
        return OSError(f"{path}: {error}")
    return OSError(error.errno, error.strerror or os.strerror(error.errno), str(path))


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entry of a renamed file to disk; best effort (some systems refuse)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
