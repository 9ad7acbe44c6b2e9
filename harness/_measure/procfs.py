"""Reading ``/proc``: a file's bytes, a process's resident anonymous memory and its
``smaps_rollup``, and its live descendants.

Off Linux (no ``/proc``) every reader answers None or nothing; callers say so.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

from harness._measure.malloc import libc_function

PROC = "/proc"
_ROLLUP_FIELDS = {
    b"Pss": "pss",
    b"Private_Clean": "uss",
    b"Private_Dirty": "uss",
    b"Shared_Clean": "shared",
    b"Shared_Dirty": "shared",
}


def read(path: str) -> bytes | None:
    """A ``/proc`` file's bytes (unbuffered, a third of ``open``'s cost), ``None`` when gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_anon(pid: int) -> int | None:
    """``pid``'s resident anonymous bytes, private or shared (``RssAnon + RssShmem`` of its
    ``status``: an anonymous shared mapping is shared memory), or ``None`` when it has exited
    (a zombie has no memory lines) or cannot be read."""
    text = read(f"{PROC}/{pid}/status") or b""
    total = 0
    for name in (b"\nRssAnon:", b"\nRssShmem:"):
        at = text.find(name)
        if at < 0:
            return None
        total += int(text[at + len(name) : text.index(b"kB", at)]) * 1024
    return total or None


def read_rollup(pid: int) -> tuple[int, int, int] | None:
    """``(uss, pss, shared)`` of ``pid`` in bytes, or ``None`` when it has exited (a zombie
    has no memory to read) or cannot be read."""
    text = read(f"{PROC}/{pid}/smaps_rollup")
    if text is None:
        return None
    sums = {"uss": 0, "pss": 0, "shared": 0}
    seen = False
    for line in text.splitlines()[1:]:
        name, _, value = line.partition(b":")
        key = _ROLLUP_FIELDS.get(name)
        if key is not None:
            sums[key] += int(value.split()[0]) * 1024
            seen = True
    return (sums["uss"], sums["pss"], sums["shared"]) if seen else None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before their children."""
    return list(tree(pid))


def tree(pid: int) -> dict[int, int]:
    """Every live descendant of ``pid`` and its parent, parents first."""
    if pid == os.getpid() and not has_children():
        return {}
    children = _children if _CHILDREN_FILES else _scan()
    found: dict[int, int] = {}
    pending = [pid]
    while pending:
        parent = pending.pop()
        kids = children(parent)
        found.update(dict.fromkeys(kids, parent))
        pending.extend(kids)
    return found


_CHILDREN_FILES = os.path.exists(f"{PROC}/self/task/{os.getpid()}/children")
"""Whether this kernel lists each thread's children (``CONFIG_PROC_CHILDREN``)."""
_WALL = 0x40000000
"""``__WALL`` (``linux/wait.h``): wait for children of every kind, clone children too."""


def has_children() -> bool:
    """Whether this process has a child: one ``waitid`` that waits for none and reaps none
    (about 1 µs, against 25 µs or more for listing every thread's ``children`` file). Each
    thread waits for the children of every thread of its process, so a child any thread
    started counts, and so does one that exited and is not yet reaped. Called through
    ``ctypes`` where this kernel takes the call: no child is then a return value, not an
    exception, which inside training is half the cost (18 against 33 µs)."""
    waitid = _waitid()
    if waitid is not None:
        return waitid(os.P_ALL, 0, None, _WAITED) == 0
    return _waits_for_one()


def _waits_for_one() -> bool:
    """:func:`has_children` through ``os.waitid``."""
    try:
        os.waitid(os.P_ALL, 0, _WAITED)
    except ChildProcessError:
        return False
    except OSError:  # a kernel that refuses the call: list them
        return True
    return True


@functools.cache
def _waitid() -> Callable[..., int] | None:
    """The C library's ``waitid``, where this kernel takes :data:`_WAITED` (asked once, at the
    first use, through ``os.waitid``: an error other than no child means it does not)."""
    waitid = libc_function(
        "waitid", ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_int
    )
    try:
        os.waitid(os.P_ALL, 0, _WAITED)
    except ChildProcessError:
        pass
    except OSError:
        return None
    return waitid


_WAITED = os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL


def _children(pid: int) -> list[int]:
    """``pid``'s children, from each of its threads' ``children`` file."""
    try:
        tids = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        kids.extend(int(kid) for kid in (read(f"{PROC}/{pid}/task/{tid}/children") or b"").split())
    return kids


def _scan() -> Callable[[int], list[int]]:
    """Children by parent pid, from every process's ``stat`` (kernels without ``children``)."""
    by_parent: dict[int, list[int]] = {}
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        stat = read(f"{PROC}/{entry}/stat")
        if not stat:
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        by_parent.setdefault(parent, []).append(int(entry))
    return lambda pid: by_parent.get(pid, [])


_SHARED_ANONYMOUS = b" /dev/zero (deleted)\n"


def mapped_outside() -> int | None:
    """The size of the anonymous shared mappings of this process (``/proc/self/maps``): memory
    mapped outside ``malloc`` as ``mmap.mmap(-1, n)`` maps it. Neither private mappings (their
    sizes step by MiBs in a clean worker as Python's own arenas come and go: 3.8 MiB once in
    240 batches) nor shared-memory files (a DataLoader worker's batches while torch hands them
    over) are counted: either would fail clean loops. About 0.5 ms a call; None where
    ``/proc`` cannot be read."""
    total = 0
    try:
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                if line.endswith(_SHARED_ANONYMOUS):
                    low, high = line.split(b" ", 1)[0].split(b"-")
                    total += int(high, 16) - int(low, 16)
    except (OSError, ValueError):
        return None
    return total
