"""Allocation lines, the dearer search (``--memreport-explain``): while a :class:`Lines` is
open, every storage a torch operator creates is noted with the line of the caller's code that
ran it (the innermost frame outside torch and leakgate), and ``tracemalloc`` traces Python
objects. An attribution can then say where the memory it names was allocated, and name the
line of what survived with no holder at all: storages only C++ keeps (an autograd graph no
Python object reaches, a library cache), and Python objects (``tracemalloc``).

On CPU the operators are seen through a ``TorchDispatchMode``, about 10 to 30 µs per operator:
this is why it is opt-in. On CUDA the allocator's own history
(:func:`~harness._attribution.sites.record_sites`) gives the sites, and is recorded too.

Explaining changes no verdict: a recorder leaves what malloc holds for this bookkeeping out of
each reading (:meth:`Lines.own_bytes`), and a forked child (a DataLoader worker, judged on its
own live heap) stops it all before its first reading. Tracing runs from the first phase until
the first walk of every object (a search by holder or retained size, a census), which stops it
for good: it is never started again during a run. CPython 3.11's tracemalloc frees its traces
when it stops but not the tracebacks it interned (measured on 3.11.7: 10 KiB for 30 distinct
stacks, 41 KiB for 100, at each restart), and the stacks interned again after each restart
grew a clean trainer's heap by 2 MiB an epoch when tracing paused at every snapshot, fork and
search; traced, a walk is several times slower. So Python objects are named by line in the
first search of a run only.
"""

from __future__ import annotations

import _tracemalloc
import contextlib
import functools
import os
import sys
import time
import tracemalloc
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_leaves

from harness._attribution.snapshot import NO_STORAGE, StorageKey, storage_of
from harness._attribution.weights import allotted
from harness._measure import heap_board
from harness._measure.malloc import live_heap

_TORCH = os.path.dirname(torch.__file__) + os.sep
HARNESS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
SKIPPED = (_TORCH, HARNESS, os.path.dirname(os.__file__) + os.sep)
"""Where frames are not named: torch, leakgate and the standard library."""
PYTHON_OBJECTS = "<Python objects>"
_FRAMES = 16
Traced = dict[tuple[tuple[str, int], ...], list[int]]
PYTHON_FLOOR = 64 * 1024
"""Python-object growth of one line below this is not named (interpreter noise)."""


_NAMED: set[str] = set()
"""Files whose frames :func:`caller_site` names (outside :data:`SKIPPED`), as first seen."""
_PASSED: set[str] = set()
"""Files whose frames :func:`caller_site` passes over, as first seen."""


