"""A heap board's folder: private to its maker, in ``/dev/shm`` where there is one, held by a
*lease* (an exclusive ``flock`` on the folder) while its maker or a child that inherited the
descriptor lives, and removed by the next board made on the machine once it is provably dead.
``run_ranks``' working folders are leased and removed the same way, under a prefix of their own."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

PREFIX = "leakgate-heap-"


def leased_folder(prefix: str = PREFIX, parent: str | None = None) -> tuple[str, int]:
    """A new, private folder named ``prefix<pid>-...`` and its lease, after removing the dead
    ones of that prefix beside it; ``OSError`` when none can be made. ``parent`` defaults to
    ``/dev/shm`` where it can be written, else the temporary folder."""
    if parent is None:
        shm = "/dev/shm"
        parent = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    remove_orphans(parent, prefix)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    return path, _lease(path)


def remove_orphans(parent: str, prefix: str = PREFIX) -> None:
    """Remove this user's folders of ``prefix`` (boards by default) that are provably dead:
    their owner's pid is not a live process here and no process holds their lease (a board
    made in another pid namespace that shares this ``/dev/shm`` has a pid that means nothing
    here, and a lease that says it lives). An odd name is left alone."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name[len(prefix) :].partition("-")[0]
        with contextlib.suppress(OSError, ValueError, OverflowError):
            mine = entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid()
            if mine and not _alive(int(pid)):
                lease = _lease(entry.path)  # OSError while its owner, anywhere, holds it
                try:
                    shutil.rmtree(entry.path, ignore_errors=True)
                finally:
                    os.close(lease)


def _lease(path: str) -> int:
    """A board's lease: an exclusive ``flock`` on its folder, held by its maker (and by the
    children that inherit the descriptor) for as long as any of them lives; ``OSError`` while
    another process holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
