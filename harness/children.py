"""The memory of a process's live descendants at a checkpoint: DataLoader workers and every
other child, each named by a role that outlives its pid.

Two levels of reading, for every live descendant:

- always, from ``/proc/<pid>/statm``: ``anon``, its resident anonymous memory (``RssAnon``:
  heap, stacks, and after a fork the parent's pages it still shares). New allocations (a
  cache, a leak) grow it; copy-on-read does not (a copied page replaces a page that was
  already resident);
- with ``rollup=True``, from ``/proc/<pid>/smaps_rollup``: ``uss``, its private memory
  (``Private_Clean + Private_Dirty``: what exiting would free), ``pss`` (``Pss``: private
  memory plus its share of every page it shares) and ``shared`` (``Shared_Clean +
  Shared_Dirty``, the pages it still shares, see :func:`growth_kind`).

Measured with ``benchmarks/bench_children.py`` on a busy 2-core machine (load 2 to 7): a
reading costs about 4 µs with no child (one ``waitid`` says there is none) and 100 µs with 2
forked DataLoader workers of a torch process (200 µs with 4), most of it finding them; a
rollup reading costs 5 to 30 ms with 2 such workers (170 MB resident each), as the kernel
walks every resident page for it. So a caller reads the rollup at the checkpoints it chooses
(collected ones, every n-th batch) and ``anon`` at every other.

Descendants are found through ``/proc/<pid>/task/<tid>/children``, recursively (a scan of
every ``/proc/<pid>/stat`` for the parent pid where the kernel lacks that file), after one
``waitid`` that tells whether this process has any child at all (:func:`has_children`: 25 µs
of listing every thread's file saved at each checkpoint of a run without workers).

**Why not psutil.** psutil (not a dependency of leakgate) finds children by reading the parent
pid of *every* process on the machine: ``Process.children`` took 1.6 to 6.7 ms here with 95
processes, against 20 to 130 µs for 0 to 4 children through the ``children`` files; its
``memory_full_info`` reads the same ``smaps_rollup`` (same kernel walk, same cost), behind a
``Process`` object that must be kept per pid to guard against pid reuse. Off Linux there is
no ``smaps_rollup`` and no cheap USS, so children are not measured there: the reader returns
no reading (``None``, not zeros) and says so once, in ``notes``.

**Roles.** A series follows a role, not a pid, so a DataLoader's restarted workers continue
the same series and a worker that died is *absent*, not a drop to zero:

- ``worker <id>``: a DataLoader worker, ``<id>`` its ``worker_id``. torch gives every worker
  the same process name (``pt_data_worker``, set once the worker runs; ``python`` before, under
  spawn) and keeps the id inside the worker, so the id is learned where torch hands the worker
  pids of one iterator, in id order, to its signal handling (``_set_worker_pids``):
  :func:`watch_dataloaders` wraps that hook once, at no cost per checkpoint. When another
  iterator's workers are alive at the same time (a persistent training loader during
  validation), the newer iterator's are ``loader <n> worker <id>``, ``n`` the lowest number
  free. A new iterator over the same dataset as a live one takes its number: Lightning makes
  each epoch's validation iterator before it drops the last one (the sanity check's, first),
  and its workers stay ``worker <id>`` every epoch. Workers of an iterator made before the
  hook was wrapped are named as any process.
- ``<comm> <pid>``: any other process, by its command name (``/proc/<pid>/comm``, reduced to
  ``[A-Za-z0-9._-]``) and pid.

multiprocessing's resource tracker and fork server are not read: they serve the process that
started them, for as long as it lives, and hold none of its work.

**Metrics** (:meth:`TreeReading.metrics`, for a sample's ``metrics``), in bytes: the sums over
live descendants ``children_anon`` and, on rollup readings, ``children_uss`` and
``children_pss`` (0 without any descendant); per role ``child_anon:<role>`` and, on rollup
readings, ``child_uss:<role>``, ``child_pss:<role>``, ``child_shared:<role>``. A role that is
not alive has no key at all.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Literal

_PROC = "/proc"
_ROLLUP_FIELDS = {
    b"Pss": "pss",
    b"Private_Clean": "uss",
    b"Private_Dirty": "uss",
    b"Shared_Clean": "shared",
    b"Shared_Dirty": "shared",
}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

SUMS = ("children_anon", "children_uss", "children_pss")
"""The live descendants' sums (``children_anon`` on every reading, the others on rollups)."""
PER_ROLE = ("child_anon", "child_uss", "child_pss", "child_shared")
"""Per-role metrics, written ``<metric>:<role>`` (:func:`role_metric`)."""


