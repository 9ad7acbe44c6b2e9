"""The recorder: samples a probe at named checkpoints and streams them to a JSONL timeline."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

import harness._core.labels as labels
from harness._core.errors import BadArgument, UnwritableReport, refused_as_argument
from harness._core.identity import rank_info
from harness._core.naming import check_path, rank_timeline
from harness._measure.children import ChildSampler
from harness._measure.host import HostMemory
from harness._measure.job import JobReader, limit_of
from harness._measure.patches import FREEZE, PATCHES, Hold
from harness._measure.probes import Probe, make_probe
from harness._measure.sample import Sample
from harness._timeline.header import run_header
from harness._timeline.store import SampleStore, make_sample
from harness._timeline.writer import TimelineWriter

if TYPE_CHECKING:  # the judging and explaining layers load only when a run asks for them
    from harness._attribution.holders import Holder
    from harness._attribution.phase import PhaseAttribution
    from harness._verdict.options import Rules


class DeviceOutOfMemory(torch.OutOfMemoryError):
    """A checkpoint found an emulated capacity exceeded; ``sample`` is that checkpoint."""

    def __init__(self, message: str, sample: Sample) -> None:
        super().__init__(message)
        self.sample = sample


class Asked(NamedTuple):
    """A checkpoint to record as its caller asked for it: label, place, collect, note, event, and
    whether the probe is read in ``full`` (else what it reads between the stride's readings)."""

    label: str
    phase: str | None = None
    epoch: int | None = None
    batch: int | None = None
    collect: bool = False
    note: str | None = None
    event: str | None = None
    full: bool = True


class Recorder:
    """Records memory at named checkpoints of a run.

    ``probe`` is ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`Probe`, which the
    recorder then owns and closes. ``timeline`` is a path for the JSONL timeline; its header
    holds versions, device, host, git commit, ``config`` (a mapping or a dataclass: the run's
    settings), ``meta`` (anything else) and the probe's notes on missing sources. Bad input
    raises at construction, before any file is created. ``capacity`` (the attribute) is the
    emulated capacity when one is given, else the device's.

    In a distributed run (an initialised process group, or ``RANK``/``WORLD_SIZE`` set: see
    :func:`harness._core.identity.rank_info`, kept as :attr:`rank`) the header also holds ``rank``,
    ``world_size``, ``local_rank`` and ``backend``, and the timeline is written to
    ``<stem>.rank<N>.jsonl``: each rank has its own file.

    ``capacity`` (bytes, or a size such as ``"4GiB"``) emulates a smaller device: on CUDA the
    caching allocator refuses to reserve past it (a real ``torch.OutOfMemoryError``); on the
    CPU a checkpoint over it (:mod:`harness._measure.capacity`) is recorded with a note, then raises
    :class:`DeviceOutOfMemory` (a ``torch.OutOfMemoryError``).

    The first recorder open in a process runs ``gc.freeze()`` when nothing is frozen yet, so
    that ``collect=True`` costs what the run allocated, not torch's own objects, and the
    attribution takes what existed then as old; the last to close runs ``gc.unfreeze()``
    (unless the process ran ``gc.freeze()`` since: all that is frozen is then its own). Where
    the process had frozen objects itself, leakgate freezes nothing and never unfreezes: the
    process's freeze stands for the recorder's start (what was made after it counts as new).
    What a recorder puts in torch (:mod:`harness._measure.patches`: the DataLoader worker loop
    and pid hooks) is put back when the last recorder holding it closes, or when its
    constructor raises.

    ``attribute=True`` (or a configured :class:`~harness._attribution.phase.PhaseAttribution`) names
    what holds new memory: live tensors are noted at each phase's START, attributed at its END
    and at ``OOM`` events, into :attr:`holders`; on CUDA, allocation stacks are recorded while
    the recorder is open. Without it a checkpoint pays nothing for the feature.

    ``children`` (default: ``rules.children``, else True) also records this process's live
    descendants, DataLoader workers by role (:mod:`harness._measure.children`), whatever the probe.

    A timeline write that fails mid-run (a full disk) does not stop the run: no later line is
    written, and the error is kept as :attr:`timeline_error` for the finishing step. Nor does an
    attribution that raises: it warns (:class:`~harness._core.errors.AttributionFailed`), and the
    checkpoint's note says so.
    """

    def __init__(
        self,
        probe: str | Probe = "auto",
        *,
        capacity: int | str | None = None,
        timeline: str | os.PathLike[str] | None = None,
        config: Any = None,
        meta: Mapping[str, Any] | None = None,
        attribute: bool | PhaseAttribution = False,
        rules: Rules | None = None,
        children: bool | None = None,
        host: bool | None = None,
    ) -> None:
        limit = limit_of(capacity)
        children, host = _checked(timeline, meta, rules, children, host)
        self.attribution: PhaseAttribution | None = None
        if attribute is not False:  # checked, and True made into one for the rules
            from harness._attribution.recording import attribution_for

            self.attribution = attribution_for(attribute, rules)
        self.rank = rank_info()
        with refused_as_argument():  # an unknown probe, a device that is not there
            self.probe = make_probe(probe)
        self._host: HostMemory | None = None
        self._children: ChildSampler | None = None
        self._timeline: TimelineWriter | None = None
        self._hold: Hold | None = None  # the gc.freeze() (see the class's docstring)
        try:  # what this holds is let go of when a step after it raises
            self._open(limit, children, host, timeline, config, meta, rules)
            self._keep_books()
            self._start(rules)
        except BaseException:
            self._release()
            raise

    def _open(
        self,
        limit: int | None,
        children: bool,
        host: bool,
        timeline: str | os.PathLike[str] | None,
        config: Any,
        meta: Mapping[str, Any] | None,
        rules: Rules | None,
    ) -> None:
        """What is read (the host beside a device that is not the host, a GPU; the children),
        the capacity, the header and the timeline it opens with."""
        self._host = HostMemory() if host and not self.probe.host else None
        self._children = ChildSampler() if children else None
        self._reader = JobReader(self.probe, self._host, self._children, limit)
        self.capacity = limit if limit is not None else self.probe.capacity
        self.header = run_header(
            self.probe, self._children, self.capacity, limit is not None, config, meta, self._host
        )
        if rules is not None:
            self.header["rules"] = rules.to_dict()
        if self.rank is not None:
            self.header.update(self.rank.to_header())
            if timeline is not None:
                timeline = rank_timeline(timeline, self.rank.rank)
        if timeline is not None:
            self._timeline = TimelineWriter(timeline, self.header)

    def _keep_books(self) -> None:
        """The run's bookkeeping, empty: samples, phases, names found valid, the timeline."""
        self.timeline_error: UnwritableReport | None = None
        self._wait = None if self._timeline is None else self._timeline.wait
        self._store = SampleStore()
        self._unread_samples: list[Sample] = []  # not yet in the store: see samples
        self._phases: list[tuple[str, int | None]] = []
        self._phase: str | None = None
        self._epoch: int | None = None
        self._checked: set[str] = set()  # labels and phase names found valid: checked once
        # labels found valid that name no event and no phase's edge: a loop's batches, which
        # may be recorded unread between two stride readings (see checkpoint)
        self._plain: set[str] = set()
        self._closed = False
        self._ended = False
        # whether a loop's batch may go unread (the stride's short path); never once closed
        self._strided = self._reader.skips

    def _start(self, rules: Rules | None) -> None:
        """Hold the freeze, start the attribution and, where workers are read, their search."""
        self._hold = PATCHES.hold(FREEZE)
        self._watched: str | None = None  # the board whose workers name their own holders
        if self.attribution is not None:
            from harness._attribution.recording import started

            self._watched = started(self.attribution, self._children, rules)

    def checkpoint(
        self,
        label: str,
        *,
        phase: str | None = None,
        epoch: int | None = None,
        batch: int | None = None,
        collect: bool = False,
        note: str | None = None,
        event: str | None = None,
    ) -> Sample:
        """Record a checkpoint and return its sample: the probe read now, ``peak`` covering the
        time since the last reading. Where every metric of the probe is read on the stride only
        (the CPU's, where it reads malloc), a loop's batch between two of the stride's readings
        (:data:`~harness._measure.sample.STRIDE`) takes a short path that reads nothing: its
        metrics are unread (``None``) and its processes the last reading's. A checkpoint that is
        not a batch's, a label's first, one with a note or an event, ``collect=True`` and any
        under an emulated capacity are always read.

        ``collect=True`` first runs a full ``gc.collect()`` and the probe's release (CUDA:
        synchronize and ``empty_cache``; CPU: ``malloc_trim(0)``). Phase and epoch default to
        the innermost :meth:`phase`'s. ``note`` is text (an OOM message); ``event`` says what
        happened (``"OOM"``, ``"CHECK_FAILED"``) where the label does not.
        """
        checked = self._checked
        if not (
            type(label) is str
            and label in checked
            and (phase is None or (type(phase) is str and phase in checked))
            and (epoch is None or (type(epoch) is int and 0 <= epoch < _LIMIT))
            and (batch is None or (type(batch) is int and 0 <= batch < _LIMIT))
            and (note is None or type(note) is str)
        ):
            labels.check_checkpoint(label, phase, epoch, batch, note)
            if len(checked) < _MAX_CHECKED:
                checked.update(t for t in (label, phase) if type(t) is str)
        plain = label in self._plain
        if event is not None or not plain:
            event = labels.given_event(label, event)
        reader = self._reader
        stride = reader.on_stride(label, batch, collect)
        if not stride and self._strided and plain and note is None and event is None:
            # a loop's batch between two stride readings, read by neither the probe nor the
            # children (their processes are the last reading's); its row and line come later
            unread = reader.unread.copy()
            sample = self._sample(label, phase, epoch, batch, unread, False, None, reader.processes)
            self._unread_samples.append(sample)
            if self._wait is not None:
                self._wait(sample)
            return sample
        full = stride or not self.probe.strided
        asked = Asked(label, phase, epoch, batch, collect, note, event, full)
        return self._record(asked, may_raise=event != labels.OOM, rollup=collect, stride=stride)

    __call__ = checkpoint

    def _sample(
        self,
        label: str,
        phase: str | None,
        epoch: int | None,
        batch: int | None,
        metrics: dict[str, int | None],
        collected: bool,
        note: str | None,
        processes: str | None,
        event: str | None = None,
        edge: str | None = None,
    ) -> Sample:
        """A checkpoint's sample: its one builder (phase and epoch default to the phase's)."""
        return make_sample(
            {
                "label": label,
                "phase": self._phase if phase is None else phase,
                "epoch": self._epoch if epoch is None else epoch,
                "batch": batch,
                "time": time.time(),
                "metrics": metrics,
                "collected": collected,
                "note": note,
                "processes": processes,
                "event": event,
                "edge": edge,
            }
        )

    def _record(
        self, asked: Asked, *, may_raise: bool, rollup: bool, stride: bool = True
    ) -> Sample:
        """Read and record the checkpoint ``asked`` for: ``may_raise`` where it may raise over
        an emulated capacity, ``rollup`` to read the children's rollups, ``stride`` where it is
        one of the stride's readings."""
        label, phase, epoch, batch, collect, note, event, full = asked
        if self._closed:
            raise RuntimeError(f"checkpoint {label!r}: the recorder is closed")
        plain = self._plain
        edge = None if label in plain else labels.edge_of(label)
        if event is None and edge is None and label not in plain and len(plain) < _MAX_CHECKED:
            plain.add(label)
        store = self.samples  # the unread samples' store rows, before the probe is read
        reader = self._reader
        if collect:
            reader.collect()
        own = self._own_bytes(store, edge is not None) if reader.counts_own(full, stride) else None
        metrics = reader.read(full, stride, own, rollup=rollup, latest=batch is None or collect)
        note, overflow = reader.noted(label, metrics, note, may_raise)
        event = labels.OOM if overflow else event
        sample = self._sample(
            label, phase, epoch, batch, metrics, collect, note, reader.processes, event, edge
        )
        acted = False
        if self.attribution is not None and full:  # it judges growth: nothing to read between
            from harness._attribution.recording import observe

            acted, sample = observe(self.attribution, sample, stacklevel=3)
        store.append(sample)
        if self._timeline is not None and self.timeline_error is None:
            try:
                self._timeline.write_recorded(sample)
            except OSError as error:
                self._lost(error)
        if acted:
            reader.set_aside()
        if overflow:
            raise DeviceOutOfMemory(overflow, sample)
        return sample

    def _own_bytes(self, store: SampleStore, exact: bool) -> tuple[int, int]:
        """Leakgate's own bytes in this process's heap, and their part in Python's allocator:
        the sample ``store``, which grows with every checkpoint, and the dearer search's
        bookkeeping (asked before the reading: it forgets what was freed since)."""
        attribution = self.attribution
        if attribution is None:
            return store.nbytes(), 0
        return store.nbytes() + attribution.own_bytes(exact=exact), attribution.own_python()

    @property
    def samples(self) -> SampleStore:
        """Every sample recorded, in order. A loop's batches between two stride readings join
        the store when it is next read or a checkpoint is read, in one pass on warm caches."""
        if self._unread_samples:
            for sample in self._unread_samples:
                self._store.append_unread(sample)
            self._unread_samples.clear()
        return self._store

    @property
    def run_id(self) -> str:
        """This run's id, in the timeline header and in the verdict saved for it."""
        return str(self.header["run_id"])

    @property
    def timeline_path(self) -> Path | None:
        """Where the timeline is streamed, or None."""
        return self._timeline.path if self._timeline is not None else None

    @property
    def holders(self) -> list[Holder]:
        """What the attribution found so far (empty without ``attribute``)."""
        return self.attribution.holders if self.attribution is not None else []

    @contextmanager
    def phase(
        self, name: str, epoch: int | None = None, *, collect: bool = False
    ) -> Iterator[Recorder]:
        """Record ``<name> START`` and ``<name> END`` and tag the checkpoints between them.

        ``epoch`` defaults to the enclosing phase's. END is recorded even when the block
        raises, with a note naming the exception (and no emulated-capacity check).
        """
        labels.check_checkpoint("phase", name, epoch, None, None)
        self._phases.append((name, self._epoch if epoch is None else epoch))
        self._phase, self._epoch = self._phases[-1]
        ended_by = None
        try:
            self._edge(f"{name} START", collect)
            yield self
        except BaseException as error:
            ended_by = f"phase ended by {type(error).__name__}"
            raise
        finally:
            try:
                if not self._closed:
                    self._edge(f"{name} END", collect, ended_by)
            finally:
                self._phases.pop()
                self._phase, self._epoch = self._phases[-1] if self._phases else (None, None)

    def _edge(self, label: str, collect: bool, ended_by: str | None = None) -> None:
        """Record a phase's START or END (``ended_by``: the exception that ended it, said in
        its note, and no emulated-capacity check then)."""
        full = self._reader.on_stride(label, None, collect)  # always: it restarts the stride
        asked = Asked(label, collect=collect, note=ended_by, full=full)
        self._record(asked, may_raise=not ended_by, rollup=True)

    def end(
        self,
        error: BaseException | labels.Raised | str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the timeline's end record once: the run finished, raising ``error`` (its type
        and first line kept apart), with ``details`` for a report rebuilt from the timeline
        (:func:`harness.finish_run`'s rules, holders and shares)."""
        if self._timeline is not None and not self._ended and not self._closed:
            self._ended = True
            if self.timeline_error is None:
                known = set(self.header["metrics"])
                met = [m for m in self.samples.metric_names if m not in known]
                try:
                    self._timeline.end(
                        None if error is None else labels.Raised.of(error),
                        {**(details or {}), **({"metrics": met} if met else {})},
                    )
                except OSError as failure:
                    self._lost(failure)

    def _lost(self, error: OSError) -> None:
        """Keep the first failed timeline write; the timeline gets no more lines."""
        reason = os.strerror(error.errno) if error.errno else str(error)
        self.timeline_error = UnwritableReport(error.filename or self.timeline_path or "", reason)
        self._wait = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (checkpoints then raise)."""
        return self._closed

    def close(self) -> None:
        """End the run (the timeline's end record, unless :meth:`end` wrote one); release the
        timeline, the probe, torch's hooks and the ``gc.freeze()``. Only a timeline that stops
        without its end record reads as a killed or crashed run."""
        if self._closed:
            return
        try:
            self.end()
        finally:
            self._closed = True
            self._strided = False
            self._release()

    def worker_holders(self) -> list[Holder]:
        """What DataLoader workers named as the holders of their own growth, with their roles."""
        if self._watched is None or self._children is None:
            return []
        from harness._attribution.worker_holders import held_in

        return held_in(self._watched, self._children.reader.history)

    def _release(self) -> None:
        try:
            if self._children is not None:  # torch's hooks and the workers' search put back
                self._children.close()
            if self._timeline is not None:
                self._timeline.close()
        finally:
            if self.attribution is not None:
                self.attribution.close()
            self.probe.close()
            if self._host is not None:
                self._host.close()
            if self._hold is not None:
                self._hold.release()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        """Close; a block that raised ends the run with its error."""
        if error is not None:
            self.end(error)
        self.close()


def _checked(
    timeline: str | os.PathLike[str] | None,
    meta: Mapping[str, Any] | None,
    rules: Rules | None,
    children: bool | None,
    host: bool | None,
) -> tuple[bool, bool]:
    """A recorder's arguments checked in turn (a :class:`BadArgument` for the first refused):
    whether the children and the host are read (by default, as ``rules`` say, else both)."""
    if rules is not None:
        from harness._verdict.options import Rules

        if not isinstance(rules, Rules):
            raise BadArgument(f"rules: expected a Rules or None, got {rules!r}")
    if meta is not None and not (
        isinstance(meta, Mapping) and all(isinstance(key, str) for key in meta)
    ):
        raise BadArgument(f"meta: expected a mapping with text keys or None, got {meta!r}")
    if timeline is not None:
        check_path(timeline, "timeline")
    return _flag("children", children, rules), _flag("host", host, rules)


def _flag(name: str, given: bool | None, rules: Rules | None) -> bool:
    """The flag ``name`` as given, else as ``rules`` set it, else True."""
    value = given if given is not None else getattr(rules, name) if rules is not None else True
    if not isinstance(value, bool):
        raise BadArgument(f"{name}: expected a bool or None, got {value!r}")
    return value


_LIMIT = labels.INDEX_LIMIT
_MAX_CHECKED = 4096
"""The most names a recorder remembers as checked, and as plain labels."""
