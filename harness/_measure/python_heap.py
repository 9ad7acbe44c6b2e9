"""Python's own allocator, read from inside the process: the bytes in pymalloc's allocated
blocks, and the arenas it maps for them.

Python serves every object of 512 bytes or less (floats, short strings, small tuples and dicts:
the usual contents of a list that grows) from arenas it maps itself, which ``malloc`` never
sees. CPython's ``_PyObject_DebugMallocStats`` walks them and prints ``# bytes in allocated
blocks`` (live objects, by their blocks) and the arenas' total; it is called here into an
in-memory stream (``open_memstream``), about 40 µs at 52 arenas, where ``sys._debugmallocstats``
writes to C's stderr in about 1.1 ms. Blocks are counted, not arenas: an arena outlives the
objects it held.

While tracemalloc traces (``--memreport-explain``, or a user's own), its hook stands in front of
pymalloc and the walk prints nothing. tracemalloc keeps the allocator it wraps in a static
table of three (``mem``, ``raw``, ``obj``), and each of its hooks' context points into that
table: where the three domains' contexts lie one allocator apart, as that table lays them out,
pymalloc is put back in front for the walk and tracemalloc's hook right after it. Objects made
meanwhile (none by the walk itself) are simply not traced. Anywhere else the figure is None and
:attr:`PythonHeap.note` says why; without pymalloc at all (``PYTHONMALLOC=malloc``) every
object is in ``malloc``, and the figure is 0.
"""

from __future__ import annotations

import ctypes
import sys
import tracemalloc
from typing import Any, NamedTuple

from harness._measure.malloc import libc_function

_OBJECT_DOMAIN, _MEM_DOMAIN, _RAW_DOMAIN = 2, 1, 0
_BLOCKS = b"# bytes in allocated blocks"
_ARENAS = b" bytes/arena "


class _Allocator(ctypes.Structure):
    """``PyMemAllocatorEx``."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("ctx", "malloc", "calloc", "realloc", "free")]


class PythonBlocks(NamedTuple):
    """pymalloc's ``blocks`` in use and the ``arenas`` it maps, in bytes."""

    blocks: int
    arenas: int


def _api(name: str, restype: object, *argtypes: object) -> Any:
    function = getattr(ctypes.pythonapi, name, None)
    if function is not None:
        function.restype = restype
        function.argtypes = argtypes
    return function


class PythonHeap:
    """Reads pymalloc's blocks in use (:meth:`read`); ``note`` says why it cannot, where it
    cannot."""

    def __init__(self) -> None:
        self.note: str | None = None
        self._stats = _api("_PyObject_DebugMallocStats", ctypes.c_int, ctypes.c_void_p)
        types = _api("_PyObject_DebugTypeStats", None, ctypes.c_void_p)
        self._types = None if types is None else lambda stream: types(stream) or 1
        self._get = _api("PyMem_GetAllocator", None, ctypes.c_int, ctypes.POINTER(_Allocator))
        self._set = _api("PyMem_SetAllocator", None, ctypes.c_int, ctypes.POINTER(_Allocator))
        self._open = libc_function(
            "open_memstream",
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_size_t),
        )
        self._close = libc_function("fclose", ctypes.c_int, ctypes.c_void_p)
        self._free = libc_function("free", None, ctypes.c_void_p)
        missing = [
            name
            for name, f in (
                ("_PyObject_DebugMallocStats", self._stats),
                ("open_memstream", self._open),
            )
            if f is None
        ]
        self._usable = not missing
        if missing:
            self.note = f"Python's allocator not read: no {' or '.join(missing)} here"
        elif self.read() is None:
            self.note = "Python's allocator not read: a hook other than tracemalloc wraps it"

    def read(self) -> PythonBlocks | None:
        """pymalloc's blocks in use and arenas now (zeros without pymalloc), or None."""
        if not self._usable:
            return None
        text = self._walk()
        if text is None and tracemalloc.is_tracing():
            text = self._walk_under_tracemalloc()
        if text is None:
            return PythonBlocks(0, 0) if sys.getallocatedblocks() == 0 else None
        blocks, arenas = _number(text, _BLOCKS), _number(text, _ARENAS)
        if blocks is None or arenas is None:
            return None
        return PythonBlocks(blocks - self._free_lists(), arenas)

    def _free_lists(self) -> int:
        """The bytes of the objects the interpreter keeps freed for reuse (its free lists of
        floats, tuples, lists, dicts: up to 2,000 tuples of each size), which pymalloc counts
        as allocated: no object holds them, and a full collection empties them."""
        if self._types is None:
            return 0
        text = self._print(self._types)
        return sum(_freed(line) for line in text.splitlines() if b" free " in line)

    def _walk(self) -> bytes | None:
        """What ``_PyObject_DebugMallocStats`` prints, or None where it prints nothing."""
        return self._print(self._stats) or None

    def _print(self, function: Any) -> bytes:
        """What ``function`` prints into a stream (nothing where it says it printed nothing)."""
        buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
        stream = self._open(ctypes.byref(buffer), ctypes.byref(size))
        if not stream:
            return b""
        printed = function(stream)
        self._close(stream)
        try:
            return ctypes.string_at(buffer, size.value) if printed != 0 else b""
        finally:
            self._free(buffer)

    def _walk_under_tracemalloc(self) -> bytes | None:
        """The walk with pymalloc put back in front of tracemalloc's hook for its length."""
        if self._get is None or self._set is None:
            return None
        hooks = {d: _Allocator() for d in (_MEM_DOMAIN, _RAW_DOMAIN, _OBJECT_DOMAIN)}
        for domain, hook in hooks.items():
            self._get(domain, ctypes.byref(hook))
        contexts = [hooks[d].ctx or 0 for d in (_MEM_DOMAIN, _RAW_DOMAIN, _OBJECT_DOMAIN)]
        step = ctypes.sizeof(_Allocator)
        if (
            not contexts[0]
            or contexts[1] - contexts[0] != step
            or contexts[2] - contexts[1] != step
        ):
            return None  # not tracemalloc's own table in front
        wrapped = _Allocator.from_address(contexts[2])
        if not (wrapped.malloc and wrapped.calloc and wrapped.realloc and wrapped.free):
            return None
        front = hooks[_OBJECT_DOMAIN]
        self._set(_OBJECT_DOMAIN, ctypes.byref(wrapped))
        try:
            return self._walk()
        finally:
            self._set(_OBJECT_DOMAIN, ctypes.byref(front))


def _number(text: bytes, name: bytes) -> int | None:
    """The figure after ``=`` on the line that holds ``name``."""
    at = text.find(name)
    if at < 0:
        return None
    start, end = text.find(b"=", at) + 1, text.find(b"\n", at)
    figure = text[start : end if end > 0 else None].strip().replace(b",", b"")
    return int(figure) if start > 0 and figure.isdigit() else None


def _freed(line: bytes) -> int:
    """The blocks of one free list's line: ``4 free PyFloatObjects * 24 bytes each = 96``, each
    object in its block of Python's allocator (16-byte steps)."""
    words = line.split()
    try:
        count, size = int(words[0]), int(words[words.index(b"bytes") - 1])
    except (ValueError, IndexError):
        return 0
    return count * ((size + 15) & ~15)
