"""The recorder: samples a probe at named checkpoints and streams them to a JSONL timeline."""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import platform
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from harness import __version__
from harness.probes import Probe, make_probe
from harness.sample import Sample
from harness.timeline import TimelineWriter
from harness.units import format_mb, parse_size


class DeviceOutOfMemory(torch.OutOfMemoryError):
    """A checkpoint found an emulated capacity exceeded; ``sample`` is that checkpoint."""

    def __init__(self, message: str, sample: Sample) -> None:
        super().__init__(message)
        self.sample = sample


class Recorder:
    """Records memory at named checkpoints of a run.

    ``probe`` is ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`Probe`, which the
    recorder then owns and closes. ``timeline`` is a path for the JSONL timeline; its header
    holds versions, device, host, git commit, ``config`` (a mapping or a dataclass: the run's
    settings), ``meta`` (anything else) and the probe's notes on missing sources. Bad input
    raises at construction, before any file is created.

    ``capacity`` (bytes, or a size such as ``"4GiB"``) emulates a smaller device:

    - CUDA: caps the bytes PyTorch's caching allocator reserves in this process (through
      ``torch.cuda.set_per_process_memory_fraction``), so the allocation that crosses it raises
      a real ``torch.OutOfMemoryError``. The CUDA context and other processes are not counted.
    - CPU: compared at each checkpoint with the process's resident memory: its peak since the
      previous checkpoint (``rss`` where no peak is available). That includes the interpreter
      and libraries, about 230 MB with torch imported. The first checkpoint over it is recorded
      with a note, then raises :class:`DeviceOutOfMemory`; later ones raise again only after a
      checkpoint has come back under it, so an ``OOM`` event or a phase's END that follows does
      not raise a second time.

    On construction the recorder runs ``gc.freeze()``: what exists then is left out of later
    collections, which makes ``collect=True`` cost what the run itself allocated rather than
    ~90 ms for torch's own objects. Garbage cycles already present stay until :meth:`close`,
    which unfreezes them when this recorder was the one to freeze.
    """

    def __init__(
        self,
        probe: str | Probe = "auto",
        *,
        capacity: int | str | None = None,
        timeline: str | os.PathLike[str] | None = None,
        config: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        limit = None if capacity is None else parse_size(capacity, what="capacity")
        self.probe = make_probe(probe)
        self._timeline = None
        try:
            self._limit_at_checkpoints = limit is not None and not self.probe.limit(limit)
            self.capacity = limit if limit is not None else self.probe.capacity
            self.header = self._header(limit is not None, config, meta)
            if timeline is not None:
                self._timeline = TimelineWriter(timeline, self.header)
        except BaseException:
            self.probe.close()
            raise
        self.samples: list[Sample] = []
        self._phases: list[tuple[str, int | None]] = []
        self._phase: str | None = None
        self._epoch: int | None = None
        self._notes_said = len(self.probe.notes)
        self._armed = True
        self._closed = False
        self._unfreeze = gc.get_freeze_count() == 0
        gc.freeze()

    def _header(self, emulated: bool, config: Any, meta: Mapping[str, Any] | None) -> dict:
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        return {
            "leakgate": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "probe": self.probe.name,
            "primary": self.probe.primary,
            "metrics": list(self.probe.metrics),
            **self.probe.describe(),
            "capacity": self.capacity,
            "capacity_emulated": emulated,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "git_commit": _git_commit(),
            "config": dict(config) if config is not None else None,
            "meta": dict(meta) if meta is not None else {},
            "notes": list(self.probe.notes),
        }

    def checkpoint(
        self,
        label: str,
        *,
        phase: str | None = None,
        epoch: int | None = None,
        batch: int | None = None,
        collect: bool = False,
        note: str | None = None,
    ) -> Sample:
        """Sample the probe now and record it; ``peak`` covers the time since the last one.

        ``collect=True`` first runs a full ``gc.collect()`` and the probe's release (CUDA:
        synchronize and ``empty_cache``; CPU: ``malloc_trim(0)``). Phase and epoch default to
        the innermost :meth:`phase`'s.
        """
        if self._closed:
            raise RuntimeError(f"checkpoint {label!r}: the recorder is closed")
        if collect:
            gc.collect()
            self.probe.release()
        metrics = self.probe.sample()
        self.probe.reset_peak()
        notes = [note] if note else []
        if len(self.probe.notes) > self._notes_said:
            notes += self.probe.notes[self._notes_said :]
            self._notes_said = len(self.probe.notes)
        overflow = self._overflow(label, metrics)
        if overflow:
            notes.append(overflow)
        sample = Sample(
            label,
            self._phase if phase is None else phase,
            self._epoch if epoch is None else epoch,
            batch,
            time.time(),
            metrics,
            collect,
            "; ".join(notes) or None,
        )
        self.samples.append(sample)
        if self._timeline is not None:
            self._timeline.write(sample)
        if overflow:
            raise DeviceOutOfMemory(overflow, sample)
        return sample

    __call__ = checkpoint

    def _overflow(self, label: str, metrics: Mapping[str, int | None]) -> str | None:
        """The message for an emulated capacity crossed at this checkpoint, if it was."""
        if not self._limit_at_checkpoints:
            return None
        used = self.probe.capacity_used(metrics)
        over = used is not None and used > self.capacity
        raise_now = over and self._armed
        self._armed = not over
        if not raise_now:
            return None
        return (
            f"emulated capacity {format_mb(self.capacity)} exceeded at {label!r}: "
            f"{format_mb(used)} resident on {self.probe.name}"
        )

    @contextmanager
    def phase(
        self, name: str, epoch: int | None = None, *, collect: bool = False
    ) -> Iterator[Recorder]:
        """Record ``<name> START`` and ``<name> END`` and tag the checkpoints between them.

        ``epoch`` defaults to the enclosing phase's. END is recorded even when the block
        raises, with a note naming the exception.
        """
        self._phases.append((name, self._epoch if epoch is None else epoch))
        self._phase, self._epoch = self._phases[-1]
        ended_by = None
        try:
            self.checkpoint(f"{name} START", collect=collect)
            yield self
        except BaseException as error:
            ended_by = f"phase ended by {type(error).__name__}"
            raise
        finally:
            try:
                if not self._closed:
                    self.checkpoint(f"{name} END", collect=collect, note=ended_by)
            finally:
                self._phases.pop()
                self._phase, self._epoch = self._phases[-1] if self._phases else (None, None)

    def close(self) -> None:
        """Close the timeline and the probe, and undo the recorder's ``gc.freeze()``."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._timeline is not None:
                self._timeline.close()
        finally:
            self.probe.close()
            if self._unfreeze:
                gc.unfreeze()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@functools.cache
def _git_commit() -> str | None:
    """HEAD of the git repository around the working directory, if there is one."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None