def caller_site() -> tuple[str, int] | None:
    """``(file, line)`` of the innermost frame outside torch, leakgate and the standard library.
    It runs at every operator, in the user's thread, where a user's profiler records each
    function it calls and a tracer each line it runs, as the user's own: each file is told
    apart once, and walking a frame calls nothing."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name in _NAMED or (name not in _PASSED and _named(name)):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def _named(filename: str) -> bool:
    """Whether frames of ``filename`` are named, kept for the next frame of it (but where the
    name is made with the code, ``<...>``: ``torch.fx``'s ``<eval_with_key>.N``, one a module)."""
    if filename.startswith("<"):
        return False
    named = not filename.startswith(SKIPPED)
    (_NAMED if named else _PASSED).add(filename)
    return named


def short_site(filename: str, line: int) -> str:
    """``file:line``, the file relative to the working directory when it lies under it."""
    here = os.getcwd() + os.sep
    return f"{filename[len(here) :] if filename.startswith(here) else filename}:{line}"


@dataclass(slots=True)
class _Noted:
    storage: StorageWeakRef
    cdata: int
    nbytes: int
    file: str  # the frame's code's own name: shared
    lineno: int
    time: float

    @property
    def line(self) -> str:
        return short_site(self.file, self.lineno)


@functools.cache
def _entry_bytes() -> int:
    """The small objects of one entry of :attr:`Lines.storages`, in the blocks of Python's
    allocator that they take: its key (a tuple and the address in it), its record, the
    record's weak reference to the storage and its numbers (the file's name is its code's)."""
    storage = torch.empty(1).untyped_storage()
    key = ("cpu", None, storage.data_ptr())
    noted = _Noted(StorageWeakRef(storage), storage._cdata, 1 << 40, "", 1 << 20, time.time())
    numbers = (key[2], noted.storage.cdata, noted.cdata, noted.nbytes, noted.lineno, noted.time)
    parts = (key, noted, noted.storage, *numbers)
    return sum(allotted(sys.getsizeof(part)) for part in parts)


class _Allocations(TorchDispatchMode):
    """Notes each new storage an operator returns, with its caller's line. torch hides a
    mode's ``__torch_dispatch__`` from ``torch.compile``, importing ``torch._dynamo`` at the
    first operator (800 modules, 70 MiB): :meth:`Lines.open` runs that operator before any
    tracing or native capture starts. A process that never imported the compiler carries it
    from then on (each fork copies its page tables), but torch imports it lazily anyway at the
    first optimizer made (``Optimizer.add_param_group``); inside an explained test that import
    was 310,000 allocations, 92 MiB, named as still held by the line that made the optimizer."""

    def __init__(self, lines: Lines) -> None:
        super().__init__()
        self.lines = lines

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.lines._mode is self:  # not once closed (a forked child's, left on its stack)
            if type(out) is torch.Tensor:  # most operators' output: no tree to walk
                self.lines.note(out)
            else:
                for leaf in tree_leaves(out):
                    if isinstance(leaf, torch.Tensor):
                        self.lines.note(leaf)
        return out


class Lines:
    """Allocation lines while open: :meth:`line` of a storage, :meth:`unheld` storages still
    alive that no tensor object holds, :meth:`python_growth` Python objects by line."""

    def __init__(self) -> None:
        self.storages: dict[StorageKey, _Noted] = {}
        self._mode: _Allocations | None = None
        self._traced = False
        self._per_trace = self._uncounted = 0
        self._stopped = False
        self._pruned_at = 1024

    def open(self) -> None:
        """Start noting storages. What explain would import once tracing runs is imported
        first: one operator runs, so that what torch imports on a mode's first use, the compiler
        included, is not taken for the run's, and memray, where installed, which the native
        lines (``native.py``) import as a test's call starts, after tracing began (traced, that
        import took 2.6 s instead of 0.14 s and left 2.2 MiB of traces)."""
        if self._mode is not None:
            return
        _close_in_children()
        self._mode = _Allocations(self)
        self._mode.__enter__()
        _OPEN.add(self)
        torch.ones(1).add(1)
        with contextlib.suppress(ImportError):
            import memray  # noqa: F401

    def trace(self) -> None:
        """Start tracing Python allocations, once, at the first phase (unless tracemalloc
        already runs, which is then left running, or :meth:`stop_tracing` stopped it): only
        what is allocated from then on is traced, so reading the traces stays cheap."""
        if self._mode is not None and not self._stopped and not tracemalloc.is_tracing():
            tracemalloc.start(_FRAMES)
            self._traced = True
            self._per_trace = _uncounted_per_trace()
            self.recount()

    def stop_tracing(self) -> None:
        """Stop tracing for good (when this object started it), before a walk of every object:
        traced, a walk is several times slower, and tracing once stopped is never started again
        (see above). Python objects are named by line up to here."""
        if self._traced:
            tracemalloc.stop()
            self._traced = False
            self._uncounted = 0
            self._stopped = True

    def recount(self) -> None:
        """Count the traces now: what malloc holds for each beyond what tracemalloc reports is
        part of :meth:`own_bytes` until the next count (a recorder counts after each snapshot
        or search, the bursts of its own objects; a loop's traces hardly change between)."""
        if self._traced:
            self._uncounted = self._per_trace * len(_tracemalloc._get_traces())

    def close(self) -> None:
        """Stop what :meth:`open` started; the lines noted stay readable. The mode leaves the
        dispatch stack where it is this thread's innermost, and notes nothing from now on."""
        _OPEN.discard(self)
        if self._mode is not None:
            mode, self._mode = self._mode, None
            if _get_current_dispatch_mode() is mode:
                mode.__exit__(None, None, None)
        if self._traced:
            tracemalloc.stop()
            self._traced = False

    @property
    def open_now(self) -> bool:
        return self._mode is not None

    @property
    def traced(self) -> bool:
        """Whether tracemalloc runs because this object started it."""
        return self._traced

    def note(self, tensor: torch.Tensor) -> None:
        key, nbytes = storage_of(tensor)
        if key is None:
            return
        try:
            storage = tensor.untyped_storage()
        except NO_STORAGE:
            return
        seen = self.storages.get(key)
        if seen is not None and seen.cdata == storage._cdata and not seen.storage.expired():
            return
        site = caller_site()
        if site is None:
            return
        noted = _Noted(StorageWeakRef(storage), storage._cdata, nbytes, *site, time.time())
        self.storages[key] = noted
        if len(self.storages) > 2 * self._pruned_at:
            self.prune()

    def own_bytes(self, exact: bool = False) -> int:
        """Memory malloc holds for this object's bookkeeping now, so that a recorder can leave
        it out of the reading it takes next: storages freed since are forgotten first (a
        weak reference keeps a freed storage's C++ object), and what is left is the table of
        storages noted, each entry's own small objects (:func:`_entry_bytes`) and
        tracemalloc's traces (when it started them; ``exact`` counts them again first, see
        :meth:`recount`)."""
        self.prune()
        if exact:
            self.recount()
        traced = tracemalloc.get_tracemalloc_memory() + self._uncounted if self._traced else 0
        return traced + sys.getsizeof(self.storages) + len(self.storages) * _entry_bytes()

    def prune(self) -> None:
        """Forget storages that were freed."""
        self.storages = {k: v for k, v in self.storages.items() if not v.storage.expired()}
        self._pruned_at = max(1024, len(self.storages))

    def line(self, key: StorageKey | None) -> str | None:
        """The line that allocated the live storage at ``key``, if noted."""
        noted = self.storages.get(key) if key is not None else None
        return noted.line if noted is not None and not noted.storage.expired() else None

    def unheld(
        self, counted: set[StorageKey | None], old: set[int], since: float = 0.0
    ) -> dict[str, list[int]]:
        """Storages still alive, noted while open at or after ``since``, not in ``counted``
        (named already) nor ``old`` (storage identities alive before): their sizes by
        allocating line."""
        self.prune()
        by_site: dict[tuple[str, int], list[int]] = {}
        for key, noted in self.storages.items():
            if key in counted or noted.cdata in old or noted.time < since:
                continue
            by_site.setdefault((noted.file, noted.lineno), []).append(noted.nbytes)
        by_line: dict[str, list[int]] = {}
        for site, sizes in by_site.items():
            by_line.setdefault(short_site(*site), []).extend(sizes)
        return by_line

    def snapshot(self) -> Traced | None:
        """Python objects traced now, bytes and blocks by traceback (None while tracemalloc is
        off). Read from tracemalloc's raw traces: its :class:`tracemalloc.Snapshot` filters and
        groups in Python, minutes for the few hundred thousand blocks of a test process."""
        if not tracemalloc.is_tracing():
            return None
        grouped: Traced = {}
        traces: Any = _tracemalloc._get_traces()
        for trace in traces:
            size, frames = trace[1], trace[2]
            entry = grouped.get(frames)
            if entry is None:
                grouped[frames] = [size, 1]
            else:
                entry[0] += size
                entry[1] += 1
        return grouped

    def python_growth(self, before: Traced | None) -> list[tuple[str, int, int]]:
        """Python objects allocated since ``before`` and alive now, by the innermost line
        outside torch and leakgate: ``(line, bytes, blocks)``, largest first, those under
        :data:`PYTHON_FLOOR` left out."""
        now = self.snapshot()
        if before is None or now is None:
            return []
        by_line: dict[str, list[int]] = {}
        for frames, (size, count) in now.items():
            old_size, old_count = before.get(frames, (0, 0))
            if size <= old_size:
                continue
            line = _outside(frames)
            if line is None:
                continue
            entry = by_line.setdefault(line, [0, 0])
            entry[0] += size - old_size
            entry[1] += max(count - old_count, 0)
        found = [(line, size, count) for line, (size, count) in by_line.items()]
        return sorted((f for f in found if f[1] >= PYTHON_FLOOR), key=lambda f: -f[1])


def _uncounted_per_trace(blocks: int = 4096) -> int:
    """What malloc holds for one trace beyond what ``get_tracemalloc_memory`` counts for it,
    measured here: ``blocks`` small objects (in Python's own arenas, not malloc's) are made
    under tracing, so the live heap grows by their traces alone (48 B a trace on glibc's
    64-bit malloc: the trace's own block and its table entry's header). 0 off glibc."""
    kept: list[object] = [None] * blocks
    before = live_heap(), tracemalloc.get_tracemalloc_memory()
    for i in range(blocks):
        kept[i] = object()
    after = live_heap(), tracemalloc.get_tracemalloc_memory()
    if before[0] is None or after[0] is None:
        return 0
    return max(0, round(((after[0] - before[0]) - (after[1] - before[1])) / blocks))


_OPEN: set[Lines] = set()
"""Lines open in this process."""


def _close_in_child() -> None:
    """In a forked child (a DataLoader worker): close what the parent had open. The child is
    not explained, and noting its storages would grow its live heap."""
    for lines in list(_OPEN):
        lines.close()


@functools.cache
def _close_in_children() -> None:
    """Have every forked child close what is open, before the heap board's first reading of it
    too: registered at the first :meth:`Lines.open`, never at import."""
    os.register_at_fork(after_in_child=_close_in_child)
    heap_board.release_in_child(_close_in_child)


def _outside(frames: tuple[tuple[str, int], ...]) -> str | None:
    """The first of ``frames`` (most recent first) outside torch and leakgate."""
    for filename, lineno in frames:
        if not filename.startswith(SKIPPED) and not filename.startswith("<"):
            return short_site(filename, lineno)
    return None
