"""A heap board's slots (:mod:`harness._measure.heap_board`): their format, and the parent's
view of them (:class:`Board`: a child's latest complete reading, read with ``pread``, never
mapped)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import struct
from dataclasses import dataclass

from harness._measure.board_folder import leased_folder

SIZE = 128
SLOT = struct.Struct("<QqqQqqqQqq")
"""sequence, pid, live heap, count, monotonic ns, the latest rollup (uss, shared, and the
count it was taken at: 0 for none yet), and what no counter explains, both bounds of it:
resident anonymous memory less what the allocators hold, and less the live heap
(:data:`UNREAD` where they cannot be read)."""
UNREAD = -(2**63)
SEQUENCE = struct.Struct("<Q")
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
            if len(data) < SLOT.size:
                break
            sequence, owner, *fields = SLOT.unpack_from(data)
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
        flags = os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW | os.O_CLOEXEC
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
    data = os.pread(fd, SEQUENCE.size, 0)
    return SEQUENCE.unpack(data)[0] if len(data) == SEQUENCE.size else None


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
