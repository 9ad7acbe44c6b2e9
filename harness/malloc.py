"""glibc's malloc, asked about this process: the live heap (``mallinfo2``) and returning free
heap to the system (``malloc_trim``). Off glibc, or before 2.33 for ``mallinfo2``, the
functions are None and callers say so."""

from __future__ import annotations

import ctypes
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


_MALLINFO2 = libc_function("mallinfo2", MallInfo2)


def live_heap() -> int | None:
    """This process's live heap: the bytes malloc has handed out and not taken back
    (``mallinfo2``: ``uordblks + hblkhd``), or None where there is no ``mallinfo2``."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)
