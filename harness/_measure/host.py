"""This process's host memory in each place it lives, read from inside: ``malloc``, Python's
own allocator, the pools of libraries that allocate outside ``malloc``, and the anonymous
resident memory that none of them explains.

- ``malloc``: the bytes the allocator serving ``malloc`` handed out and did not get back
  (:mod:`harness._measure.malloc`). PyTorch's CPU tensors, numpy's arrays and every Python
  object over 512 bytes live here.
- ``python``: the bytes in pymalloc's allocated blocks (:mod:`harness._measure.python_heap`):
  floats, short strings, small tuples and dicts.
- ``pool_<library>``: a library's own pool where it is outside ``malloc``, read only once the
  process has imported the library (:data:`POOLS`): pyarrow's default pool (mimalloc or
  jemalloc; a ``system`` pool is ``malloc``'s and already counted).
- ``allocated``: their sum, the live heap a process is judged on.
- ``anon``: resident anonymous private memory (``/proc/self/statm``: resident less shared pages).
- ``outside``: ``anon`` less what the allocators hold from the system (glibc's arenas and mapped
  chunks, pymalloc's arenas, the pools' bytes): memory a process maps or keeps that no counter
  here explains (a library's own ``mmap``, a pool without a counter). Each holding is an upper
  bound of its resident part, so a pool or heap that keeps freed pages is never counted outside,
  and the measure moves only when memory outside every counter does. None off glibc (another
  allocator's holding is not read) or where Python's allocator cannot be read.

A reading costs a ``mallinfo2``, pymalloc's walk (about 60 µs at 53 arenas, more inside
training, where it finds every pool's header cold), a pool's counter, a ``pread`` of ``statm``
and a ``mincore`` over malloc's main heap (about 40 µs for 90 MiB): read on the stride's
readings only.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

import numpy as np

from harness._measure.malloc import heap, libc_function
from harness._measure.python_heap import PythonHeap

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
STATM = "/proc/self/statm"
PARTS = ("malloc", "python")
"""The parts of ``allocated`` every host reading has, before the pools."""
POOL = "pool_"
"""The prefix of a library pool's metric."""
READINGS = ("allocated", *PARTS, "rss", "anon", "outside")
"""The metrics of a host reading, before the pools."""
HOST = "host_"
"""The prefix of the host's metrics beside a device that is not the host (a GPU)."""
OWN_COUNTED = ("allocated", "rss", "peak")
"""The metrics that count all of leakgate's own bookkeeping, which a recorder takes out of them
(and out of ``malloc`` and ``python``, each its own part). ``outside`` counts none of it: what
``malloc`` holds is taken out of it; ``anon`` stays as read, so that what leakgate frees but
``malloc`` keeps resident (explain's tables, when it stops tracing) never reads as growth of the
series that confirm ``outside``."""


def _pyarrow() -> int | None:
    """pyarrow's default pool, where it is not ``malloc``'s own."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None or not hasattr(pyarrow, "default_memory_pool"):
        return None
    if pyarrow.default_memory_pool().backend_name == "system":
        return None
    return int(pyarrow.total_allocated_bytes())


POOLS: dict[str, Callable[[], int | None]] = {"pyarrow": _pyarrow}
"""Library pools outside ``malloc``, by library: each reads its bytes in use, or None where the
library is not imported or its pool is ``malloc``'s."""


