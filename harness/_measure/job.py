"""The job's memory as a recorder reads it at its checkpoints: the probe, the host beside a
device, the live children and their sum; which of a loop's batches the stride reads.

A reading that counts this process's heap leaves out leakgate's own bytes (the recorder's sample
store, the attribution's bookkeeping), asked of the caller before the probe is read: neither may
be judged as the run's growth. The job's total (:data:`~harness._measure.children.JOB`) is the
host's live heap and what the live children add, where both were read.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from harness._measure.children import CHILDREN_COST, JOB, ChildSampler
from harness._measure.host import HOST, OWN_COUNTED, HostMemory
from harness._measure.probes import Metrics, Probe
from harness._measure.sample import STRIDE

if TYPE_CHECKING:
    from harness._measure.capacity import CheckedCapacity


class JobReader:
    """Reads ``probe``, the ``host`` beside it (None where the probe reads the host itself, or
    where the host is not read) and the live ``children`` (None: not read) at a recorder's
    checkpoints. ``limit`` (bytes) is an emulated capacity: where the probe cannot make its
    device enforce it, :attr:`capacity` checks each reading against it.

    :attr:`processes` is the live children's text at the last reading that read them;
    :attr:`skips` says whether a loop's batch between two stride readings may go unread (every
    metric of the probe is read on the stride only, and no capacity is checked), its metrics
    then :attr:`unread`'s."""

    def __init__(
        self,
        probe: Probe,
        host: HostMemory | None,
        children: ChildSampler | None,
        limit: int | None,
    ) -> None:
        self.probe = probe
        self.host = host
        self.children = children
        self.capacity: CheckedCapacity | None = None  # not the device's own
        if limit is not None and not probe.limit(limit):
            from harness._measure.capacity import CheckedCapacity

            self.capacity = CheckedCapacity(limit, probe.capacity_metric, probe.name)
        self.processes: str | None = None
        strided = probe.strided
        self.skips = bool(strided) and set(strided) == set(probe.metrics) and self.capacity is None
        self.unread: Metrics = dict.fromkeys(probe.metrics)
        self._runs: dict[str, int] = {}  # each label's batches since a checkpoint of none
        self._first, self._every = STRIDE.first, STRIDE.every
        self._notes_said = len(probe.notes)

    def on_stride(self, label: str, batch: int | None, collect: bool) -> bool:
        """Whether this checkpoint is one of the stride's readings (of the probe's strided
        metrics, and of the host beside a device): every one that is not a batch's, and a
        label's batches on :data:`~harness._measure.sample.STRIDE`, counted from the last of
        those (all of them under an emulated capacity, checked at each)."""
        runs = self._runs
        if batch is None or collect or self.capacity:
            runs.clear()
            return True
        run = runs.get(label, 0)
        runs[label] = run + 1
        return run < self._first or not run % self._every  # STRIDE.reads(run), inline

    def counts_own(self, full: bool, stride: bool) -> bool:
        """Whether a reading (``full``: the probe's whole reading; ``stride``: one of the
        stride's) reads this process's heap, so that leakgate's own bytes are asked first."""
        return (self.probe.host and full) or (stride and self.host is not None)

    def read(
        self,
        full: bool,
        stride: bool,
        own: tuple[int, int] | None,
        *,
        rollup: bool,
        latest: bool,
    ) -> Metrics:
        """One reading: the probe's (``full``, else between two of the stride's: the peak
        window then goes on), the host's where it is beside the device and ``stride``, with
        ``own`` (leakgate's bytes, and their part in Python's allocator) left out; where
        ``full``, the peak window restarts and the children are read (``rollup`` and ``latest``
        as :meth:`~harness._measure.children.ChildSampler.read` takes them) with the job's
        total."""
        probe, host = self.probe, self.host if stride else None
        metrics = probe.sample() if full else probe.sample_between()
        prefix = ""
        if host is not None:
            prefix = HOST
            host.read(metrics, HOST)
        if own is not None and own[0]:
            _leave_out(metrics, prefix, *own)
        if full:
            probe.reset_peak()
        if self.children is not None and full:
            found = self.children.read(rollup=rollup, latest=latest)
            self.processes = None if found is None else found[1]
            if found is not None:
                metrics.update(found[0])
                _add_job(metrics, prefix, found)
        return metrics

    def collect(self) -> None:
        """Before a collected reading: a full ``gc.collect()`` and the probe's release (CUDA:
        synchronize and ``empty_cache``; CPU: ``malloc_trim(0)``)."""
        gc.collect()
        self.probe.release()

    def set_aside(self) -> None:
        """Keep what leakgate's own work used since the last reading (an attribution's search)
        out of the next: the heap it used trimmed where the probe reads this process's, and the
        peak window restarted."""
        if self.probe.host:
            self.probe.release()
        self.probe.reset_peak()

    def noted(
        self, label: str, metrics: Metrics, note: str | None, may_raise: bool
    ) -> tuple[str | None, str | None]:
        """The note of the reading ``metrics`` at ``label`` and, where it exceeds an emulated
        capacity and ``may_raise``, the message to raise: the note is ``note``, then the
        probe's notes made since the last reading (what it found it cannot read), then that
        message, joined."""
        capacity, notes = self.capacity, self.probe.notes
        overflow = capacity.exceeded(label, metrics, may_raise) if capacity is not None else None
        said = [note] if note else []
        if len(notes) > self._notes_said:
            said += notes[self._notes_said :]
            self._notes_said = len(notes)
        if overflow:
            said.append(overflow)
        return "; ".join(said) or None, overflow


def limit_of(capacity: int | str | None) -> int | None:
    """An emulated capacity given as bytes or a size such as ``"4GiB"``, in bytes (a
    :class:`~harness._core.errors.BadArgument` for anything else); its reader loads only for a
    run that has one."""
    if capacity is None:
        return None
    from harness._core.units import parse_size

    return parse_size(capacity, what="capacity")


def _leave_out(metrics: Metrics, prefix: str, own: int, own_python: int) -> None:
    """Leakgate's ``own`` bytes out of the metrics that count all of them, and out of
    ``malloc`` and ``python`` each its own part (``own_python`` is in Python's allocator)."""
    for name in OWN_COUNTED:
        value = metrics.get(prefix + name)
        if value is not None:
            metrics[prefix + name] = value - own
    for name, less in {"malloc": own_python - own, "python": -own_python}.items():
        value = metrics.get(prefix + name)
        if value is not None:
            metrics[prefix + name] = value + less


def _add_job(metrics: Metrics, prefix: str, children: tuple[dict[str, int], str | None]) -> None:
    """The job's memory into ``metrics``: the host's live heap (its metrics named with
    ``prefix``) and what the live children add, where both were read (no child alive adds
    nothing)."""
    live, (found, processes) = metrics.get(prefix + "allocated"), children
    cost = found.get(CHILDREN_COST, None if processes else 0)
    if live is not None and cost is not None:
        metrics[JOB] = live + cost
