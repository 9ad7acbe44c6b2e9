"""When a recorder reads its children, and how a reading is kept in a sample.

Every checkpoint reads each live descendant's ``anon`` (cheap: ``statm``); the dearer
``smaps_rollup`` (USS, PSS, shared pages: milliseconds per worker, see
:mod:`harness.children`) is read at a phase's START and END, at collected checkpoints, at a
new process's first checkpoint and at every :data:`ROLLUP_EVERY`-th checkpoint, or more
sparsely (down to every :data:`SPARSEST`-th) while a rollup costs more than
:data:`ROLLUP_SHARE` of the time between checkpoints: on 2 busy cores a rollup of 2 forked
workers of a torch process took 15 to 50 ms, as long as a TFT batch. The rules fit a child's
series on the readings it has, so a sparser series is judged exactly on what was read, never
on filled-in values (a loop needs about ``16 x 6`` batches after warm-up for a trend when
rollups are dear).

A sample keeps the reading as metrics (:meth:`harness.children.TreeReading.metrics`) and the
live processes in its ``processes`` field, ``role=pid`` pairs joined by commas
(:func:`processes_text`, read back by :func:`parse_processes`): a new pid under a role is a
restart, and a role missing from it is a process that exited, not memory freed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from time import perf_counter

from harness.children import ChildrenReader

ROLLUP_EVERY = 4
SPARSEST = 16
ROLLUP_SHARE = 0.1
SCHEDULE = (
    "anon (statm) of every live child at every checkpoint; USS, PSS and shared pages "
    "(smaps_rollup) at phase start and end, collected checkpoints, a new process's first "
    f"checkpoint and every {ROLLUP_EVERY}th checkpoint (up to every {SPARSEST}th while a "
    f"rollup costs over {ROLLUP_SHARE:.0%} of the time between checkpoints)"
)
"""How children are sampled, in words, for the timeline header and the report."""


class ChildSampler:
    """Reads ``pid``'s live descendants (this process by default) on the schedule above;
    ``notes`` says what it cannot do here."""

    def __init__(self, pid: int | None = None) -> None:
        self.reader = ChildrenReader(pid)
        self.notes = self.reader.notes
        self.every = ROLLUP_EVERY
        """Checkpoints from one rollup to the next scheduled one, now."""
        self._since = 0
        self._last: float | None = None

    def read(self, *, rollup: bool = False) -> tuple[dict[str, int], str | None] | None:
        """A checkpoint's children metrics and ``processes`` text (none of either while no
        child lives); ``rollup`` asks for USS/PSS now. None where children cannot be
        measured."""
        started = perf_counter()
        interval = None if self._last is None else started - self._last
        self._last = started
        reading = self.reader.read(
            rollup=rollup or self._since % self.every == 0, rollup_if_new=True
        )
        if reading is None:
            return None
        self._since += 1
        if reading.rollup:
            self._since = 1
            if interval:
                share = (perf_counter() - started) / (ROLLUP_SHARE * interval)
                self.every = min(SPARSEST, max(ROLLUP_EVERY, math.ceil(share)))
        if not reading.processes:  # nothing to keep: no child lives
            return {}, None
        return reading.metrics(), processes_text(reading.pids)


def processes_text(pids: Mapping[str, int]) -> str | None:
    """``role=pid`` pairs, by role, joined by commas; None for no process."""
    return ",".join(f"{role}={pid}" for role, pid in sorted(pids.items())) or None


def parse_processes(text: str | None) -> dict[str, int]:
    """Each role's pid from a ``processes`` text; pairs that do not read are left out."""
    found: dict[str, int] = {}
    for pair in (text or "").split(","):
        role, _, pid = pair.rpartition("=")
        if role and pid.isdigit():
            found[role] = int(pid)
    return found
