"""Child processes' live heap, read inside each child and published into a slot that its
ancestor reads in microseconds.

Read from outside, a child shows only RSS-side memory, which keeps what its allocator holds
after a free: a clean DataLoader worker's grows by MiBs, its live heap (as the main process's,
:func:`harness.measure.malloc.live_heap`) by about 20 KiB. So a child that runs this interpreter's
code reads its own live heap, with the anonymous memory it mapped outside malloc
(:func:`harness.measure.procfs.mapped_outside`, every :data:`MAPS_EVERY`-th reading), and writes it
into its *slot*: a 64-byte file named by its pid in a *board*, a private folder (in
``/dev/shm`` where there is one) that the recording process makes once (:func:`install`). A
child reserves its slot's blocks before its first write (a full ``/dev/shm`` then leaves it read
from outside) and writes it with ``pwrite``; the parent reads it with ``pread``: never mapped, a
slot cut short or a full file system faults neither process. A slot that is not a regular file
(a FIFO put there) is never opened for long nor read.

**Who publishes, and when.**

- DataLoader workers, under every start method: :func:`install` puts a picklable wrapper (it
  carries the board's path, for a spawned worker) at ``torch.utils.data._utils.worker.
  _worker_loop`` until :func:`uninstall`. In the worker, each fetch of a batch first publishes:
  a reading covers the batches its ``count`` says were begun before it, never the one in flight.
  A torch without ``_worker_loop`` or its fetchers: workers are read as other children.
- Any other child forked by Python: an at-fork hook opens its slot and a daemon thread
  publishes every :data:`PERIOD` seconds while it lives.
- A child that runs no code of this interpreter (``subprocess``), a spawned process that is
  not a DataLoader worker, and any child whose live heap cannot be read: no slot. It is read
  from outside (:mod:`harness.measure.children`), and the report says which measure judged it.

**Freshness.** A slot holds a sequence number (odd while it is being written: a reader that
sees it odd, or changed across its read, reads again), the pid, the live heap, ``count`` (the
readings taken so far) and the monotonic time of the reading. A reader keeps the count it last
used for each pid: a reading whose count has not moved is no evidence of anything since.

A board lives as long as its process: an ``atexit`` hook removes it, and boards left by a
process that was killed are removed by the next board made on the machine
(:mod:`~harness.measure.board_folder`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.measure.board_folder import leased_folder
from harness.measure.host import HostMemory
from harness.measure.malloc import heap
from harness.measure.procfs import mapped_outside, read_rollup

PERIOD = 0.01
"""Seconds between two readings of a forked child that is not a DataLoader worker."""
SIZE = 128
MAPS_EVERY = 16  # a child's mappings outside malloc are read so often (0.5 ms each)
_SLOT = struct.Struct("<QqqQqqqQqq")
"""sequence, pid, live heap, count, monotonic ns, the latest rollup (uss, shared, and the
count it was taken at: 0 for none yet), and what no counter explains, both bounds of it:
resident anonymous memory less what the allocators hold, and less the live heap
(:data:`UNREAD` where they cannot be read)."""
UNREAD = -(2**63)
_SEQUENCE = struct.Struct("<Q")
_TRIES = 4


@dataclass(frozen=True)
class HeapReading:
    """A child's latest published reading: its live heap in bytes, ``count`` readings taken
    so far, at ``taken`` (``time.monotonic_ns``); and its latest ``smaps_rollup`` (``uss``
    and ``shared`` pages, read by the child itself at reading ``rolled``: 0 for none yet)."""

    heap: int
    count: int
    taken: int
    uss: int = 0
    shared: int = 0
    rolled: int = 0
    outside: int | None = None
    beyond: int | None = None


class Board:
    """The folder this process's children publish into, and the parent's view of their slots
    (``read``: a child's latest reading)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.owner = os.getpid()
        self._lease: int | None = None  # a lock held while the board lives (board_folder)
        self._slots: dict[int, int] = {}  # a child's slot, as a descriptor read with pread
        self._last: dict[int, HeapReading] = {}
        self._sequences: dict[int, int] = {}

    @classmethod
    def make(cls) -> Board:
        """A new, private board; ``OSError`` when none can be made."""
        path, lease = leased_folder()
        board = cls(path)
        board._lease = lease
        return board

    def read(self, pid: int) -> HeapReading | None:
        """``pid``'s latest complete reading: None while it has no slot or has not published
        yet. A reading being written as it is read gives the one before it. Slots are read
        with ``pread``, never mapped: a slot cut short (truncated, or a full file system) reads
        short, where a mapping would fault."""
        fd = self._slots.get(pid)
        if fd is None:
            fd = self._slot_of(pid)
            if fd is None:
                return None
        last = self._last.get(pid)
        if last is not None and _sequence(fd) == self._sequences[pid]:
            return last  # nothing new since: no second read, no new object
        for _ in range(_TRIES):
            data = os.pread(fd, SIZE, 0)
            if len(data) < _SLOT.size:
                break
            sequence, owner, *fields = _SLOT.unpack_from(data)
            whole = sequence % 2 == 0 and _sequence(fd) == sequence
            if whole and owner == pid and fields[1]:
                live, count, taken, uss, shared, rolled, *bounds = fields
                outside, beyond = (None if b == UNREAD else b for b in bounds)
                reading = HeapReading(live, count, taken, uss, shared, rolled, outside, beyond)
                self._last[pid], self._sequences[pid] = reading, sequence
                break
        return self._last.get(pid)

    def _slot_of(self, pid: int) -> int | None:
        """``pid``'s slot opened, when it is a regular file of this board (a FIFO or a device
        put there is never waited on nor read)."""
        flags = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(self.path, str(pid)), flags)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return None
        except OSError:
            os.close(fd)
            return None
        self._slots[pid] = fd
        return fd

    def forget(self, pid: int) -> None:
        """Drop an exited child's slot."""
        fd = self._slots.pop(pid, None)
        self._last.pop(pid, None)
        self._sequences.pop(pid, None)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.path, str(pid)))

    def close(self) -> None:
        """Remove the board (only in the process that made it)."""
        for fd in self._slots.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._slots.clear()
        if os.getpid() == self.owner:
            shutil.rmtree(self.path, ignore_errors=True)
            if self._lease is not None:
                os.close(self._lease)
                self._lease = None


