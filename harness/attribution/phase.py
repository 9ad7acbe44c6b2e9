"""Attribution during a run: :class:`PhaseAttribution` acts on a recorder's checkpoints (a
snapshot at each phase's START, a search at its END, at an OOM event or once its growth passes
a threshold) and :func:`explain` picks, for a verdict's findings, the holders to name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness import labels
from harness.attribution.holders import MAX_OBJECTS, Holder, attribute
from harness.attribution.sites import record_sites
from harness.attribution.snapshot import Snapshot, live_tensors
from harness.sample import Sample
from harness.units import parse_size

_START = labels.last_word(labels.SESSION_START)
_END = labels.last_word(labels.SESSION_END)


class PhaseAttribution:
    """Attribution at a recorder's checkpoints (``Recorder(attribute=...)``).

    A checkpoint whose label's last word is ``START`` (``VALIDATION_START``, ``validation
    START``) notes the live tensors for its phase; one whose last word is ``END`` attributes
    the tensors that are new since, and so does an ``OOM`` event (without a snapshot for its
    phase: every live tensor, as :func:`attribute` without one). With ``growth`` (bytes or a
    size such as ``"50MB"``), the first checkpoint of a phase whose ``allocated`` reading
    (``rss`` when there is none) exceeds the phase's START by more than that attributes too:
    a loop that frees what it kept once it ends is named while it still keeps it. With
    ``at_end=False`` an END attributes nothing: only growth past ``growth`` and OOM events do,
    so a run that stays within its budget pays for snapshots (well under a millisecond with
    the recorder's frozen heap) and never for a search. With ``sites`` (the default) CUDA
    allocation stacks are recorded while the recorder is open. ``limit``, ``max_depth`` and
    ``max_objects`` go to each :func:`attribute`. Each result is kept in :attr:`holders`,
    tagged with the checkpoint's phase, epoch and label.
    """

    def __init__(
        self,
        *,
        growth: int | str | None = None,
        at_end: bool = True,
        limit: int | None = 5,
        max_depth: int = 8,
        max_objects: int = MAX_OBJECTS,
        sites: bool = True,
    ) -> None:
        self.growth = None if growth is None else parse_size(growth, what="growth")
        self.at_end = at_end
        self.limit = limit
        self.max_depth = max_depth
        self.max_objects = max_objects
        self.holders: list[Holder] = []
        self._open: dict[str | None, _Open] = {}
        self._sites = sites
        self._stop_sites = False

    def start(self) -> None:
        """Begin recording CUDA allocation stacks when ``sites`` is set and CUDA is in use."""
        if self._sites and torch.cuda.is_available() and torch.cuda.is_initialized():
            self._stop_sites = not record_sites(True)

    def close(self) -> None:
        """Stop the recording :meth:`start` began; forget the snapshots."""
        if self._stop_sites:
            record_sites(False)
            self._stop_sites = False
        self._open.clear()

    def observe(self, sample: Sample) -> bool:
        """Act on one recorded checkpoint; returns whether it took a snapshot or attributed."""
        word = labels.last_word(sample.label)
        if word == _START:
            self._open[sample.phase] = _Open(live_tensors(), sample)
            return True
        if word == labels.OOM:
            opened = self._open.get(sample.phase)
            self.attribute(sample, opened.snapshot if opened else None)
            return True
        opened = self._open.get(sample.phase)
        if opened is None:
            return False
        if word == _END:
            del self._open[sample.phase]
            if self.at_end:
                self.attribute(sample, opened.snapshot)
            return self.at_end
        if self.growth is not None and not opened.grown:
            grown = _growth(opened.start, sample)
            if grown is not None and grown > self.growth:
                opened.grown = True
                self.attribute(sample, opened.snapshot)
                return True
        return False

    def attribute(self, sample: Sample, before: Snapshot | None) -> list[Holder]:
        """Attribute now against ``before``; the holders, tagged with ``sample``'s place, are
        added to :attr:`holders` and returned."""
        found = attribute(
            before, limit=self.limit, max_depth=self.max_depth, max_objects=self.max_objects
        )
        tagged = [
            replace(h, phase=sample.phase, epoch=sample.epoch, label=sample.label) for h in found
        ]
        self.holders.extend(tagged)
        return tagged


def explain(holders: Sequence[Holder], findings: Iterable[Any]) -> list[Holder]:
    """Who to name for a verdict's leak, teardown and OOM findings, largest first, each path
    once (a holder seen at several checkpoints is named at its largest).

    A leak or OOM is explained by the ``holders`` a recorder found during the run in the
    finding's phase. A teardown residue, or a leak or OOM nobody was found for, takes a search
    of the tensors alive now (no snapshot: what outlived the run). Nothing to explain, nothing
    searched: a passing run pays nothing.
    """
    named: list[Holder] = []
    search = False
    for finding in findings:
        kind = getattr(finding, "kind", None)
        if kind not in ("leak", "teardown", "oom"):
            continue
        found = [h for h in holders if h.phase == finding.phase and h not in named]
        search = search or kind == "teardown" or not found
        named += found
    if search:
        named += attribute(limit=5)
    largest: dict[str, Holder] = {}
    for holder in sorted(named, key=lambda h: -h.bytes):
        largest.setdefault(holder.path, holder)
    return list(largest.values())


@dataclass
class _Open:
    snapshot: Snapshot
    start: Sample
    grown: bool = False


def _growth(start: Sample, now: Sample) -> int | None:
    for metric in ("allocated", "rss"):
        a, b = start.get(metric), now.get(metric)
        if a is not None and b is not None:
            return b - a
    return None
