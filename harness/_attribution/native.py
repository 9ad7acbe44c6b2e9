"""Native allocation lines on CPU, with ``memray`` (the optional ``leakgate[memray]`` extra):
what a region allocated through malloc or mmap and still holds when it ends (a library cache, a
tensor kept where no walk from a named root reaches, an extension's buffers), grouped by the
innermost Python line outside torch, leakgate, the standard library and pytest (a line that
called leakgate itself, a checkpoint, is not named for leakgate's own bookkeeping).

:class:`Native` wraps a region (the plugin wraps a test's call under ``explain``), and
:func:`recheck` runs a callable again under it. Without memray both name nothing (``None``).
The capture is memray's file of every allocation, in a temporary folder removed when the region
ends (28 MiB for 704 batches of a small model under explain, read back in 3 s): memray's
aggregated format would keep a table of every live allocation in the process, tracemalloc's
traces included, and that process's heap is what is judged. memray reads no resident memory,
and tracks no forked child (a DataLoader worker).

memray allows one ``Tracker`` per process, so a region steps aside, naming nothing, where
memray is tracking already (:attr:`Native.skipped` says so) or where the code it would wrap
runs a tracker of its own (:func:`runs_tracker`: told before the region starts, so that code's
tracker still starts). memray follows Python frames with a profile function of its own, in
place of any other while it runs (it puts its own back over one set later): a region steps
aside where one is set already (``sys.setprofile``, ``threading.setprofile``), and ends its
tracking where the code inside it sets one, so that the code's function stays in place.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness._attribution.lines import HARNESS, SKIPPED, short_site
from harness._attribution.quiet import own_memray
from harness._core.units import format_size

NATIVE_FLOOR = 64 * 1024
"""A line whose surviving native allocations add up to less than this is not named."""
TOP = 5
_NEVER = 2**31 - 1
"""memray's interval between its readings of the resident memory, in ms: none is used."""
_STDLIB = (os.path.dirname(os.__file__) + os.sep, "<")


@dataclass(frozen=True)
class NativeLine:
    """Native allocations still held at a region's end, by the line that made them."""

    line: str
    bytes: int
    count: int

    def text(self) -> str:
        held = format_size(self.bytes)
        return f"native: {self.line} ({self.count} allocations, {held} still held)"


def available() -> bool:
    """Whether memray can be imported (it is an optional extra; Linux and macOS only)."""
    try:
        import memray  # noqa: F401
    except ImportError:
        return False
    return True


def _skipped() -> tuple[str, ...]:
    extra = []
    for name in ("_pytest", "pluggy", "memray"):
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            extra.append(os.path.dirname(module.__file__) + os.sep)
    return (*SKIPPED, *extra, "<")


def _memrays(profile: object) -> bool:
    """Whether a profile function is a running memray tracker's (memray then refuses a second
    tracker itself, and says so)."""
    return getattr(profile, "__module__", None) == "memray._memray"