def _sequence(fd: int) -> int | None:
    """A slot's sequence number now (None when it is cut short)."""
    data = os.pread(fd, _SEQUENCE.size, 0)
    return _SEQUENCE.unpack(data)[0] if len(data) == _SEQUENCE.size else None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | os.O_CLOEXEC
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
            slot = _SLOT.pack(
                self._sequence, self.pid, heap, self._count, now, *self._rollup, unread, beyond
            )
            self._sequence += 1
            try:
                os.pwrite(self._fd, slot, 0)
                os.pwrite(self._fd, _SEQUENCE.pack(self._sequence), 0)
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
"""The board this process's children publish into (made by :func:`install`)."""
_target: str | None = None
"""The board this process publishes into: its nearest recording ancestor's."""
_slot: _Slot | None = None
_original_loop: Callable[..., Any] | None = None
_hooked = False
_users = 0
"""Installs not yet undone: children publish while there is one."""
_forks = 0
"""Children this process forked through Python since it made its board."""
_generation = 0
"""Which registration of :func:`_forked` acts in a child: the latest (:func:`_before_fork`)."""
_after_memray = False
_hook: Callable[[int, int], None] | None = None
"""What a DataLoader worker calls after each reading it publishes, with its heap and count
(:func:`watch_batches`)."""
_releases: list[Callable[[], None]] = []
"""What a forked child lets go of before its first reading (:func:`release_in_child`)."""


