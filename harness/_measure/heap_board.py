"""Child processes' live heap, read inside each child and published into a slot that its
ancestor reads in microseconds.

Read from outside, a child shows only RSS-side memory, which keeps what its allocator holds
after a free: a clean DataLoader worker's grows by MiBs, its live heap (as the main process's,
:func:`harness._measure.malloc.live_heap`) by about 20 KiB. So a child that runs this interpreter's
code reads its own live heap, with the anonymous memory it mapped outside malloc
(:func:`harness._measure.procfs.mapped_outside`, every :data:`MAPS_EVERY`-th reading), and writes it
into its *slot*: a 64-byte file named by its pid in a *board*, a private folder (in
``/dev/shm`` where there is one) that the recording process makes once (:data:`WORKERS`). A
child reserves its slot's blocks before its first write (a full ``/dev/shm`` then leaves it read
from outside) and writes it with ``pwrite``; the parent reads it with ``pread``: never mapped, a
slot cut short or a full file system faults neither process. A slot that is not a regular file
(a FIFO put there) is never opened for long nor read.

**Who publishes, and when.**

- DataLoader workers, under every start method: :data:`WORKERS`, while held through
  :data:`~harness._measure.patches.PATCHES`, puts a picklable wrapper (it carries the board's
  path, for a spawned worker) at ``torch.utils.data._utils.worker._worker_loop``, and torch's
  back after its last holder. In the worker, each fetch of a batch first publishes:
  a reading covers the batches its ``count`` says were begun before it, never the one in flight.
  A torch without ``_worker_loop`` or its fetchers: workers are read as other children.
- Any other child forked by Python: an at-fork hook opens its slot and a daemon thread
  publishes every :data:`PERIOD` seconds while it lives.
- A child that runs no code of this interpreter (``subprocess``), a spawned process that is
  not a DataLoader worker, and any child whose live heap cannot be read: no slot. It is read
  from outside (:mod:`harness._measure.children`), and the report says which measure judged it.

**Freshness.** A slot holds a sequence number (odd while it is being written: a reader that
sees it odd, or changed across its read, reads again), the pid, the live heap, ``count`` (the
readings taken so far) and the monotonic time of the reading. A reader keeps the count it last
used for each pid: a reading whose count has not moved is no evidence of anything since.

A board lives as long as its process: an ``atexit`` hook removes it, and boards left by a
process that was killed are removed by the next board made on the machine
(:mod:`~harness._measure.board_folder`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from harness._core.errors import Raised
from harness._measure.board_slots import NOFOLLOW, SEQUENCE, SIZE, SLOT, UNREAD, Board
from harness._measure.host import HostMemory
from harness._measure.malloc import heap
from harness._measure.patches import PATCHES, Hold, Patch
from harness._measure.procfs import mapped_outside, read_rollup

PERIOD = 0.01
"""Seconds between two readings of a forked child that is not a DataLoader worker."""
MAPS_EVERY = 16  # a child's mappings outside malloc are read so often (0.5 ms each)


def _rolls(count: int) -> bool:
    """Whether a child reads its own ``smaps_rollup`` at its ``count``-th reading: at 8, 32,
    128, 512, ... (10 to 30 ms each for a torch worker, in the child, for the copy-on-read
    finding: its first readings are its start-up's, and each later one sees at least half of
    what it copied so far)."""
    return count >= 8 and count & (count - 1) == 0 and count.bit_length() % 2 == 0


class _Slot:
    """This process's slot in its ancestor's board, written by :meth:`publish`."""

    def __init__(self, board: str) -> None:
        self.pid = os.getpid()
        path = os.path.join(board, str(self.pid))
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        try:
            # the slot's blocks reserved now (ENOSPC on a full /dev/shm, said by the caller's
            # fallback), so no later write needs a page the file system cannot give
            os.posix_fallocate(fd, 0, SIZE)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        self._fd = fd  # written with pwrite, never mapped: a slot cut short faults nothing
        self._host = HostMemory()
        self._reading: dict[str, int | None] = {}
        self.own: Callable[[], int] | None = None
        """What leakgate keeps in this process (a worker's search's census), left out."""
        self._sequence = 0
        self._count = 0
        self._rollup = (0, 0, 0)
        self._mapped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> int | None:
        """Write the live heap now (odd sequence number while writing), what no counter
        explains, and the child's own ``smaps_rollup`` at readings 8, 32, 128, ...
        (:func:`_rolls`); the heap written."""
        reading = self._reading
        self._host.read(reading)
        heap, outside, anon = reading["allocated"], reading["outside"], reading["anon"]
        if heap is None:
            return None
        beyond = UNREAD if anon is None else anon - heap
        if self.own is not None:  # what the worker's own search keeps is leakgate's
            heap -= self.own()
        if self._count % MAPS_EVERY == 0:
            self._mapped = mapped_outside() or 0
        heap += self._mapped
        with self._lock:
            self._count += 1
            if _rolls(self._count):
                rolled = read_rollup(self.pid)
                if rolled is not None:
                    self._rollup = (rolled[0], rolled[2], self._count)
            self._sequence += 1  # odd while the slot is written, its first 8 bytes first
            now = time.monotonic_ns()
            unread = UNREAD if outside is None else outside
            slot = SLOT.pack(
                self._sequence, self.pid, heap, self._count, now, *self._rollup, unread, beyond
            )
            self._sequence += 1
            try:
                os.pwrite(self._fd, slot, 0)
                os.pwrite(self._fd, SEQUENCE.pack(self._sequence), 0)
            except OSError:  # the slot is gone (the board removed): its last reading stays
                return None
        return heap

    @property
    def count(self) -> int:
        """The readings published so far."""
        return self._count

    def tick(self) -> None:
        """Publish every :data:`PERIOD` seconds on a daemon thread, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="leakgate-heap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD):
            self.publish()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


