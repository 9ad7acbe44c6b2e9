"""Attribution during a run: :class:`PhaseAttribution` acts on each checkpoint a recorder takes,
noting the live tensors when a phase starts and when its warm-up ends, and naming what holds the
phase's new ones where its growth after warm-up passes a budget (and again each time it doubles,
and at the phase's end), at an out-of-memory event, or at every end when asked, while the loop's
locals that hold them are still alive."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import harness._core.labels as labels
from harness._attribution.holders import MAX_OBJECTS, Holder, attribute
from harness._attribution.lines import PYTHON_OBJECTS, Lines
from harness._attribution.pick import RETAINED_FROM, pick
from harness._attribution.quiet import memory_tracer
from harness._attribution.retained import retained_holders
from harness._attribution.sites import in_use as sites_in_use
from harness._attribution.sites import record_sites
from harness._attribution.snapshot import Snapshot, live_tensors
from harness._measure.host import live_python
from harness._measure.malloc import live_heap
from harness._measure.sample import Sample
from harness._verdict.options import Rules


class PhaseAttribution:
    """Attribution at a recorder's checkpoints (``Recorder(attribute=...)``).

    A checkpoint whose ``edge`` is ``START`` (``VALIDATION_START``, ``validation START``)
    notes the live tensors for its phase; a phase whose checkpoints come without one is noted
    at its first checkpoint instead. A checkpoint whose ``edge`` is ``END`` attributes the
    tensors that are new since, and so does an out-of-memory event (a sample whose ``event`` is
    ``OOM``: an ``OOM`` label, an emulated capacity exceeded), once per phase, against
    the phase's snapshot, or the run's first when the phase has none. With ``growth`` (bytes or
    a size such as ``"50MB"``), growth is counted the way the leak rule counts it: from the
    phase's first checkpoint after ``warmup`` batches (its *base*, where a second snapshot is
    taken, so a first batch's allocator jump is never growth). The first checkpoint whose
    ``metric`` reading (default ``allocated``, else ``rss``) exceeds the base by more than
    ``growth`` attributes what is new since the base, again each time that growth has doubled
    since the last attribution (at most :data:`ATTRIBUTIONS` times a phase), and once more at
    the phase's END: a loop that frees what it kept once it ends is named while it still keeps
    it, and a leak is named when it is many items old, not one. Each holder carries the growth
    since the base at its checkpoint, which is what its share is measured against. With
    ``at_end=False`` an END of a phase that never passed ``growth`` attributes nothing, so a run
    that stays within its budget pays for snapshots (well under a millisecond with the
    recorder's frozen heap) and a comparison per checkpoint, never for a search. With
    ``sites`` (the default) CUDA allocation stacks are recorded while the recorder is open.
    ``limit``, ``max_depth`` and ``max_objects`` go to each :func:`attribute`. Each
    result is kept in :attr:`holders`, tagged with the checkpoint's phase, epoch and label; each
    phase's latest snapshot stays available to :meth:`snapshot_for`. With ``explain`` (the
    dearer search, ``--memreport-explain``) a :class:`~harness._attribution.lines.Lines` notes
    the line that allocated each storage and traces Python objects while the recorder is open,
    so that holders say where their memory was allocated and what no object holds is named by
    its line; CUDA allocation stacks are recorded too.
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
        metric: str | None = None,
        explain: bool = False,
        warmup: int = 0,
        drift: int | str | None = None,
        warmup_epochs: int = 1,
    ) -> None:
        # read and checked as the rules read them: one parse of every option, one error
        rules = Rules(
            max_growth=growth, warmup=warmup, max_drift=drift, warmup_epochs=warmup_epochs
        )
        self.growth, self.drift = rules.max_growth, rules.max_drift
        self.warmup, self.warmup_epochs = rules.warmup, rules.warmup_epochs
        self._epochs: dict[str | None, _Epochs] = {}
        self.explain = explain
        self.lines = Lines() if explain else None
        self._python: dict[str | None, Any] = {}
        self._python_sizes: dict[int, int] = {}
        """The Python objects each of those holds (its lists and trace keys), measured when made."""
        self._python_first: Any = None
        self._left = 0
        self.at_end = at_end
        self.limit = limit
        self.max_depth = max_depth
        self.max_objects = max_objects
        self.metric = metric
        self.holders: list[Holder] = []
        self._open: dict[str | None, _Open] = {}
        self._starts: dict[str | None, Snapshot] = {}
        self._first: Snapshot | None = None
        self._sites = sites or explain
        self._stop_sites = False
        self.searches = 0
        """Searches run so far (at most :data:`SEARCHES`)."""
        self.weighed = 0
        """Of those, searches by retained size."""
        self._aside: set[str] = set()

    @classmethod
    def for_rules(cls, rules: Rules, *, explain: bool = False) -> PhaseAttribution:
        """Ready to name holders as ``rules`` judge the run, for every front end alike: where a
        phase's growth first crosses ``max_growth`` (and each doubling), at an OOM, at a later
        epoch's drift past ``max_drift``, and at every phase's END with ``rules.attribute``;
        the dearer search with ``explain`` or ``rules.explain``."""
        return cls(
            growth=rules.max_growth,
            metric=rules.metric,
            at_end=rules.attribute,
            sites=rules.attribute,
            explain=explain or rules.explain,
            warmup=rules.warmup,
            drift=rules.max_drift,
            warmup_epochs=rules.warmup_epochs,
        )

    def start(self) -> None:
        """Begin recording CUDA allocation stacks when ``sites`` is set and CUDA is in use."""
        if self._sites and sites_in_use():
            self._stop_sites = not record_sites(True)
        if self.lines is not None:
            self.lines.open()

    def close(self) -> None:
        """Stop the recording :meth:`start` began; close the open phases (their snapshots stay
        available to :meth:`snapshot_for`)."""
        if self._stop_sites:
            record_sites(False)
            self._stop_sites = False
        if self.lines is not None:
            self.lines.close()
        self._open.clear()

    def own_bytes(self, exact: bool = False) -> int:
        """Host memory this attribution keeps for itself now (the dearer search's bookkeeping,
        the snapshots it holds): a recorder leaves it out of its readings, so explaining a run
        never changes its verdict. ``exact`` counts the traces again (a phase's edges, the
        readings a drift compares)."""
        kept = sum(s.nbytes() for s in self._held())
        if self.lines is None:
            return kept
        kept += self._left
        traced = {id(t): t for t in (*self._python.values(), self._python_first) if t}
        self._python_sizes = {k: v for k, v in self._python_sizes.items() if k in traced}
        kept += sum(sys.getsizeof(t) + self._python_sizes.get(k, 0) for k, t in traced.items())
        return kept + self.lines.own_bytes(exact)

    def own_python(self) -> int:
        """The part of :meth:`own_bytes` in Python's allocator: the small objects its snapshots
        keep (their weak references, the ints in their tables)."""
        return sum(s.python for s in self._held())

    def _held(self) -> list[Snapshot]:
        """The snapshots this attribution holds now, each once."""
        held = [*self._starts.values(), self._first]
        held += [s for o in self._open.values() for s in (o.snapshot, o.base_snapshot, o.census)]
        held += [e.reference[0] for e in self._epochs.values() if e.reference is not None]
        return list({id(s): s for s in held if s is not None}.values())

    def snapshot_for(self, phase: str | None) -> Snapshot | None:
        """What was alive when ``phase`` last ended its warm-up, else when it started, else
        when the run's first phase did: tensors older than that (a warm-up's one-time ones)
        are never named for the phase's growth."""
        return self._starts.get(phase, self._first)

    def observe(self, sample: Sample) -> bool:
        """Act on one recorded checkpoint; returns whether it took a snapshot or attributed
        (the dearer search's traces are then counted again: what it keeps is its own). With
        the dearer search, what the heap (malloc's and Python's allocator's) changes by while
        it acts beyond what it counts as kept is its own too, for good: tracemalloc interns the
        stack of each allocation its snapshots make and never frees those tracebacks while it
        runs, a search leaves what it looked up, and tracemalloc's tables, freed when tracing
        stops before a walk of every object, held more of malloc than it reports. Left out,
        each would step the loop's readings there (`tests/test_explain_verdict.py`)."""
        lines = self.lines
        heap, own = (_live(), self.own_bytes()) if lines is not None else (None, 0)
        acted = self._act(sample)
        if acted and lines is not None:
            lines.recount()
            now = _live()
            if heap is not None and now is not None:
                self._left += now - heap - (self.own_bytes() - own)
        return acted

    def _act(self, sample: Sample) -> bool:
        edge = sample.edge
        if edge == labels.START:
            self._open_phase(sample)
            return True
        opened = self._open.get(sample.phase)
        if edge == labels.END:
            self._open.pop(sample.phase, None)
        if labels.is_oom(sample) and not (opened and opened.oom):
            if opened is not None:
                opened.oom = True
            grown = self._growth(opened.start, sample) if opened else None
            self.attribute(sample, opened.snapshot if opened else self._first, grown)
            return True
        if edge == labels.END:
            drifting = self._epochs.get(sample.phase)
            if drifting is not None and drifting.named_at is not None:
                self._drift_named(sample, drifting)  # with this epoch's generation made
            if opened is None or not (self.at_end or opened.named_at is not None):
                return False
            if opened.base is None:  # what the phase left, in its warm-up
                self.attribute(sample, opened.snapshot, self._growth(opened.start, sample))
            elif opened.named_at is None:  # what the phase left after its warm-up
                self.attribute(sample, opened.base_snapshot, self._growth(opened.base, sample))
            else:  # the growth named during the loop, confirmed at its end
                self._name(sample, opened, self._growth(opened.base, sample))
            return True
        if opened is None:
            if sample.phase is None:
                return False
            self._open_phase(sample)
            opened = self._open[sample.phase]
        if opened.base is None:
            if not opened.warm(sample, self.warmup):
                return False
            opened.base = sample
            opened.base_snapshot = self._starts[sample.phase] = live_tensors()
            return True
        if self.growth is None or opened.attributions >= ATTRIBUTIONS - 1:
            return False
        grown = self._growth(opened.base, sample)
        if grown is None:
            return False
        bar = self.growth if opened.named_at is None else max(self.growth, 2 * opened.named_at)
        named = grown > bar
        if named:
            opened.named_at = grown
            opened.attributions += 1
            self._name(sample, opened, grown)
        if opened.census is None and grown >= CENSUS_FROM:  # after: it counts from here on
            self._walk_everything()
            opened.census = live_tensors(objects=True)
            return True
        return named

    def _name(self, sample: Sample, opened: _Open, growth: int | None) -> None:
        """Name what holds the phase's growth since its base, by :func:`~harness._attribution.
        pick.pick`'s rule, with the phase's census for the search by retained size."""
        self.attribute(sample, opened.base_snapshot, growth, opened.census)

    def attribute(
        self,
        sample: Sample,
        before: Snapshot | None,
        growth: int | None = None,
        census: Snapshot | None = None,
    ) -> list[Holder]:
        """Name what holds ``growth`` now, new since ``before`` (and, by retained size, since
        ``census`` where :func:`~harness._attribution.pick.pick` asks for it); the holders,
        tagged with ``sample``'s place and the ``growth`` so far, are added to :attr:`holders`
        and returned."""
        found = self.search(before, self._python.get(sample.phase))
        chosen = pick(found, growth, self._by_retained(census, growth))
        tagged = [
            replace(h, phase=sample.phase, epoch=sample.epoch, label=sample.label, growth=growth)
            for h in chosen
        ]
        self.holders += tagged
        return tagged

    def _by_retained(
        self, census: Snapshot | None, growth: int | None
    ) -> Callable[[], list[Holder]] | None:
        """The search by retained size since ``census``, for :func:`~harness._attribution.pick.
        pick` to run where its rule asks; none without a census or where searches step aside."""
        if census is None or self._stepped_aside():
            return None

        def search() -> list[Holder]:
            self.searches += 1
            self.weighed += 1
            self._walk_everything()
            return retained_holders(census, self.max_objects, growth=growth)

        return search

    def search(self, before: Snapshot | None, python: Any = None) -> list[Holder]:
        """Who holds what is new since ``before``, with this attribution's settings; with
        ``explain``, Python objects allocated since ``python`` (a tracemalloc snapshot, else
        since tracing began) are named by line too. Where another memory tracer watches the
        process, or this attribution has searched :data:`SEARCHES` times, it searches nothing
        and says why, once, as a holder of nothing (``<not searched: memray tracks this
        process>``)."""
        why = self._stepped_aside()
        if why is not None:
            if why in self._aside:
                return []
            self._aside.add(why)
            return [Holder(f"<not searched: {why}>", "search stepped aside", 0, 0, 0)]
        self.searches += 1
        if self.lines is None:
            found = attribute(
                before, limit=None, max_depth=self.max_depth, max_objects=self.max_objects
            )
        else:
            grown = self.lines.python_growth(python or self._python_first)
            self._walk_everything()
            found = attribute(
                before,
                limit=None,
                max_depth=self.max_depth,
                max_objects=self.max_objects,
                lines=self.lines,
            )
            found += [
                Holder(
                    f"{PYTHON_OBJECTS} {line}",
                    "objects",
                    count,
                    0,
                    size,
                    sites=(line,),
                    note="allocated there (tracemalloc)",
                )
                for line, size, count in grown
            ]
        found.sort(key=lambda h: (-h.bytes, -h.tensors, h.path))
        return found[: self.limit] if self.limit is not None else found

    def _stepped_aside(self) -> str | None:
        """Why no search may run now: another memory tracer, or the cap on searches."""
        if self.searches >= SEARCHES:
            return f"{SEARCHES} searches already (their cap)"
        return memory_tracer(own_tracemalloc=self.lines is not None and self.lines.traced)

    def _open_phase(self, sample: Sample) -> None:
        if self.lines is not None and self.lines.open_now:
            self.lines.trace()
            before = live_python()
            python = self.lines.snapshot()
            after = live_python()
            if python is not None and before is not None and after is not None:
                self._python_sizes[id(python)] = max(0, after - before)
            self._python[sample.phase] = python
            if self._python_first is None:
                self._python_first = python
        snapshot = live_tensors()
        self._open[sample.phase] = _Open(snapshot, sample)
        self._starts[sample.phase] = snapshot
        if self._first is None:
            self._first = snapshot
        if self.drift is not None and sample.epoch is not None:
            self._drift(sample, snapshot)

    def _drift(self, sample: Sample, snapshot: Snapshot) -> None:
        """At a phase's start in a later epoch: name what it keeps that the phase's first judged
        epoch (after ``warmup_epochs``) did not, over everything made since that epoch started
        (between phases too); see :meth:`_drift_named`."""
        assert self.drift is not None
        epochs = self._epochs.setdefault(sample.phase, _Epochs())
        epochs.seen.add(sample.epoch)
        if epochs.reference is None:
            if len(epochs.seen) > self.warmup_epochs:
                self._walk_everything()
                epochs.reference = (live_tensors(objects=True), sample)
            return
        self._drift_named(sample, epochs)

    def _drift_named(self, sample: Sample, epochs: _Epochs) -> None:
        """Name a drift at a later epoch's start or end where it passes ``drift`` for the
        first time, where it has doubled since it was last named, or where two later epochs
        first exist (two generations of what drifts: what holds them all is then named)."""
        assert epochs.reference is not None and self.drift is not None
        drift = self._growth(epochs.reference[1], sample)
        if drift is None or drift <= self.drift or epochs.attributions >= ATTRIBUTIONS:
            return
        if epochs.named_at is None or drift > 2 * epochs.named_at or self._due(epochs):
            epochs.named_at = max(drift, epochs.named_at or 0)
            self._name_drift(sample, epochs, drift)

    def _due(self, epochs: _Epochs) -> bool:
        """Whether a search by retained size is due: two later epochs exist, and none ran."""
        assert epochs.reference is not None
        later = [e for e in epochs.seen if e is not None and e > (epochs.reference[1].epoch or 0)]
        return len(later) >= 2 and not epochs.retained

    def _name_drift(self, sample: Sample, epochs: _Epochs, drift: int) -> None:
        """Name a drift's holders now: the tensors new since its reference, and, once two
        later epochs exist, what retains everything new since then (once), at its accumulation
        point: the list that keeps every epoch's optimizer, not one epoch's optimizer among
        them."""
        assert epochs.reference is not None
        epochs.attributions += 1
        census = epochs.reference[0] if self._due(epochs) else None
        weighed = self.weighed
        self.attribute(sample, epochs.reference[0], drift, census)
        epochs.retained = self.weighed > weighed

    def _walk_everything(self) -> None:
        """Before a walk of every object: the dearer search's tracing stops for good."""
        if self.lines is not None:
            self.lines.stop_tracing()

    def _growth(self, start: Sample, now: Sample) -> int | None:
        for metric in (self.metric,) if self.metric else ("allocated", "rss"):
            a, b = start.get(metric), now.get(metric)
            if a is not None and b is not None:
                return b - a
        return None


