"""Explaining a verdict: for each leak, teardown and out-of-memory finding, the holders to name
(:func:`explain`) and how much of the finding's bytes they account for (:func:`shares`), so a
message can say ``held: 21.8 of 23.0 MiB`` or admit that most of the growth has no name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import harness._core.labels as labels
from harness._attribution.holders import Holder, attribute
from harness._attribution.lines import PYTHON_OBJECTS
from harness._attribution.phase import PhaseAttribution
from harness._attribution.pick import pick
from harness._attribution.snapshot import Snapshot
from harness._attribution.torch_state import PROFILER
from harness._verdict.model import Kind

EXPLAINED = (Kind.LEAK, Kind.DRIFT, Kind.TEARDOWN, Kind.OOM, Kind.CHILD_LEAK)
_SEARCH_LIMIT = 5
_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


@dataclass(frozen=True)
class Share:
    """One finding's named holders and the part of its bytes they hold: ``growth`` is the
    finding's ``bytes`` (growth, teardown residue, or the level at an OOM), ``held`` the bytes
    of the holders named at the one checkpoint that names the most; ``named_at`` the phase's
    growth at that checkpoint and ``label`` the checkpoint, when the holders were named during
    the run (a loop attributed where it crossed its budget holds less than at its end)."""

    kind: str
    phase: str | None
    epoch: int | None
    growth: int | None
    held: int
    holders: tuple[Holder, ...] = ()
    named_at: int | None = None
    label: str | None = None

    @property
    def _early(self) -> bool:
        """Named at a checkpoint before the phase had grown by most of ``growth``."""
        return (
            self.named_at is not None
            and self.named_at > 0
            and self.growth is not None
            and self.named_at < 0.9 * self.growth
        )

    @property
    def _whole(self) -> int | None:
        """The growth ``held`` is compared with: the phase's growth where the holders were
        named, when they were named during the run, else the finding's."""
        return self.named_at if self.named_at is not None and self.named_at > 0 else self.growth

    @property
    def fraction(self) -> float | None:
        """``held`` over the growth it is compared with (at most 1: what the holders keep
        beyond the growth was there before it), or None without a positive one."""
        whole = self._whole
        return min(self.held / whole, 1.0) if whole is not None and whole > 0 else None

    @property
    def text(self) -> str:
        """One line: ``held: 21.8 of 23.0 MiB``, saying so when that is under half; for holders
        named before most of the growth, against the growth then: ``held: 1.0 of 1.0 MiB grown
        by VALIDATION_BATCH, when named (+3.4 MiB by the end)``."""
        fraction, whole = self.fraction, self._whole
        if self.growth is None or fraction is None or whole is None:
            return f"held: {_sizes(self.held)}"
        held = min(self.held, whole)
        if self._early:
            assert self.growth is not None
            text = (
                f"held: {_sizes(held, whole)} grown by {self.label}, when named "
                f"({_sizes(self.growth)} by the end)"
            )
        else:
            text = f"held: {_sizes(held, whole)}"
        if fraction < 0.5:
            text += f" ({fraction:.0%}: most of it has no named holder)"
        return text

    def __str__(self) -> str:
        return self.text


def shares(
    holders: Sequence[Holder] | PhaseAttribution,
    findings: Iterable[Any],
    workers: Sequence[Holder] = (),
) -> list[Share]:
    """For each leak, drift, teardown, OOM and child-leak finding (others are skipped), the
    holders to name for it and how much of its bytes they hold.

    A leak or OOM is explained by the holders found during the run in the finding's phase (of
    its epoch, when some are). A teardown residue, or a finding nobody was found for, takes a
    search of the tensors alive now, one per snapshot: given the :class:`PhaseAttribution`
    itself, against what was alive when the finding's phase started (the run's start for a
    phase without one), so nothing older is named for it; given its holders only, against the
    last ``gc.freeze()`` (a recorder's start). A child-leak is explained by what the
    ``workers`` named on their own heaps (:mod:`harness._attribution.worker_holders`): the worker
    whose holders hold the most, against its growth when it named them. Nothing to explain, nothing
    searched.
    """
    attribution = holders if isinstance(holders, PhaseAttribution) else None
    found = list(holders.holders if isinstance(holders, PhaseAttribution) else holders)
    searched: dict[int, list[Holder]] = {}
    result = []
    for finding in findings:
        kind = getattr(finding, "kind", None)
        if kind not in EXPLAINED:
            continue
        phase, epoch = getattr(finding, "phase", None), getattr(finding, "epoch", None)
        if kind == Kind.CHILD_LEAK:  # named inside the workers, on their own heaps
            held, place = _held(workers)
            inside = tuple(_worth_naming(named(h for h in workers if _place(h) == place)))
            result.append(Share(str(kind), phase, epoch, place[2], held, inside))
            continue
        chosen = [h for h in found if h.phase == phase]
        if kind == Kind.DRIFT:  # named at a later epoch's start and end, against the first judged
            chosen = [h for h in chosen if h.label and labels.edge_of(h.label) is not None]
        if epoch is not None and any(h.epoch == epoch for h in chosen):
            chosen = [h for h in chosen if h.epoch == epoch]
        if kind == Kind.DRIFT:  # of those, the ones named at the drift's own label, where some are
            evidence = getattr(finding, "evidence", ())
            label = evidence[-1].label if evidence else None
            chosen = [h for h in chosen if h.label == label] or chosen
        if kind == Kind.TEARDOWN or not chosen:
            before = attribution.snapshot_for(phase) if attribution is not None else None
            found = _search(before, searched, attribution)
            chosen += pick(found, getattr(finding, "bytes", None))
        held, place = _held(chosen)
        there = [h for h in chosen if _place(h) == place]
        result.append(
            Share(
                str(kind),
                phase,
                epoch,
                getattr(finding, "bytes", None),
                held,
                tuple(_worth_naming(named(there or chosen))),
                place[2],
                place[0] if place[2] is not None else None,
            )
        )
    return result


