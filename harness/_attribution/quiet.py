"""Searching without being watched: a user's own tools must never record leakgate's work.

A torch profiler with ``with_stack`` (its Python tracer), a ``sys.settrace`` tracer (coverage,
a debugger) or a ``sys.setprofile`` profiler records every call a search makes: a search of a
few hundred thousand objects became millions of events, the profiler's buffers grew by hundreds
of MiB, and that growth started the next search. Such tools watch the threads they were set on;
:func:`unobserved` runs a search in a thread of its own, which none of them was set on, while
the caller waits. A memory tracer (``tracemalloc`` started outside leakgate, ``memray``) sees
every thread's allocations instead: there a search steps aside, and :func:`memory_tracer` says
why in the words a report shows.
"""

from __future__ import annotations

import _thread
import functools
import sys
import threading
import tracemalloc
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch

P = ParamSpec("P")
_R = TypeVar("_R")
_OWN_MEMRAY: list[object] = []
"""leakgate's own memray regions now open (:class:`~harness._attribution.native.Native`)."""


def watched() -> bool:
    """Whether a tool records the calls of this thread: a trace or profile function, or a torch
    profiler (whose op events a search does not make, but whose Python tracer it would feed)."""
    return (
        sys.gettrace() is not None
        or sys.getprofile() is not None
        or torch._C._autograd._profiler_enabled()
    )


def memory_tracer(own_tracemalloc: bool = False) -> str | None:
    """Why a search should step aside now: a memory tracer that is not leakgate's own traces
    every allocation (``own_tracemalloc``: tracemalloc runs because leakgate started it), or
    None."""
    if tracemalloc.is_tracing() and not own_tracemalloc:
        return "tracemalloc traces this process"
    hook = getattr(threading, "_profile_hook", None)
    if str(getattr(hook, "__module__", "")).startswith("memray") and not _OWN_MEMRAY:
        return "memray tracks this process"
    return None


def own_memray(region: object, tracking: bool) -> None:
    """Note that leakgate's own memray ``region`` tracks now (or no longer): a search in it is
    leakgate's to make, and what it allocates and frees is no line memray keeps."""
    if tracking:
        _OWN_MEMRAY.append(region)
    elif region in _OWN_MEMRAY:
        _OWN_MEMRAY.remove(region)


def unobserved(search: Callable[P, _R]) -> Callable[P, _R]:
    """``search``, run in a fresh thread where a tool watches the calling one (see
    :func:`watched`); its result or its error is the caller's. The thread is started with
    ``_thread``, below ``threading``, whose ``settrace`` and ``setprofile`` hooks would set the
    tools on it too."""

    @functools.wraps(search)
    def run(*args: P.args, **kwargs: P.kwargs) -> _R:
        if not watched():
            return search(*args, **kwargs)
        done = _thread.allocate_lock()
        done.acquire()
        outcome: list[Any] = []

        def inside() -> None:
            try:
                outcome.append((True, search(*args, **kwargs)))
            except BaseException as error:  # handed to the caller
                outcome.append((False, error))
            finally:
                done.release()

        _thread.start_new_thread(inside, ())
        done.acquire()
        ok, value = outcome.pop()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    return run