_board: Board | None = None
"""The board this process's children publish into (made when :data:`WORKERS` is first put)."""
_target: str | None = None
"""The board this process publishes into: its nearest recording ancestor's."""
_slot: _Slot | None = None
_forks = 0
"""Children this process forked through Python while :data:`WORKERS` was held."""
_generation = 0
"""Which registration of :func:`_forked` acts in a child: the latest (:func:`_before_fork`)."""
_after_memray = False
_releases: list[Callable[[], None]] = []
"""What a forked child lets go of before its first reading (:func:`release_in_child`)."""


class _WorkerLoop(Patch):
    """Children that publish their live heap: this process's board (made once, kept until it
    exits), torch's DataLoader worker loop started through :func:`_worker_loop` (put back when
    the last holder lets go, unless a tool wrapped ours since: its wrapper stays, and ours then
    calls torch's), and the at-fork hooks, registered once and acting only while held."""

    def __init__(self) -> None:
        self.original: Callable[..., Any] | None = None
        """torch's loop as it was when ours went in (a forked worker inherits it)."""
        self.hooks: dict[Hold, Callable[[int, int], None] | None] = {}
        """Each holder's :func:`watch_batches` hook, the latest registered last."""
        self._registered = False

    def put(self) -> str | None:
        global _board
        found = heap()
        if found.read is None:
            return f"children read from outside: {found.note}"
        if _board is None or _board.owner != os.getpid():
            try:
                _board = Board.make()
            except OSError as error:
                return f"children read from outside: no board for their heap ({error.strerror})"
            atexit.register(_board.close)
        if not self._registered:
            os.register_at_fork(before=_before_fork, after_in_parent=_parent_forked)
            self._registered = True
        return self.wrap()

    def take_back(self) -> None:
        worker = sys.modules.get("torch.utils.data._utils.worker")
        if worker is not None and _ours(getattr(worker, "_worker_loop", None)):
            setattr(worker, "_worker_loop", self.original)  # noqa: B010

    @property
    def hook(self) -> Callable[[int, int], None] | None:
        """The hook a worker started now calls: the latest registered by a holder still here."""
        return next(reversed(self.hooks.values()), None)

    def unhook(self, hold: Hold) -> None:
        """Drop ``hold``'s hook: the one registered before it acts again."""
        if hold in self.hooks:
            del self.hooks[hold]
            self.wrap()

    def wrap(self) -> str | None:
        """Start DataLoader workers through :func:`_worker_loop` with the board and the hook,
        when this process's board is in place; why not, when torch lacks it."""
        if _board is None or _board.owner != os.getpid():
            return None
        try:
            from torch.utils.data._utils import fetch, worker
        except ImportError:
            return "DataLoader workers read from outside: torch is not importable"
        loop = getattr(worker, "_worker_loop", None)
        if loop is None or not hasattr(fetch, "_BaseDatasetFetcher"):
            return "spawned DataLoader workers read from outside: this torch has no _worker_loop"
        if _around_ours(loop):  # a tool wrapped ours since: its wrapper stays, and calls ours
            return None
        if not _ours(loop):
            self.original = loop
        worker._worker_loop = functools.partial(_worker_loop, _board.path, self.hook)
        return None


