"""Probes: read one device's memory, in bytes, at a checkpoint.

A probe names its metrics (the contract with the rules engine, see :class:`harness.Sample`),
says which one is primary, knows its device's capacity when it can, and records in ``notes``
each source it had to do without (the recorder writes them once, in the timeline header).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
from abc import ABC, abstractmethod
from typing import Any

import torch

import harness._measure.host as host
from harness._core.errors import BadInput
from harness._measure.host import PARTS, HostMemory
from harness._measure.malloc import heap, libc_function

Metrics = dict[str, int | None]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
_MEMINFO = "/proc/meminfo"


class Probe(ABC):
    """One device's memory, sampled at checkpoints.

    ``name`` (``cpu``, ``cuda:0``), ``metrics`` (every name :meth:`sample` returns, but the
    pools of libraries imported since, ``pool_<library>``),
    ``primary`` (the metric a leak is judged on), ``capacity`` (the device's bytes, ``None``
    when unknown), ``capacity_metric`` (what an emulated capacity counts, with ``peak``
    between readings), ``host`` (whether it reads this process's own heap, where the
    recorder's bookkeeping and a holder search's memory count too) and ``notes`` (each
    missing source, in words). Everything the recorder, the rules and the report need to
    know of a device is asked of its probe: a new device is one class here.
    """

    name: str
    metrics: tuple[str, ...]
    primary: str
    capacity: int | None
    capacity_metric: str
    notes: list[str]
    host: bool = False

    @abstractmethod
    def sample(self) -> Metrics:
        """Every metric in bytes (``None`` where unavailable); ``peak`` covers the time since
        the last :meth:`reset_peak`."""

    strided: tuple[str, ...] = ()
    """Metrics read at a long loop's batches on :data:`~harness._measure.sample.STRIDE` only, left
    out (``None``) by :meth:`sample_between`; the peak window is reset at full readings only, so
    ``peak`` covers every batch between two of them."""

    def sample_between(self) -> Metrics:
        """A reading between two of the stride's: :meth:`sample` without :attr:`strided`. It
        adds no note; where :attr:`strided` is every metric, a recorder records such a
        checkpoint on its short path, without calling it."""
        return self.sample()

    @abstractmethod
    def reset_peak(self) -> None:
        """Start a new peak window."""

    @abstractmethod
    def release(self) -> None:
        """Give cached, unused memory back to its source, before a collected reading."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """``device``, ``total_memory`` and ``driver`` for the timeline header."""

    def limit(self, nbytes: int) -> bool:
        """Make the device itself refuse memory beyond ``nbytes``. False when it cannot, and
        the recorder checks ``capacity_metric`` and ``peak`` against it at each checkpoint."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Free the probe's own resources and undo :meth:`limit`."""


def _open(path: str, flags: int) -> tuple[int | None, str | None]:
    """A file descriptor kept open (re-reading /proc with pread costs < 1 µs), or why not."""
    try:
        return os.open(path, flags), None
    except OSError as error:
        return None, f"{path}: {error.strerror}"