_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


@dataclass(frozen=True)
class ProcessMemory:
    """One live descendant at one reading, in bytes (``uss``, ``pss`` and ``shared`` on rollup
    readings only)."""

    role: str
    pid: int
    anon: int
    uss: int | None = None
    pss: int | None = None
    shared: int | None = None


@dataclass(frozen=True)
class TreeReading:
    """The live descendants at one reading; ``absent``: roles seen before that are not alive;
    ``rollup``: whether ``uss``, ``pss`` and ``shared`` were read."""

    processes: tuple[ProcessMemory, ...] = ()
    absent: tuple[str, ...] = ()
    rollup: bool = False

    @property
    def anon(self) -> int:
        return sum(p.anon for p in self.processes)

    @property
    def uss(self) -> int | None:
        return sum(p.uss or 0 for p in self.processes) if self.rollup else None

    @property
    def pss(self) -> int | None:
        return sum(p.pss or 0 for p in self.processes) if self.rollup else None

    @property
    def pids(self) -> dict[str, int]:
        """Each live role's pid: a new pid under a known role is a restart (:func:`lifetimes`)."""
        return {p.role: p.pid for p in self.processes}

    def metrics(self) -> dict[str, int]:
        """The flat metric-name-to-bytes mapping a sample carries (names in the module doc)."""
        flat = {"children_anon": self.anon}
        if self.rollup:
            flat.update(children_uss=self.uss or 0, children_pss=self.pss or 0)
        for p in self.processes:
            for metric, value in zip(PER_ROLE, (p.anon, p.uss, p.pss, p.shared), strict=True):
                if value is not None:
                    flat[role_metric(metric, p.role)] = value
        return flat


def role_metric(metric: str, role: str) -> str:
    """The metric name of ``role``'s ``metric`` (one of :data:`PER_ROLE`)."""
    return f"{metric}:{role}"


def _read(path: str) -> bytes | None:
    """A ``/proc`` file's bytes (unbuffered, a third of ``open``'s cost), ``None`` when gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_anon(pid: int) -> int | None:
    """``pid``'s resident anonymous bytes (``statm``'s resident less its file and shared-memory
    pages), or ``None`` when it has exited or cannot be read."""
    fields = (_read(f"{_PROC}/{pid}/statm") or b"").split()
    if not fields or fields[1] == b"0":  # an exiting process has no memory left to count
        return None
    return (int(fields[1]) - int(fields[2])) * _PAGE


def read_rollup(pid: int) -> tuple[int, int, int] | None:
    """``(uss, pss, shared)`` of ``pid`` in bytes, or ``None`` when it has exited (a zombie
    has no memory to read) or cannot be read."""
    text = _read(f"{_PROC}/{pid}/smaps_rollup")
    if text is None:
        return None
    sums = {"uss": 0, "pss": 0, "shared": 0}
    seen = False
    for line in text.splitlines()[1:]:
        name, _, value = line.partition(b":")
        key = _ROLLUP_FIELDS.get(name)
        if key is not None:
            sums[key] += int(value.split()[0]) * 1024
            seen = True
    return (sums["uss"], sums["pss"], sums["shared"]) if seen else None


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before their children."""
    if pid == os.getpid() and not has_children():
        return []
    children = _children if _CHILDREN_FILES else _scan()
    found: list[int] = []
    pending = [pid]
    while pending:
        kids = children(pending.pop())
        found.extend(kids)
        pending.extend(kids)
    return found


_CHILDREN_FILES = os.path.exists(f"{_PROC}/self/task/{os.getpid()}/children")
"""Whether this kernel lists each thread's children (``CONFIG_PROC_CHILDREN``)."""
_WALL = 0x40000000
"""``__WALL`` (``linux/wait.h``): wait for children of every kind, clone children too."""


def has_children() -> bool:
    """Whether this process has a child: one ``waitid`` that waits for none and reaps none
    (about 1 µs, against 25 µs or more for listing every thread's ``children`` file). Each
    thread waits for the children of every thread of its process, so a child any thread
    started counts, and so does one that exited and is not yet reaped."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT | _WALL)
    except ChildProcessError:
        return False
    except OSError:  # a kernel that refuses the call: list them
        return True
    return True


def _children(pid: int) -> list[int]:
    """``pid``'s children, from each of its threads' ``children`` file."""
    try:
        tids = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        kids.extend(
            int(kid) for kid in (_read(f"{_PROC}/{pid}/task/{tid}/children") or b"").split()
        )
    return kids


def _scan() -> Callable[[int], list[int]]:
    """Children by parent pid, from every process's ``stat`` (kernels without ``children``)."""
    by_parent: dict[int, list[int]] = {}
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        stat = _read(f"{_PROC}/{entry}/stat")
        if not stat:
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        by_parent.setdefault(parent, []).append(int(entry))
    return lambda pid: by_parent.get(pid, [])