WORKERS = _WorkerLoop()
"""What makes this process's children publish their live heap: held through
:data:`~harness._measure.patches.PATCHES` (a children reader of this process holds it)."""


def board() -> Board | None:
    """The board this process's children publish into (made when :data:`WORKERS` was put),
    None where it has none."""
    return _board if _board is not None and _board.owner == os.getpid() else None


def _around_ours(loop: Any) -> bool:
    """Whether ``loop`` is another tool's wrapper around ours (through ``__wrapped__`` or a
    closure), which must stay where it is and never become the loop ours calls."""
    for _ in range(16):
        if loop is None:
            return False
        if any(_ours(_content(cell)) for cell in getattr(loop, "__closure__", None) or ()):
            return True
        loop = getattr(loop, "__wrapped__", None)
        if _ours(loop):
            return True
    return False


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def watch_batches(hook: Callable[[int, int], None] | None) -> None:
    """Have each DataLoader worker started from now on call ``hook(heap, count)`` after each
    reading it publishes (a spawned worker gets a pickled copy), for as long as the newest
    holder of :data:`WORKERS` in this process holds it (a recorder's own, made in its
    constructor before it asks): when that holder lets go, the hook registered before acts
    again. None: no hook for that holder. With no holder, nothing. A hook that raises is
    dropped in that worker, which goes on and says so on its stderr."""
    hold = PATCHES.newest(WORKERS)
    if hold is None:
        return
    if hold not in WORKERS.hooks:
        hold.on_release(functools.partial(WORKERS.unhook, hold))
    WORKERS.hooks.pop(hold, None)
    WORKERS.hooks[hold] = hook
    WORKERS.wrap()


def release_in_child(release: Callable[[], None]) -> None:
    """Have each child forked from now on call ``release`` before its first reading, whichever
    at-fork hook runs first: what the parent kept for itself (explain's traces), which the
    child frees, must not be the start its growth is judged from."""
    if release not in _releases:
        _releases.append(release)


def _before_fork() -> None:
    """Before a fork while :data:`WORKERS` is held: register :func:`_forked` for the child,
    once, and again once memray is imported (its handler ends its tracking in a child: a thread
    started before it would be tracked into the parent's capture). The latest registration is
    the one that acts."""
    global _generation, _after_memray
    if not PATCHES.held(WORKERS):
        return
    memray = "memray" in sys.modules
    if _generation and (_after_memray or not memray):
        return
    _generation += 1
    _after_memray = memray
    os.register_at_fork(after_in_child=functools.partial(_forked, _generation))


def _parent_forked() -> None:
    global _forks
    if PATCHES.held(WORKERS):
        _forks += 1


def forks() -> int:
    """How many children this process has forked through Python while :data:`WORKERS` was
    held."""
    return _forks


def _ours(loop: object) -> bool:
    return isinstance(loop, functools.partial) and loop.func is _worker_loop