class CpuProbe(Probe):
    """Host memory of this process, in each place it lives (:mod:`harness._measure.host`).

    - ``allocated``: the live heap: what ``malloc`` handed out and did not get back (glibc's
      ``mallinfo2``, or a preloaded jemalloc's or tcmalloc's own counter), the bytes in Python's
      own allocator's blocks (objects of 512 B or less, which ``malloc`` never sees) and a
      library pool outside ``malloc`` (pyarrow's): the analogue of
      ``torch.cuda.memory_allocated``. Its parts are kept as ``malloc``, ``python`` and
      ``pool_<library>``, so a report says which grew.
    - ``outside``: resident anonymous memory (``anon``) less what those allocators hold from the
      system: growth that no counter explains (:mod:`harness._measure.host`).
    - ``rss``: resident memory (``/proc/self/statm``; psutil off Linux), the analogue of
      ``reserved``: it includes the interpreter, libraries and heap that malloc keeps.
    - ``peak``: the highest ``rss`` since the last :meth:`reset_peak` (``VmHWM``, reset by
      writing ``5`` to ``/proc/self/clear_refs``; read from ``getrusage`` while it is ``rss``).

    ``malloc_trim(0)`` runs in :meth:`release`, that is on ``collect=True`` checkpoints, and
    then ``rss`` follows live memory: without it, a leak that is freed and grows again refills
    heap glibc kept and ``rss`` stays flat. It is not run on every checkpoint because
    ``allocated``, the primary metric, follows live memory anyway, and a trim walks the whole
    heap (about 20 µs on a normal heap, 11 ms on a fragmented 900 MB one) and makes the next
    allocations fault their pages in again. Where the live heap cannot be read (glibc < 2.33, or
    an allocator whose counters leakgate cannot read) the primary metric is ``rss``, so the trim
    runs before every reading.

    A long loop reads them all on a stride (:data:`~harness._measure.sample.STRIDE`: each of a
    label's first 32 batches, then every 16th): between, a checkpoint makes no system call and
    its readings are ``None``. ``allocated`` is judged on the batches read; ``peak`` loses
    nothing, since the high-water mark is reset only when it is read. Without a live heap
    every checkpoint reads ``rss``, the primary metric then.

    ``capacity`` is the machine's RAM (``MemTotal``), not a container's limit.
    """

    name = "cpu"
    metrics = ("allocated", "rss", "peak", *PARTS, "anon", "outside")
    capacity_metric = "rss"
    host = True

    def __init__(self) -> None:
        self.notes = []
        found = heap()
        self._host = HostMemory()
        self._malloc_trim = libc_function("malloc_trim", ctypes.c_int, ctypes.c_size_t)
        if found.read is None:
            self.notes.append(f"cpu allocated unavailable: {found.note}; the primary metric is rss")
        elif found.allocator != "glibc":
            self.notes.append(f"cpu allocated read from {found.allocator}'s own counter")
        if self._malloc_trim is None or (found.read is not None and found.allocator != "glibc"):
            self.notes.append(
                "cpu malloc_trim unavailable: rss keeps heap that malloc freed but holds"
            )
            self._malloc_trim = None
        self.notes += [f"cpu {note}" for note in self._host.notes if found.read is not None]
        self.primary = "allocated" if found.read is not None else "rss"
        self.strided = self.metrics if found.read is not None else ()
        self._trim_each = found.read is None and self._malloc_trim is not None
        psutil = None if self._host.reads_rss else _psutil()
        self._process = psutil.Process() if psutil is not None else None
        if not self._host.reads_rss and self._process is None:
            self.notes.append(f"cpu rss unavailable: {host.STATM} cannot be read, and no psutil")
        self._status, self._clear_refs = self._open_peak()
        self.capacity = _mem_total()

    def _open_peak(self) -> tuple[int | None, int | None]:
        status, error = _open(_STATUS, os.O_RDONLY)
        clear_refs = None
        if status is not None:
            clear_refs, error = _open(_CLEAR_REFS, os.O_WRONLY)
        if clear_refs is not None:
            try:
                os.write(clear_refs, b"5")
            except OSError as refused:
                os.close(clear_refs)
                clear_refs, error = None, f"{_CLEAR_REFS}: {refused.strerror}"
        if clear_refs is None:
            if status is not None:
                os.close(status)
            self.notes.append(f"cpu peak unavailable: cannot reset VmHWM ({error})")
            return None, None
        return status, clear_refs

    def sample(self) -> Metrics:
        if self._trim_each:
            self._malloc_trim(0)
        metrics: Metrics = {}
        self._host.read(metrics)
        rss = metrics["rss"]
        if rss is None and self._process is not None:
            rss = metrics["rss"] = int(self._process.memory_info().rss)
        metrics["peak"] = self._peak(rss)
        return metrics

    def sample_between(self) -> Metrics:
        return dict.fromkeys(self.metrics)

    def _peak(self, rss: int | None) -> int | None:
        """``VmHWM``. ``getrusage``'s ``ru_maxrss``, a fraction of the cost, reads the same mark
        but never below a floor left by ``exec`` (the parent's mark, after ``vfork``); the mark
        is at least the ``rss`` just read, so when ``ru_maxrss`` is no more, both equal it."""
        if self._status is None:
            return None
        if rss is not None and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 <= rss:
            return rss
        status = os.pread(self._status, 4096, 0)
        start = status.index(b"VmHWM:") + 6
        return int(status[start : status.index(b"kB", start)]) * 1024

    def reset_peak(self) -> None:
        if self._clear_refs is not None:
            os.write(self._clear_refs, b"5")

    def release(self) -> None:
        """``malloc_trim(0)``: return the heap malloc holds free to the system."""
        if self._malloc_trim is not None:
            self._malloc_trim(0)

    def describe(self) -> dict[str, Any]:
        libc, version = platform.libc_ver()
        return {
            "device": f"{platform.machine() or 'cpu'} ({os.cpu_count()} CPUs)",
            "total_memory": self.capacity,
            "driver": f"{libc} {version}" if libc else None,
        }

    def close(self) -> None:
        self._host.close()
        for fd in (self._status, self._clear_refs):
            if fd is not None:
                os.close(fd)
        self._status = self._clear_refs = None


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _mem_total() -> int | None:
    try:
        with open(_MEMINFO, "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        psutil = _psutil()
        return int(psutil.virtual_memory().total) if psutil is not None else None
    return None


def _nvml_handle(uuid: str) -> tuple[Any, str | None]:
    """An NVML handle for the CUDA device with ``uuid`` (a GPU or a MIG slice), or why not."""
    try:
        import pynvml
    except ImportError:
        return None, "cuda device_used unavailable: pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return None, f"cuda device_used unavailable: NVML did not load ({error})"
    for prefix in ("GPU-", "MIG-"):
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid), None
        except pynvml.NVMLError:
            continue
    pynvml.nvmlShutdown()
    return None, f"cuda device_used unavailable: NVML does not know device {uuid}"