def _comm_role(pid: int) -> str:
    comm = (_read(f"{_PROC}/{pid}/comm") or b"").decode("utf-8", "replace").strip()
    return f"{_UNSAFE.sub('_', comm) or 'process'} {pid}"


class _WorkerRoles:
    """DataLoader worker pids to roles, filled by torch's ``_set_worker_pids`` hook."""

    def __init__(self) -> None:
        self.roles: dict[int, str] = {}
        self._loaders: dict[int, tuple[int, tuple[int, ...], int | None]] = {}
        """Each registered iterator's number, worker pids and ``id`` of its dataset."""
        self.watching = False

    def add(self, key: int, pids: Sequence[int], dataset: int | None = None) -> None:
        """Name iterator ``key``'s workers. A new iterator over the ``dataset`` of a registered
        one (a loader's next epoch, made while its last epoch's iterator still lives) takes
        its number, and the older one's workers, about to exit, lose their roles."""
        older = next(
            (k for k, (_, _, of) in self._loaders.items() if dataset is not None and of == dataset),
            None,
        )
        if older is not None:
            number, old_pids, _ = self._loaders.pop(older)
            for pid in old_pids:
                self.roles.pop(pid, None)
        else:
            taken = {number for number, _, _ in self._loaders.values()}
            number = next(n for n in range(1, len(taken) + 2) if n not in taken)
        prefix = "" if number == 1 else f"loader {number} "
        self._loaders[key] = (number, tuple(pids), dataset)
        for worker_id, pid in enumerate(pids):
            self.roles[pid] = f"{prefix}worker {worker_id}"

    def remove(self, key: int) -> None:
        """Free the iterator's number; its workers keep their roles while they exit."""
        self._loaders.pop(key, None)

    def forget(self, live: set[int]) -> None:
        """Drop the roles of workers that exited and whose iterator is gone (pids are reused)."""
        current = {pid for _, pids, _ in list(self._loaders.values()) for pid in pids}
        for pid in [pid for pid in list(self.roles) if pid not in live and pid not in current]:
            del self.roles[pid]


_WORKERS = _WorkerRoles()


def _dataset_of(frame: FrameType) -> int | None:
    """The ``id`` of the dataset of the DataLoader whose iterator calls the hook (torch calls
    it from the iterator's ``__init__``, whose argument ``loader`` is the DataLoader); None
    when the caller has no such ``loader``."""
    dataset = getattr(frame.f_locals.get("loader"), "dataset", None)
    return None if dataset is None else id(dataset)


def watch_dataloaders() -> str | None:
    """Learn DataLoader workers' ids from now on (idempotent); why not, when torch lacks the
    hook."""
    if _WORKERS.watching:
        return None
    try:
        from torch.utils.data._utils import signal_handling
    except ImportError:
        return "DataLoader workers named by command: torch is not importable"
    set_pids = getattr(signal_handling, "_set_worker_pids", None)
    remove_pids = getattr(signal_handling, "_remove_worker_pids", None)
    if set_pids is None or remove_pids is None:
        return "DataLoader workers named by command: this torch has no _set_worker_pids"

    def set_worker_pids(key: int, child_pids: tuple[int, ...]) -> None:
        _WORKERS.add(key, child_pids, _dataset_of(sys._getframe(1)))
        set_pids(key, child_pids)

    def remove_worker_pids(loader_id: int) -> None:
        _WORKERS.remove(loader_id)
        remove_pids(loader_id)

    signal_handling._set_worker_pids = set_worker_pids
    signal_handling._remove_worker_pids = remove_worker_pids
    _WORKERS.watching = True
    return None


