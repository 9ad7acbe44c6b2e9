"""When a recorder reads its children, and how a reading is kept in a sample.

Every checkpoint reads each live descendant's ``anon`` (cheap: ``statm``); the dearer
``smaps_rollup`` (USS, PSS, shared pages: milliseconds per worker, see
:mod:`harness.children`) is read at a phase's START and END, at collected checkpoints, at a
new process's first checkpoint and at every :data:`ROLLUP_EVERY`-th checkpoint. The rules fit
a child's series on the readings it has, so a sparser series is judged exactly on what was
read, never on filled-in values.

A sample keeps the reading as metrics (:meth:`harness.children.TreeReading.metrics`) and the
live processes in its ``processes`` field, ``role=pid`` pairs joined by commas
(:func:`processes_text`, read back by :func:`parse_processes`): a new pid under a role is a
restart, and a role missing from it is a process that exited, not memory freed.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.children import ChildrenReader

ROLLUP_EVERY = 4
SCHEDULE = (
    "anon (statm) of every live child at every checkpoint; USS, PSS and shared pages "
    "(smaps_rollup) at phase start and end, collected checkpoints, a new process's first "
    f"checkpoint and every {ROLLUP_EVERY}th checkpoint"
)
"""How children are sampled, in words, for the timeline header and the report."""


class ChildSampler:
    """Reads ``pid``'s live descendants (this process by default) on the schedule above;
    ``notes`` says what it cannot do here."""

    def __init__(self, pid: int | None = None) -> None:
        self.reader = ChildrenReader(pid)
        self.notes = self.reader.notes
        self._count = 0

    def read(self, *, rollup: bool = False) -> tuple[dict[str, int], str | None] | None:
        """A checkpoint's children metrics and ``processes`` text (None without children);
        ``rollup`` asks for USS/PSS now. None where children cannot be measured."""
        due = rollup or self._count % ROLLUP_EVERY == 0
        self._count += 1
        reading = self.reader.read(rollup=due, rollup_if_new=True)
        if reading is None:
            return None
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