def install() -> tuple[Board | None, str | None]:
    """Make this process's children publish their live heap until each call has its
    :func:`uninstall`: the board to read them from, and why some or all of them cannot publish
    (None when all can)."""
    global _board, _hooked, _users
    _users += 1
    found = heap()
    if found.read is None:
        return None, f"children read from outside: {found.note}"
    if _board is None or _board.owner != os.getpid():
        try:
            _board = Board.make()
        except OSError as error:
            return None, f"children read from outside: no board for their heap ({error.strerror})"
        atexit.register(_board.close)
    if not _hooked:
        os.register_at_fork(before=_before_fork, after_in_parent=_parent_forked)
        _hooked = True
    return _board, _wrap_workers(_board.path)


def uninstall() -> None:
    """Undo one :func:`install`; after the last, torch's worker loop is put back (unless a tool
    wrapped ours since: its wrapper stays, and ours then calls torch's), no worker started
    from now on calls a :func:`watch_batches` hook, and children forked from now on publish
    nothing. The board stays until this process exits."""
    global _users, _hook
    _users = max(0, _users - 1)
    if _users:
        return
    _hook = None
    worker = sys.modules.get("torch.utils.data._utils.worker")
    if worker is not None and _ours(getattr(worker, "_worker_loop", None)):
        setattr(worker, "_worker_loop", _original_loop)  # noqa: B010


def _wrap_workers(board: str) -> str | None:
    """Start DataLoader workers through :func:`_worker_loop`; why not, when torch lacks it."""
    global _original_loop
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
        _original_loop = loop
    worker._worker_loop = functools.partial(_worker_loop, board, _hook)
    return None


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
    reading it publishes (None: no hook; a spawned worker gets a pickled copy)."""
    global _hook
    _hook = hook
    if _users and _board is not None and _board.owner == os.getpid():
        _wrap_workers(_board.path)


def release_in_child(release: Callable[[], None]) -> None:
    """Have each child forked from now on call ``release`` before its first reading, whichever
    at-fork hook runs first: what the parent kept for itself (explain's traces), which the
    child frees, must not be the start its growth is judged from."""
    if release not in _releases:
        _releases.append(release)


def _before_fork() -> None:
    """Before a fork: register :func:`_forked` for the child, once, and again once memray is
    imported (its handler ends its tracking in a child: a thread started before it would be
    tracked into the parent's capture). The latest registration is the one that acts."""
    global _generation, _after_memray
    memray = "memray" in sys.modules
    if _generation and (_after_memray or not memray):
        return
    _generation += 1
    _after_memray = memray
    os.register_at_fork(after_in_child=functools.partial(_forked, _generation))


def _parent_forked() -> None:
    global _forks
    _forks += 1


def forks() -> int:
    """How many children this process has forked through Python since it made its board."""
    return _forks


def _ours(loop: object) -> bool:
    return isinstance(loop, functools.partial) and loop.func is _worker_loop


def _forked(generation: int) -> None:
    """In a child forked by Python: publish into the parent's board (or the board the parent
    publishes into) on a timer; a DataLoader worker switches to its batches."""
    global _board, _target, _slot
    if generation != _generation or not _users:
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
    from torch.utils.data._utils import fetch, worker

    _target = board
    if _slot is not None:
        _slot.stop()
    else:
        _slot = _open(board)
    if _slot is not None:
        for kind in fetch._BaseDatasetFetcher.__subclasses__():
            kind.fetch = _publishing(kind.fetch, _slot, hook)  # type: ignore[method-assign]
    # torch's loop as it was when ours went in (a fork inherits it; a spawned worker imports
    # torch afresh): never the attribute as it is now, which a tool may have wrapped around ours
    original = _original_loop if _original_loop is not None else worker._worker_loop
    assert not _ours(original)
    return original(*args, **kwargs)


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
            except Exception:  # a hook never stops the worker: it is dropped instead
                hooks.clear()
        return fetch(self, index)

    return published