def _forked(generation: int) -> None:
    """In a child forked by Python: publish into the parent's board (or the board the parent
    publishes into) on a timer; a DataLoader worker switches to its batches."""
    global _board, _target, _slot
    if generation != _generation or not PATCHES.held(WORKERS):
        return
    if _board is not None:
        _target, _board = _board.path, None
    _slot = None
    for release in _releases:
        release()
    if _target is not None:
        _slot = _open(_target)
        if _slot is not None:
            with contextlib.suppress(RuntimeError):  # no thread to be had: one reading stays
                _slot.tick()


def _open(board: str) -> _Slot | None:
    try:
        slot = _Slot(board)
    except OSError:  # the board is gone or full: this child is read from outside
        return None
    slot.publish()
    return slot


def _worker_loop(
    board: str, hook: Callable[[int, int], None] | None, *args: Any, **kwargs: Any
) -> Any:
    """A DataLoader worker's entry point: publish before each batch (then call ``hook``), then
    torch's loop."""
    global _target, _slot
    from torch.utils.data._utils import worker

    _target = board
    if _slot is not None:
        _slot.stop()
    else:
        _slot = _open(board)
    fetchers = [] if _slot is None else [_Fetchers(_slot, hook)]
    # torch's loop as it was when ours went in (a fork inherits it; a spawned worker imports
    # torch afresh): never the attribute as it is now, which a tool may have wrapped around ours
    original = WORKERS.original if WORKERS.original is not None else worker._worker_loop
    assert not _ours(original)
    with PATCHES.hold(*fetchers):
        return original(*args, **kwargs)


class _Fetchers(Patch):
    """In a DataLoader worker, for its loop: each of torch's fetchers publishes into ``slot``
    before each batch (then calls ``hook``); put back when the loop returns."""

    def __init__(self, slot: _Slot, hook: Callable[[int, int], None] | None) -> None:
        self._slot, self._hook = slot, hook
        self._wrapped: list[tuple[type, Any, Any]] = []

    def put(self) -> None:
        from torch.utils.data._utils import fetch

        for kind in fetch._BaseDatasetFetcher.__subclasses__():
            own = kind.__dict__.get("fetch")
            wrapped = _publishing(kind.fetch, self._slot, self._hook)
            kind.fetch = wrapped  # type: ignore[method-assign]
            self._wrapped.append((kind, own, wrapped))

    def take_back(self) -> None:
        for kind, own, wrapped in self._wrapped:
            if kind.__dict__.get("fetch") is wrapped:
                if own is None:
                    delattr(kind, "fetch")
                else:
                    setattr(kind, "fetch", own)  # noqa: B010
        self._wrapped.clear()


def _publishing(
    fetch: Callable[..., Any], slot: _Slot, hook: Callable[[int, int], None] | None
) -> Callable[..., Any]:
    hooks = [hook] if hook is not None else []
    slot.own = getattr(hook, "own_bytes", None)

    @functools.wraps(fetch)
    def published(self: object, index: object) -> Any:
        heap = slot.publish()
        if hooks and heap is not None:
            try:
                hooks[0](heap, slot.count)
            except Exception as error:  # any code may fail: the worker goes on without it
                _drop(hooks, error)
        return fetch(self, index)

    return published


def _drop(hooks: list[Callable[[int, int], None]], error: Exception) -> None:
    """Drop a worker's hook that raised, saying so on the worker's stderr (its parent's, where
    a test's output is captured): which hook, the error's type and first line."""
    hook = hooks.pop()
    kind = type(hook)
    named = kind in (types.FunctionType, types.MethodType)  # else an object's: by its class
    name = hook.__qualname__ if named else kind.__qualname__
    with contextlib.suppress(OSError, ValueError):  # no stderr left (closed): nowhere to say it
        print(
            f"leakgate: DataLoader worker {os.getpid()}: its hook {name} raised"
            f" {Raised.of(error)}; dropped for the rest of its batches",
            file=sys.stderr,
            flush=True,
        )