class CudaProbe(Probe):
    """One CUDA device, as PyTorch's caching allocator, the driver and NVML see it.

    - ``allocated``: bytes in live tensors (``torch.cuda.memory_allocated``);
    - ``reserved``: bytes the caching allocator holds (``memory_reserved``);
    - ``peak``: the highest ``allocated`` since the last :meth:`reset_peak`;
    - ``driver_used``: the device's used memory per ``torch.cuda.mem_get_info`` (all
      processes, CUDA contexts included);
    - ``device_used``: the device's used memory per NVML, ``None`` when NVML is unavailable.
    """

    metrics = ("allocated", "reserved", "peak", "driver_used", "device_used")
    primary = "allocated"
    capacity_metric = "reserved"

    def __init__(self, device: int = 0) -> None:
        if not torch.cuda.is_available():
            raise BadInput("no CUDA device is visible", field="probe 'cuda'")
        if not 0 <= device < torch.cuda.device_count():
            raise BadInput(
                f"visible devices are 0..{torch.cuda.device_count() - 1}",
                field=f"probe 'cuda:{device}'",
            )
        self.device = torch.device("cuda", device)
        self.name = str(self.device)
        self._properties = torch.cuda.get_device_properties(self.device)
        self.total: int = self._properties.total_memory
        self.capacity = self.total
        self.notes = []
        self._nvml, note = _nvml_handle(str(self._properties.uuid))
        if note:
            self.notes.append(note)
        self._fraction_before: float | None = None
        torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self) -> Metrics:
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "allocated": torch.cuda.memory_allocated(self.device),
            "reserved": torch.cuda.memory_reserved(self.device),
            "peak": torch.cuda.max_memory_allocated(self.device),
            "driver_used": total - free,
            "device_used": self._device_used(),
        }

    def _device_used(self) -> int | None:
        if self._nvml is None:
            return None
        import pynvml

        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)
        except pynvml.NVMLError as error:
            self.notes.append(f"cuda device_used unavailable from here on: NVML failed ({error})")
            self._close_nvml()
            return None

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def release(self) -> None:
        """Wait for the device, then return the caching allocator's unused blocks."""
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            torch.cuda.empty_cache()

    def limit(self, nbytes: int) -> bool:
        """Cap the caching allocator's reserved bytes in this process (``set_per_process_memory
        _fraction``): allocations beyond it raise a real ``torch.OutOfMemoryError``. The CUDA
        context and other processes are outside the cap."""
        if nbytes > self.total:
            raise BadInput(
                f"{nbytes} B exceeds {self.name}'s total memory {self.total} B", field="capacity"
            )
        if self._fraction_before is None:
            self._fraction_before = torch.cuda.get_per_process_memory_fraction(self.device)
        torch.cuda.set_per_process_memory_fraction(nbytes / self.total, self.device)
        return True

    def describe(self) -> dict[str, Any]:
        driver = None
        if self._nvml is not None:
            import pynvml

            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
            except pynvml.NVMLError:
                driver = None
        return {
            "device": self._properties.name,
            "total_memory": self.capacity,
            "driver": driver,
            "cuda": torch.version.cuda,
        }

    def _close_nvml(self) -> None:
        if self._nvml is not None:
            import pynvml

            self._nvml = None
            pynvml.nvmlShutdown()

    def close(self) -> None:
        if self._fraction_before is not None:
            torch.cuda.set_per_process_memory_fraction(self._fraction_before, self.device)
            self._fraction_before = None
        self._close_nvml()


PROBES = ("auto", "cpu", "cuda", "cuda:<index>")


def probe_for(device: torch.device) -> str:
    """The name of the probe that reads ``device``: ``cuda:N`` for a CUDA device, else
    ``cpu`` (host memory)."""
    if device.type != "cuda":
        return "cpu"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index}"


def probe_type(spec: str) -> type[Probe]:
    """The class of the probe :func:`make_probe` makes of the name ``spec``: its facts
    (``metrics``, ``capacity_metric``, ``host``) without opening a device."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return CpuProbe
    indexed = isinstance(spec, str) and spec.startswith("cuda:") and spec[5:].isdigit()
    if spec == "cuda" or indexed:
        return CudaProbe
    raise BadInput(f"unknown probe {spec!r}; expected one of {', '.join(PROBES)}")


def make_probe(spec: str | Probe = "auto") -> Probe:
    """A probe from a name in :data:`PROBES` (``auto``: CUDA when a GPU is visible, else CPU),
    or ``spec`` itself when it is already a :class:`Probe`."""
    if isinstance(spec, Probe):
        return spec
    kind = probe_type(spec)
    if kind is CpuProbe:
        return CpuProbe()
    if spec in ("auto", "cuda"):
        return CudaProbe(torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return CudaProbe(int(spec[5:]))