def _own_helpers() -> set[int]:
    """The pids of the resource tracker and fork server this process started, as
    multiprocessing records them (none where it was never imported)."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    server = sys.modules.get("multiprocessing.forkserver")
    pids = (
        getattr(getattr(tracker, "_resource_tracker", None), "_pid", None),
        getattr(getattr(server, "_forkserver", None), "_forkserver_pid", None),
    )
    return {pid for pid in pids if isinstance(pid, int)}


class ChildrenReader:
    """Reads ``pid``'s live descendants (this process by default) at each :meth:`read`.

    ``notes`` says, once, what it cannot do here (no ``/proc``, no worker ids)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.notes: list[str] = []
        self.available = os.path.exists(f"{_PROC}/{self.pid}/smaps_rollup")
        if not self.available:
            self.notes.append("children not measured: no /proc/<pid>/smaps_rollup here")
            return
        why_not = watch_dataloaders()
        if why_not:
            self.notes.append(why_not)
        self._seen: dict[str, None] = {}
        self._roles: dict[int, str] = {}
        self._live: set[int] = set()
        self._helpers: dict[int, bool] = {}

    def _helper(self, pid: int) -> bool:
        """Whether ``pid`` is one of multiprocessing's own servers (its resource tracker or
        fork server): a process stays their parent once it used spawn or forkserver, and they
        are not part of the job's memory. Learned once per pid from its command line."""
        helper = self._helpers.get(pid)
        if helper is None:
            if len(self._helpers) > 4096:
                self._helpers.clear()
            # Between its fork and its exec a server's command line is still its parent's:
            # multiprocessing's own record of the servers this process started says it then.
            command = _read(f"{_PROC}/{pid}/cmdline") or b""
            helper = any(name in command for name in _HELPERS)
            helper = helper or (self.pid == os.getpid() and pid in _own_helpers())
            self._helpers[pid] = helper
        return helper

    def read(self, *, rollup: bool = False, rollup_if_new: bool = False) -> TreeReading | None:
        """The live descendants now (``uss``, ``pss`` and ``shared`` too with ``rollup``, or
        with ``rollup_if_new`` when a process is alive that the previous reading did not see),
        and the roles seen before that are not alive; ``None`` where they cannot be measured."""
        if not self.available:
            return None
        pids = [pid for pid in descendants(self.pid) if not self._helper(pid)]
        if not pids and not self._live:  # none now and none before: nothing to update
            return TreeReading(absent=tuple(self._seen), rollup=rollup)
        live = set(pids)
        rollup = rollup or (rollup_if_new and not live <= self._live)
        self._live = live
        _WORKERS.forget(live)
        self._roles = {pid: role for pid, role in self._roles.items() if pid in live}
        processes = []
        for pid in pids:
            rolled = read_rollup(pid) if rollup else (None, None, None)
            anon = read_anon(pid) if rolled is not None else None
            if anon is None or rolled is None:
                continue
            role = _WORKERS.roles.get(pid)
            if role is None:  # kept: a command name changes (python, then pt_data_worker)
                role = self._roles.get(pid) or _comm_role(pid)
                self._roles[pid] = role
            self._seen[role] = None
            processes.append(ProcessMemory(role, pid, anon, *rolled))
        roles = {p.role for p in processes}
        absent = tuple(role for role in self._seen if role not in roles)
        return TreeReading(tuple(processes), absent, rollup)


def lifetimes(pids: Iterable[int | None]) -> list[range]:
    """The stretches of a role's pid series (``None`` where absent) that one process lived:
    the first readings of each are that process's start-up, not growth."""
    stretches: list[range] = []
    start, current = 0, None
    for index, pid in enumerate([*pids, None]):
        if pid != current:
            if current is not None:
                stretches.append(range(start, index))
            start, current = index, pid
    return stretches


@dataclass(frozen=True)
class Growth:
    """How a worker's private memory grew over one lifetime, in bytes.

    ``kind`` is ``copy-on-read`` when at least half of the private growth was pages the worker
    had shared and then wrote (a forked worker's reference counts touching the parent's Python
    objects: the fix is storage without per-item objects, numpy, pyarrow, tensors), else
    ``private`` (memory the worker allocated itself: a cache, a leak)."""

    kind: Literal["copy-on-read", "private"]
    private: int
    converted: int


def growth_kind(uss: Sequence[int], shared: Sequence[int]) -> Growth:
    """Copy-on-read or private growth, from one lifetime of a role's ``child_uss`` and
    ``child_shared`` series (same length, at least one reading). It names the kind of any
    growth, however small: whether the growth matters is the rules' call.

    A page a forked worker writes leaves its ``Shared_*`` and enters its ``Private_*`` sums,
    so copy-on-read shows as shared memory falling as private memory rises; a cache's new
    pages were never shared. (The parent's PSS rises as it loses sharers, so the worker's own
    pages tell the two apart without the parent's.)"""
    if len(uss) != len(shared) or not uss:
        raise TypeError("growth_kind needs two series of the same, non-zero length")
    private = uss[-1] - uss[0]
    converted = max(0, shared[0] - shared[-1])
    copied = private > 0 and 2 * converted >= private
    return Growth("copy-on-read" if copied else "private", private, converted)
