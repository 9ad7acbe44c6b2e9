"""When a recorder reads its children, and how a reading is kept in a sample.

Every checkpoint reads each live descendant's published live heap, or ``anon`` where it has no
slot (:mod:`harness.children`: a few µs a child). The dearer ``smaps_rollup`` (USS, PSS, shared
pages: milliseconds per worker, for the copy-on-read finding) is read at a phase's START and
END, at collected checkpoints and at a new child's first checkpoint; a child that publishes
reads its own, off the parent's time. The rules fit each
child's series on the readings it has (a worker's fresh live heap readings, about one per
batch it makes), exactly on what was read, never on filled-in values.

A sample keeps the reading as metrics (:meth:`harness.children.TreeReading.metrics`) and the
live processes in its ``processes`` field, ``role=pid`` pairs joined by commas
(:func:`processes_text`, read back by :func:`parse_processes`): a new pid under a role is a
restart, and a role missing from it is a process that exited, not memory freed.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.children import ChildrenReader

SCHEDULE = (
    "the live heap of each child that publishes one (DataLoader workers, Python forks), read "
    "inside it and kept wherever it is new; the anon (RssAnon + RssShmem) of any other child, "
    "at every checkpoint; smaps_rollup (USS, PSS, shared pages) at phase edges, collected "
    "checkpoints and a new child's first, or by the child itself at its readings 8, 32, 128, ..."
)
"""How children are sampled, in words, for the timeline header and the report."""


class ChildSampler:
    """Reads ``pid``'s live descendants (this process by default) on the schedule above;
    ``notes`` says what it cannot do here."""

    def __init__(self, pid: int | None = None) -> None:
        self.reader = ChildrenReader(pid)
        self.notes = self.reader.notes
        self._text: tuple[dict[str, int], str | None] = ({}, None)
        """The last live processes and their text (they change far less often than read)."""

    def read(
        self, *, rollup: bool = False, latest: bool = False
    ) -> tuple[dict[str, int], str | None] | None:
        """A checkpoint's children metrics and ``processes`` text (none of either while no
        child lives); ``rollup`` asks for USS/PSS now, ``latest`` for every child's latest
        live heap, fresh or not. None where children cannot be measured."""
        reading = self.reader.read(rollup=rollup, rollup_if_new=True)
        if reading is None:
            return None
        pids = reading.pids
        if pids != self._text[0]:
            self._text = pids, processes_text(pids)
        return reading.metrics(latest=latest), self._text[1]


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