def held_by_profiler(share: Share, budget: int | None) -> bool:
    """Whether ``share``, a leak's, is a torch profiler's: the profiler is named for it (it
    holds what Python holders leave, over half) and the Python objects named beside it hold
    under ``budget`` (nothing, without one), so what Python keeps is judged as before."""
    if share.kind != Kind.LEAK or all(h.path != PROFILER for h in share.holders):
        return False
    python = sum(h.bytes for h in share.holders if not h.path.startswith("<"))
    return python == 0 or (budget is not None and python < budget)


def explain(holders: Sequence[Holder] | PhaseAttribution, findings: Iterable[Any]) -> list[Holder]:
    """Who to name for a verdict's leak, teardown and OOM findings, largest first, each path
    once (a holder seen at several checkpoints is named at its largest); see :func:`shares`
    for which holders a finding takes. A passing run pays nothing."""
    return named(h for share in shares(holders, findings) for h in share.holders)


def _search(
    before: Snapshot | None,
    searched: dict[int, list[Holder]],
    attribution: PhaseAttribution | None = None,
) -> list[Holder]:
    key = id(before)
    if key not in searched:
        if attribution is not None and attribution.explain:
            searched[key] = attribution.search(before)
        else:
            searched[key] = attribute(before=before, limit=_SEARCH_LIMIT)
    return searched[key]


def named(holders: Iterable[Holder]) -> list[Holder]:
    """``holders`` largest first, each path once (at its largest)."""
    largest: dict[str, Holder] = {}
    for holder in sorted(holders, key=lambda h: -h.bytes):
        largest.setdefault(holder.path, holder)
    return list(largest.values())


HINT = (
    "  hint: --memreport-explain (or memleak(explain=True)) names the lines that allocated "
    "what no object was found holding"
)


def hint(found: Sequence[Share], explained: bool = False) -> list[str]:
    """A one-line hint for a failure message when the dearer search would help: a leak,
    teardown or OOM finding whose named holders hold under half of it (or nothing), and the
    run was not explained already."""
    if explained:
        return []
    weak = [
        s
        for s in found
        if s.growth is not None
        and s.growth > 0
        and (not s.holders or (s.fraction is not None and s.fraction < 0.5))
    ]
    return [HINT] if weak else []


Place = tuple[str | None, int | None, int | None]
NAMED_FLOOR = 0.02
"""A holder of less than this part of the largest one's bytes is not named (a loop's current
batch beside the list that keeps every batch)."""


def _worth_naming(holders: Sequence[Holder]) -> list[Holder]:
    """``holders`` (largest first) less those too small beside the largest to matter."""
    if not holders:
        return []
    floor = NAMED_FLOOR * holders[0].bytes
    return [h for h in holders if h.bytes >= floor or h.path.startswith(PYTHON_OBJECTS)]


def _place(holder: Holder) -> Place:
    """The attribution that named ``holder``: its checkpoint's label (the child's role, for a
    holder a worker named) and epoch, and the phase's growth there (two searches at
    checkpoints of one label grew by different amounts)."""
    return holder.label or holder.process, holder.epoch, holder.growth


def _held(holders: Sequence[Holder]) -> tuple[int, Place]:
    """Bytes held at the attribution whose holders hold the most (the latest of equals), and
    that attribution (one search's holders count each storage once; two searches may name the
    same storage twice)."""
    by_place: dict[Place, int] = {}
    for holder in holders:
        if holder.path.startswith(PYTHON_OBJECTS):
            continue  # listed by line; pymalloc's arenas are outside malloc's count
        by_place[_place(holder)] = by_place.get(_place(holder), 0) + holder.bytes
    if not by_place:
        return 0, (None, None, None)
    # The latest of equals: a search at a phase's end confirms what the loop's searches named.
    place = max(reversed(by_place), key=lambda p: by_place[p])
    return by_place[place], place


def _sizes(*sizes: int) -> str:
    """Sizes in the binary unit of the largest, one decimal: ``21.8 of 23.0 MiB``."""
    largest = max(abs(s) for s in sizes)
    for unit, scale in _UNITS:
        if largest >= scale:
            return " of ".join(f"{s / scale:.1f}" for s in sizes) + f" {unit}"
    return " of ".join(str(s) for s in sizes) + " B"