class HostMemory:
    """Reads this process's host memory (:meth:`read`); ``notes`` says what it cannot read
    here. Made in the process it reads: a forked child makes its own."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.notes: list[str] = []
        found = heap()
        self._malloc, self._held = found.read, found.held
        self._python = PythonHeap()
        if self._python.note:
            self.notes.append(self._python.note)
        try:
            self._statm: int | None = os.open(STATM, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            self._statm = None
            self.notes.append(f"anon and outside unavailable: {STATM}: {error.strerror}")
        if self._held is None and self._statm is not None:
            self.notes.append(f"outside not read: {found.allocator}'s holding is not read")
        self._heap = ProgramBreak()

    def read(self, into: dict[str, int | None], prefix: str = "") -> None:
        """Put each metric of the module's list into ``into``, named ``prefix + name`` (None
        where it cannot be read); ``rss`` too, from the same read of ``statm``."""
        malloc = self._malloc() if self._malloc is not None else None
        held = self._held() if self._held is not None and malloc is not None else None
        python = self._python.read()
        into[prefix + "malloc"] = malloc
        into[prefix + "python"] = None if python is None else python.blocks
        pools = 0
        for name, pool in POOLS.items():
            found = pool()
            if found is not None:
                into[prefix + POOL + name] = found
                pools += found
        live = None if malloc is None else malloc + pools + (python.blocks if python else 0)
        into[prefix + "allocated"] = live
        rss = anon = None
        if self._statm is not None:
            fields = os.pread(self._statm, 128, 0).split()
            rss, anon = int(fields[1]) * _PAGE, (int(fields[1]) - int(fields[2])) * _PAGE
        into[prefix + "rss"] = rss
        into[prefix + "anon"] = anon
        outside = None
        if anon is not None and held is not None and python is not None:
            held -= self._heap.absent()  # pages a trim gave back are held, not resident
            outside = anon - held - python.arenas - pools
        into[prefix + "outside"] = outside

    @property
    def reads_rss(self) -> bool:
        """Whether :meth:`read` reads ``rss`` (``/proc/self/statm`` is open)."""
        return self._statm is not None

    def live(self) -> int | None:
        """``allocated`` alone, as :meth:`read` sums it."""
        found: dict[str, int | None] = {}
        self.read(found)
        return found["allocated"]

    def close(self) -> None:
        if self._statm is not None and self.pid == os.getpid():
            os.close(self._statm)
        self._statm = None


class ProgramBreak:
    """The pages of ``malloc``'s main heap (from the program's start of data to its break,
    ``sbrk(0)``) that are not resident (:meth:`absent`), read with ``mincore``: a trim
    (``malloc_trim``) gives a free chunk's pages back while ``malloc`` still holds them, and
    they come back when the heap uses them again. 0 where it cannot be read (off Linux, or
    without ``mincore``); the heaps of other threads' arenas are taken as resident."""

    def __init__(self) -> None:
        self._sbrk = libc_function("sbrk", ctypes.c_void_p, ctypes.c_ssize_t)
        self._mincore = libc_function(
            "mincore", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
        )
        self._start = _start_brk()
        self._room = 0
        self._vector: ctypes.Array[ctypes.c_char] | None = None  # mincore's, a byte a page
        self._resident = np.zeros(0, np.uint8)  # the same bytes: 1 where a page is resident

    def absent(self) -> int:
        """Bytes of the main heap that are not resident now."""
        if self._start is None or self._sbrk is None or self._mincore is None:
            return 0
        pages = ((self._sbrk(0) or 0) - self._start) // _PAGE
        if pages <= 0:
            return 0
        if self._room < pages:
            self._room = pages + pages // 4
            vector = bytearray(self._room)
            self._vector = (ctypes.c_char * self._room).from_buffer(vector)
            self._resident = np.frombuffer(vector, np.uint8)
        if self._mincore(self._start, pages * _PAGE, self._vector) != 0:
            return 0
        return (pages - int(np.count_nonzero(self._resident[:pages]))) * _PAGE


def _start_brk() -> int | None:
    """Where this process's main heap starts (``start_brk``, field 47 of ``/proc/self/stat``),
    page-aligned; None where it cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start = int(fields[44])
    except (OSError, IndexError, ValueError):
        return None
    return start - start % _PAGE if start else None


_READER: HostMemory | None = None
"""This process's own reader for :func:`live` (made again in a forked child)."""


def _reader() -> HostMemory:
    global _READER
    if _READER is None or _READER.pid != os.getpid():
        _READER = HostMemory()
    return _READER


def live() -> int | None:
    """This process's live heap now: ``allocated``, as a :class:`HostMemory` sums it."""
    return _reader().live()


def live_python() -> int | None:
    """The bytes in Python's allocator's blocks now (``python``), which no thread's cache of
    freed chunks blurs, as ``malloc``'s per-thread caches blur its own count."""
    found = _reader()._python.read()
    return None if found is None else found.blocks
