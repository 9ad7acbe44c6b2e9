"""The allocator that serves this process's ``malloc``, asked for the live heap: the bytes it
has handed out and not taken back. glibc's is read with ``mallinfo2``. A preloaded allocator
(``LD_PRELOAD`` of jemalloc or tcmalloc) serves ``malloc`` in glibc's place, and ``mallinfo2``
then reads arenas nobody uses, a measure that cannot move: which one serves is found by a block
of 64 KiB made through ``malloc`` that ``mallinfo2`` must see, and then jemalloc's own counter
(``stats.allocated``, after an ``epoch`` refresh) or tcmalloc's
(``generic.current_allocated_bytes``) is read instead. Where none can be read, :func:`live_heap`
is None and :func:`heap_note` says why, so that callers judge resident memory and say so.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class MallInfo2(ctypes.Structure):
    """``struct mallinfo2`` (every field a ``size_t``)."""

    _fields_ = [
        (field, ctypes.c_size_t)
        for field in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_libc() -> Any:
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


_LIBC = _load_libc()


def libc_function(name: str, restype: Any, *argtypes: Any) -> Any:
    """The C library's ``name`` with its types set, or None where it has none."""
    function = getattr(_LIBC, name, None)
    if function is not None:
        function.restype = restype
        function.argtypes = argtypes
    return function


_PROBE = 64 << 10
"""The block made to find which allocator serves ``malloc``: under glibc's mmap threshold
(128 KiB at first), so that freeing it does not raise the threshold for the process."""


def _glibc() -> tuple[Callable[[], int], Callable[[], int]] | None:
    """glibc's live heap (``uordblks + hblkhd``) and what it held from the system at that same
    reading (``arena + hblkhd``: its arenas, used or free, and its mapped chunks): one
    ``mallinfo2``, which walks every free list, for both."""
    mallinfo2 = libc_function("mallinfo2", MallInfo2)
    if mallinfo2 is None:
        return None
    last = [0]

    def read() -> int:
        info = mallinfo2()
        last[0] = int(info.arena + info.hblkhd)
        return int(info.uordblks + info.hblkhd)

    def held() -> int:
        return last[0]

    return read, held


def _serves(read: Callable[[], int]) -> bool:
    """Whether ``read`` sees a block ``malloc`` makes (half of it at least: another thread may
    free meanwhile)."""
    make = libc_function("malloc", ctypes.c_void_p, ctypes.c_size_t)
    free = libc_function("free", None, ctypes.c_void_p)
    if make is None or free is None:
        return False
    before = read()
    block = make(_PROBE)
    after = read()
    free(block)
    return after - before >= _PROBE // 2


def _jemalloc() -> Callable[[], int | None] | None:
    mallctl = libc_function(
        "mallctl",
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    )
    if mallctl is None:
        return None
    epoch = ctypes.c_uint64(1)
    value = ctypes.c_size_t(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))

    def read() -> int | None:
        # its statistics are a snapshot, refreshed by writing the epoch
        mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
        found = mallctl(b"stats.allocated", ctypes.byref(value), ctypes.byref(size), None, 0)
        return int(value.value) if found == 0 else None

    return read


def _tcmalloc() -> Callable[[], int | None] | None:
    property_of = libc_function(
        "MallocExtension_GetNumericProperty",
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_size_t),
    )
    if property_of is None:
        return None
    value = ctypes.c_size_t(0)

    def read() -> int | None:
        found = property_of(b"generic.current_allocated_bytes", ctypes.byref(value))
        return int(value.value) if found else None

    return read


@dataclass(frozen=True)
class Heap:
    """Who serves ``malloc`` here, how its live heap is read (None: it cannot be), and what it
    held from the system at the last such reading (glibc's only; None elsewhere)."""

    allocator: str
    read: Callable[[], int | None] | None
    note: str | None = None
    held: Callable[[], int] | None = None


@functools.cache
def heap() -> Heap:
    """The allocator serving ``malloc`` in this process, found once (a forked child has its
    parent's; ``heap.cache_clear()`` finds it again)."""
    glibc = _glibc()
    if glibc is not None and _serves(glibc[0]):
        return Heap("glibc", glibc[0], held=glibc[1])
    for name, reader in (("jemalloc", _jemalloc()), ("tcmalloc", _tcmalloc())):
        if reader is not None and reader() is not None:
            return Heap(name, reader)
    if glibc is None:
        return Heap("unknown", None, "no mallinfo2 (it needs glibc >= 2.33)")
    return Heap(
        "unknown",
        None,
        "malloc is not glibc's (a preloaded allocator?) and its counters cannot be read",
    )


def live_heap() -> int | None:
    """This process's live heap: the bytes the allocator serving ``malloc`` has handed out and
    not taken back (glibc's ``mallinfo2``: ``uordblks + hblkhd``; jemalloc's or tcmalloc's own
    counter), or None where it cannot be read (:func:`heap_note` says why)."""
    read = heap().read
    return read() if read is not None else None


def heap_note() -> str | None:
    """Why :func:`live_heap` is None here, or None."""
    return heap().note