def _live() -> int | None:
    """What this attribution's own bytes are counted against: malloc's live heap and Python's
    allocator's blocks together (its tables live in one, its snapshots' objects in the other)."""
    heap, python = live_heap(), live_python()
    return None if heap is None or python is None else heap + python


CENSUS_FROM = RETAINED_FROM // 8
"""Growth past a phase's base at which every object alive is noted for a later search by
retained size (:data:`RETAINED_FROM`): the census walks every module's globals (tens of
milliseconds in a torch process), a cost a phase that does not grow never pays; what was
made before it, an eighth of the least growth searched at most, is not counted as new."""
ATTRIBUTIONS = 6
"""Searches a phase may take: where its growth passes the budget, each doubling, and its end."""
SEARCHES = 24
"""Searches a run may take, over all its phases and epochs: a run of many epochs pays for a few
searches, not for a few per epoch."""


@dataclass
class _Epochs:
    """A phase across epochs: the epochs seen, the start of its first judged one (every object
    alive then, and its reading), the drift named so far and whether a search by retained size
    named it."""

    seen: set[int | None] = field(default_factory=set)
    reference: tuple[Snapshot, Sample] | None = None
    named_at: int | None = None
    attributions: int = 0
    retained: bool = False


@dataclass
class _Open:
    """A phase being recorded: its START snapshot and reading, its base (the first checkpoint
    the leak rule judges, after warm-up) and what was attributed since."""

    snapshot: Snapshot
    start: Sample
    base: Sample | None = None
    base_snapshot: Snapshot | None = None
    census: Snapshot | None = None
    """Every object alive once the phase had grown :data:`CENSUS_FROM` past its base: what a
    search by retained size counts from."""
    named_at: int | None = None
    attributions: int = 0
    oom: bool = False
    first_batch: int | None = None
    seen: int = 0

    def warm(self, sample: Sample, warmup: int) -> bool:
        """Whether ``sample`` is past the phase's warm-up, counted as the leak rule counts it:
        by batch number from the phase's first batch, else by checkpoints."""
        self.seen += 1
        if sample.batch is None:
            return self.seen > warmup
        if self.first_batch is None:
            self.first_batch = sample.batch
        return sample.batch >= self.first_batch + warmup