class Native:
    """A region tracked by ``memray.Tracker``: after it, :attr:`found` holds the top ``top``
    lines by bytes still held (at least ``floor`` each), or None when memray is not installed
    or could not track (:attr:`skipped` then says why: another tracker was active)."""

    def __init__(self, top: int = TOP, floor: int = NATIVE_FLOOR) -> None:
        self.top = top
        self.floor = floor
        self.found: list[NativeLine] | None = None
        self.skipped: str | None = None
        self.capture = ""
        self._folder: str | None = None
        self._tracker: Any = None
        self._setters: dict[Any, Callable[[Any], None]] = {}

    def __enter__(self) -> Native:
        if not available():
            return self
        profile = sys.getprofile() or threading.getprofile()
        if profile is not None and not _memrays(profile):
            # memray tracks Python frames with a profile function of its own, in place of the
            # user's for as long as it runs: a profiler set already is left as it is
            self.skipped = "a profile function is set (sys.setprofile): memray would replace it"
            return self
        import memray

        self._folder = tempfile.mkdtemp(prefix="leakgate-memray-")
        self.capture = os.path.join(self._folder, "capture.bin")
        try:
            self._tracker = memray.Tracker(self.capture, memory_interval_ms=_NEVER)
            self._tracker.__enter__()
            own_memray(self, True)
        except (RuntimeError, OSError) as error:
            self._tracker = None
            self.skipped = f"memray could not track: {error}"
            self._remove()
            return self
        modules: tuple[Any, ...] = (sys, threading)
        for module in modules:
            self._setters[module] = module.setprofile
            module.setprofile = functools.partial(_set_profile, self, module.setprofile)
        return self

    def __exit__(self, *exc: object) -> None:
        self._put_back()
        if self._tracker is None:
            return
        try:
            gc.collect()  # what only a cycle kept was not leaked
            self._stop()
            self.found = self._read()
        finally:
            self._remove()

    def _stop(self) -> None:
        tracker, self._tracker = self._tracker, None
        own_memray(self, False)
        tracker.__exit__(None, None, None)

    def _put_back(self) -> None:
        """``setprofile`` put back where it is still this region's."""
        for module, setter in self._setters.items():
            current = module.setprofile
            if isinstance(current, functools.partial) and current.args[0] is self:
                module.setprofile = setter
        self._setters.clear()

    def profile_set(self) -> None:
        """The code inside set a profile function: memray stops here, naming nothing."""
        self._put_back()
        if self._tracker is not None:
            self._stop()
            self._remove()
            self.skipped = "the test set a profile function (sys.setprofile): memray stopped"

    def _read(self) -> list[NativeLine]:
        import memray

        skipped = _skipped()
        by_line: dict[str, list[int]] = {}
        with memray.FileReader(self.capture) as reader:
            for record in reader.get_leaked_allocation_records(merge_threads=True):
                line = _outside(record.stack_trace(), skipped)
                if line is not None:
                    entry = by_line.setdefault(line, [0, 0])
                    entry[0] += record.size
                    entry[1] += record.n_allocations
        found = [NativeLine(line, size, count) for line, (size, count) in by_line.items()]
        found = sorted((f for f in found if f.bytes >= self.floor), key=lambda f: -f.bytes)
        return found[: self.top]

    def _remove(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _set_profile(region: Native, setter: Callable[[Any], None], function: Any) -> None:
    """``sys.setprofile`` (or ``threading``'s) while ``region`` tracks: memray stops first, so
    that ``function`` stays in place. Memray's own function passes through: every thread that
    starts sets the one ``threading`` keeps, memray's while it tracks."""
    if not _memrays(function):
        region.profile_set()
    setter(function)


def runs_tracker(function: Any, module: Any) -> str | None:
    """Why a test ``function`` of ``module`` looks like it starts a ``memray.Tracker`` of its
    own (its module holds memray or its ``Tracker``; its code names either), or None. A region
    around it would make that tracker fail: memray allows one per process."""
    memray = sys.modules.get("memray")
    if memray is None:
        return None
    own = (memray, memray.Tracker)
    if module is not None and any(any(v is o for o in own) for v in vars(module).values()):
        return f"{module.__name__} uses memray.Tracker"
    code = getattr(function, "__code__", None)
    codes = [code] if code is not None else []
    while codes:
        code = codes.pop()
        if {"memray", "Tracker"} & {*code.co_names, *code.co_varnames}:
            return f"{function.__qualname__} uses memray.Tracker"
        codes += [c for c in code.co_consts if hasattr(c, "co_names")]
    return None


def _outside(stack: list[tuple[str, str, int]], skipped: tuple[str, ...]) -> str | None:
    """The innermost line of ``stack`` outside ``skipped``, unless what it called (past the
    standard library) is leakgate: a checkpoint's or phase's bookkeeping is not the caller's."""
    for i, (_, filename, lineno) in enumerate(stack):
        if not filename.startswith(skipped):
            called = [f for _, f, _ in stack[i - 1 :: -1] if not f.startswith(_STDLIB)] if i else []
            if called and called[0].startswith(HARNESS):
                return None
            return short_site(filename, lineno)
    return None


def recheck(
    run: Callable[[], object], top: int = TOP, floor: int = NATIVE_FLOOR
) -> list[NativeLine] | None:
    """Run ``run`` again under memray: its lines of native memory still held after it, or None
    without memray."""
    with Native(top, floor) as native:
        run()
    return native.found
