"""Python's own allocator, read from inside the process: the bytes in pymalloc's allocated
blocks, and the arenas it maps for them.

Python serves every object of 512 bytes or less (floats, short strings, small tuples and dicts:
the usual contents of a list that grows) from arenas it maps itself, which ``malloc`` never
sees. CPython's ``_PyObject_DebugMallocStats`` walks them and prints ``# bytes in allocated
blocks`` (live objects, by their blocks) and the arenas' total; it is called here into an
in-memory stream (``open_memstream``), and ``_PyObject_DebugTypeStats`` prints the interpreter's
free lists after it into the same stream: about 60 µs at 53 arenas on warm caches, 250 µs at 100
arenas inside training (each pool's header is read), where ``sys._debugmallocstats`` writes to
C's stderr in about 1.1 ms. Blocks are counted, not arenas: an arena outlives the objects it
held.

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
import re
import sys
import tracemalloc
from operator import mul
from typing import Any, NamedTuple

from harness._measure.malloc import libc_function

_OBJECT_DOMAIN, _MEM_DOMAIN, _RAW_DOMAIN = 2, 1, 0
_BLOCKS = b"# bytes in allocated blocks"
_ARENAS = b" bytes/arena "
_COUNTS = re.compile(rb"\n *(\d+) free ")
_SIZES = re.compile(rb"\n *\d+ free [^*\n]*\* (\d+) bytes each")
"""A free list's line gives its objects and each one's size (``4 free PyFloatObjects * 24 bytes
each = 96``), each object in a block of Python's allocator (16-byte steps); the lines and their
sizes are the interpreter's own, in its order, so the sizes are read once."""


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
        self._sizes: list[int] = []  # each free list's block size, in the walk's order
        self._stats = _api("_PyObject_DebugMallocStats", ctypes.c_int, ctypes.c_void_p)
        self._types = _api("_PyObject_DebugTypeStats", None, ctypes.c_void_p)
        self._get = _api("PyMem_GetAllocator", None, ctypes.c_int, ctypes.POINTER(_Allocator))
        self._set = _api("PyMem_SetAllocator", None, ctypes.c_int, ctypes.POINTER(_Allocator))
        self._open = libc_function(
            "open_memstream",
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_size_t),
        )
        self._close = libc_function("fclose", ctypes.c_int, ctypes.c_void_p)
        self._flush = libc_function("fflush", ctypes.c_int, ctypes.c_void_p)
        self._free = libc_function("free", None, ctypes.c_void_p)
        missing = [
            name
            for name, f in (
                ("_PyObject_DebugMallocStats", self._stats),
                ("open_memstream", self._open),
                ("fflush", self._flush),
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
        walked = self._walk()
        if walked is None and tracemalloc.is_tracing():
            walked = self._walk_under_tracemalloc()
        if walked is None:
            return PythonBlocks(0, 0) if sys.getallocatedblocks() == 0 else None
        text, end = walked
        blocks, arenas = _figure(text, _BLOCKS, end), _figure(text, _ARENAS, end)
        if blocks is None or arenas is None:
            return None
        counts = _COUNTS.findall(text, end - 1)  # each free list's objects
        if len(counts) != len(self._sizes):  # their blocks' sizes, read once
            self._sizes = [(int(size) + 15) & ~15 for size in _SIZES.findall(text, end - 1)]
        return PythonBlocks(blocks - sum(map(mul, map(int, counts), self._sizes)), arenas)

    def _walk(self) -> tuple[bytes, int] | None:
        """What ``_PyObject_DebugMallocStats`` prints and where it ends, then the interpreter's
        free lists (``_PyObject_DebugTypeStats``), in one stream; None where the walk prints
        nothing. pymalloc counts a free list's objects as allocated, though no object holds
        them (up to 2,000 tuples of each size, floats, lists, dicts) and a full collection
        empties them: :meth:`read` takes them out."""
        buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
        stream = self._open(ctypes.byref(buffer), ctypes.byref(size))
        if not stream:
            return None
        printed = self._stats(stream)
        self._flush(stream)
        end = size.value
        if printed and self._types is not None:
            self._types(stream)
        self._close(stream)
        try:
            return (ctypes.string_at(buffer, size.value), end) if printed and end else None
        finally:
            self._free(buffer)

    def _walk_under_tracemalloc(self) -> tuple[bytes, int] | None:
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


def _figure(text: bytes, name: bytes, end: int) -> int | None:
    """The figure after ``=`` on the line of ``text[:end]`` that holds ``name``."""
    at = text.rfind(name, 0, end)
    if at < 0:
        return None
    start, stop = text.find(b"=", at, end) + 1, text.find(b"\n", at, end)
    figure = text[start : stop if stop > 0 else end].strip().replace(b",", b"")
    return int(figure) if start > 0 and figure.isdigit() else None
