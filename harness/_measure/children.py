"""The memory of a process's live descendants at a checkpoint: DataLoader workers and every
other child, each named by a role that outlives its pid.

Three readings, each for what it is good at:

- ``heap``: the child's live heap, read by the child itself and published into a slot
  (:mod:`harness._measure.heap_board`): what its allocator handed out and was not freed, the measure
  the main process is judged on. Read from a mapped slot at each reading (a few µs). A reading
  is *fresh* when the child took it since the previous one this reader used.
- ``anon`` (``RssAnon + RssShmem`` from ``/proc/<pid>/status``): resident anonymous memory,
  private or shared (heap, stacks, anonymous shared mappings and, after a fork, the parent's
  pages still shared), the cheap outside reading. It is what a child with
  no slot (an ``exec``'d command, a spawned process that is not a DataLoader worker) is judged
  on, read at every reading; a child with a slot has it read at every :data:`ANON_EVERY`-th
  reading and when its processes are listed.
  It keeps what the allocator holds after a free: a clean worker's grows by MiBs.
- with ``rollup=True``, from ``/proc/<pid>/smaps_rollup``: ``uss`` (``Private_Clean +
  Private_Dirty``: what exiting would free), ``pss`` and ``shared`` (``Shared_Clean +
  Shared_Dirty``): the pages copied from the parent by reading (copy-on-read). The kernel walks
  every resident page for it: 5 to 30 ms with 2 forked workers of a torch process, so the
  parent reads it at phase edges and collected checkpoints, and at the first reading of a new
  child that publishes nothing; a child that publishes reads its own, off the parent's time,
  at its readings 8, 32, 128, ... (:mod:`harness._measure.heap_board`), and the parent records it
  when it is new.

**Finding them.** Descendants are listed through ``/proc/<pid>/task/<tid>/children``,
recursively (a scan of every ``/proc/<pid>/stat`` where the kernel lacks that file), after one
``waitid`` that tells whether this process has any child at all (:func:`harness._measure.procfs.
has_children`). A listing costs 100 to 250 µs with 2 to 4 workers of a torch process (one file
per thread), so a reader lists on a rollup, every :data:`LIST_EVERY` readings, and whenever
something says the set changed: a Python fork, a DataLoader iterator naming its workers, a
first child. Between listings a known direct child's exit is asked of ``waitid`` (about 1 µs),
and a child without a slot is read from ``status``, which fails once it has exited.

**Why not psutil.** psutil (not a dependency of leakgate) finds children by reading the parent
pid of *every* process on the machine (1.6 to 6.7 ms here with 95 processes) and reads the
same ``smaps_rollup``. Off Linux there is no ``/proc``: children are not measured there, the
reader returns no reading (``None``, not zeros) and says so once, in ``notes``.

**Roles.** A series follows a role, not a pid, so a DataLoader's restarted workers continue
the same series and a worker that died is *absent*, not a drop to zero: ``worker <id>`` (and
``loader <n> worker <id>``, :mod:`harness._measure.worker_roles`) for DataLoader workers, ``<comm>
<pid>`` for any other process (its command name, reduced to ``[A-Za-z0-9._-]``, and pid).
multiprocessing's resource tracker and fork server are not read: they serve the process that
started them, for as long as it lives, and hold none of its work.

**Metrics** (:meth:`TreeReading.metrics`, for a sample's ``metrics``), in bytes. Per role:
``child_heap:<role>`` (at a per-batch checkpoint when fresh; at any other, the latest),
``child_anon:<role>`` (when read), ``child_uss:<role>`` and ``child_shared:<role>`` (when read,
by the parent or the child), ``child_pss:<role>`` (the parent's rollups). Summed over the live
descendants: ``children_heap`` (each one's latest live heap, or its ``anon`` where it has no
slot: what the children are judged on together, at each reading where one lives),
``children_anon`` (when every one's was read), and on the parent's rollups ``children_uss`` and
``children_pss``. A role that is not alive has no key at all.

**Sampling** (:class:`ChildSampler`). A recorder reads the children where it reads its probe:
at every checkpoint that is not a loop's batch, and at a loop's batches on the probe's stride
(:data:`~harness._measure.sample.STRIDE`, where the probe has one), each live descendant's published
live heap, or ``anon`` where it has no slot (a few µs a child); between two readings a sample
keeps the last reading's live processes and no children's metric. The dearer
``smaps_rollup`` (milliseconds per worker, for the copy-on-read finding) is read at a phase's
START and END, at collected checkpoints and at a new child's first checkpoint; a child that
publishes reads its own, off the parent's time. The rules fit each child's series on the
readings it has (a worker's fresh live heap readings, about one per batch it makes), exactly
on what was read, never on filled-in values. A sample keeps the reading as metrics
(:meth:`TreeReading.metrics`) and the live processes in its ``processes`` field, ``role=pid``
pairs joined by commas (:func:`processes_text`, read back by :func:`parse_processes`): a new
pid under a role is a restart, and a role missing from it is a process that exited, not memory
freed.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping
from typing import NamedTuple

import harness._measure.heap_board as heap_board
import harness._measure.procfs as procfs
import harness._measure.worker_roles as worker_roles
from harness._measure.patches import PATCHES

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

LIST_EVERY = 16
"""Readings from one listing of the descendants to the next, at most."""
ANON_EVERY = 4
"""Readings from one ``anon`` reading of a child that publishes its heap to the next (each
listing reads it too); a child without a slot has it read at every reading."""
SUMS = (
    "children_heap",
    "children_anon",
    "children_uss",
    "children_pss",
    "children_cost",
)
"""The live descendants' sums (``children_heap`` whenever one lives, the others when read)."""
CHILDREN_COST = "children_cost"
"""What the live children add to the job (:attr:`TreeReading.cost`)."""
JOB = "job"
"""The job's memory: the host's live heap and what its live children add (a recorder's)."""
PER_ROLE = (
    "child_heap",
    "child_anon",
    "child_uss",
    "child_pss",
    "child_shared",
    "child_outside",
    "child_beyond",
)
"""Per-role metrics, written ``<metric>:<role>`` (:func:`role_metric`)."""


_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


class ProcessMemory(NamedTuple):
    """One live descendant at one reading, in bytes: ``heap`` its latest published live heap
    (None without a slot) and whether that is ``fresh``; ``anon`` when read; ``uss``, ``pss``
    and ``shared`` on rollup readings only."""

    role: str
    pid: int
    anon: int | None
    heap: int | None = None
    fresh: bool = False
    uss: int | None = None
    pss: int | None = None
    shared: int | None = None
    outside: int | None = None
    beyond: int | None = None

    @property
    def judged(self) -> int:
        """What this process counts for in ``children_heap``."""
        return self.heap if self.heap is not None else self.anon or 0

    @property
    def held(self) -> int:
        """What this process's own growth is read on: its judged measure, and what no counter
        explains where it publishes that."""
        return self.judged + (self.outside or 0)


class TreeReading(NamedTuple):
    """The live descendants at one reading; ``absent``: roles seen before that are not alive;
    ``rollup``: whether ``uss``, ``pss`` and ``shared`` were read."""

    processes: tuple[ProcessMemory, ...] = ()
    absent: tuple[str, ...] = ()
    rollup: bool = False
    cost: int | None = None
    """What the live descendants add to the job: each one's private memory when first read
    (``uss``) and what it grew by since on its judged measure; on rollup readings only."""

    @property
    def pids(self) -> dict[str, int]:
        """Each live role's pid: a new pid under a known role is a restart."""
        return {p.role: p.pid for p in self.processes}

    def metrics(self, *, latest: bool = False) -> dict[str, int]:
        """The flat metric-name-to-bytes mapping a sample carries (names in the module doc):
        each live heap when fresh, or with ``latest`` its latest reading (a named or collected
        checkpoint, where no batch is judged on it)."""
        if not self.processes:
            return {}
        flat = {"children_heap": sum(p.judged for p in self.processes)}
        if all(p.anon is not None for p in self.processes):
            flat["children_anon"] = sum(p.anon or 0 for p in self.processes)
        if self.rollup:
            flat["children_uss"] = sum(p.uss or 0 for p in self.processes)
            flat["children_pss"] = sum(p.pss or 0 for p in self.processes)
        if self.cost is not None:
            flat["children_cost"] = self.cost
        for p in self.processes:
            now = p.fresh or latest
            heap, outside, beyond = (v if now else None for v in (p.heap, p.outside, p.beyond))
            values = (heap, p.anon, p.uss, p.pss, p.shared, outside, beyond)
            for name, value in zip(_names(p.role), values, strict=True):
                if value is not None:
                    flat[name] = value
        return flat


@functools.lru_cache(maxsize=256)
def _names(role: str) -> tuple[str, ...]:
    """``role``'s metric names, in :data:`PER_ROLE` order."""
    return tuple(role_metric(metric, role) for metric in PER_ROLE)


def role_metric(metric: str, role: str) -> str:
    """The metric name of ``role``'s ``metric`` (one of :data:`PER_ROLE`)."""
    return f"{metric}:{role}"


def _comm_role(pid: int) -> str:
    comm = (procfs.read(f"{procfs.PROC}/{pid}/comm") or b"").decode("utf-8", "replace").strip()
    return f"{_UNSAFE.sub('_', comm) or 'process'} {pid}"


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
    """Reads ``pid``'s live descendants (this process by default) at each :meth:`read`: the
    live heap each one publishes (:mod:`harness._measure.heap_board`), else its ``anon``.

    ``notes`` says, once, what it cannot do here (no ``/proc``, no worker ids, children that
    cannot publish)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.notes: list[str] = []
        self.history: dict[int, str] = {}
        """Each descendant read so far, by pid, and its role then (:data:`HISTORY` at most)."""
        self.board: heap_board.Board | None = None
        self.available = os.path.exists(f"{procfs.PROC}/{self.pid}/smaps_rollup")
        if not self.available:
            self.notes.append("children not measured: no /proc/<pid>/smaps_rollup here")
            return
        self._own = self.pid == os.getpid()
        board = (heap_board.WORKERS,) if self._own else ()
        self._hold = PATCHES.hold(worker_roles.PID_HOOKS, *board)
        self.board = heap_board.board() if self._own else None
        self.notes += self._hold.notes
        self._seen: dict[str, None] = {}
        self._roles: dict[int, str] = {}
        self._live: dict[int, bool] = {}
        """Each live descendant, and whether it is a child of ``pid`` itself."""
        self._counts: dict[int, int] = {}
        """Each publishing descendant's reading count when last used, and its rollup's."""
        self._rolled: dict[int, int] = {}
        self._born: dict[int, tuple[int, int]] = {}
        """Each descendant's ``uss`` at its first rollup and what it held then."""
        self._helpers: dict[int, bool] = {}
        self._since = 0
        self._roles_now: tuple[str, ...] = ()
        self._absent: tuple[str, ...] = ()
        self._marks: tuple[int, int, bool] | None = None

    def close(self) -> None:
        """Let go of what reading children holds (torch's worker hooks, the heap board's)."""
        if self.available:
            self._hold.release()

    def _helper(self, pid: int, direct: bool) -> bool:
        """Whether ``pid`` is one of multiprocessing's own servers (its resource tracker or
        fork server): a process stays their parent once it used spawn or forkserver, and they
        are not part of the job's memory. Learned once per pid from its command line, which
        names a server only in a child of this process: the fork server's own children (the
        DataLoader workers it starts) inherit its command line and are the job's."""
        helper = self._helpers.get(pid)
        if helper is None:
            if len(self._helpers) > 4096:
                self._helpers.clear()
            # Between its fork and its exec a server's command line is still its parent's:
            # multiprocessing's own record of the servers this process started says it then.
            command = procfs.read(f"{procfs.PROC}/{pid}/cmdline") or b""
            helper = direct and any(name in command for name in _HELPERS)
            helper = helper or (self._own and pid in _own_helpers())
            self._helpers[pid] = helper
        return helper

    def _changed(self) -> bool:
        """Whether something says the descendants may have changed since the last reading: a
        DataLoader iterator named its workers, this process forked through Python, or it has
        children now and had none (or the reverse: one ``waitid``)."""
        marks = (worker_roles.ROLES.generation, heap_board.forks(), procfs.has_children())
        changed, self._marks = marks != self._marks, marks
        return changed

    def _list(self) -> dict[int, bool]:
        return {
            pid: parent == self.pid
            for pid, parent in procfs.tree(self.pid).items()
            if not self._helper(pid, parent == self.pid)
        }

    def _exited(self, pid: int, direct: bool) -> bool:
        """Whether a child of this process has exited (a zombie or reaped): one ``waitid``
        that reaps nothing. A deeper descendant's exit shows when it is read or listed."""
        if not (direct and self._own):
            return False
        try:
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True
        except OSError:
            return False

    def idle(self) -> bool:
        """Whether this process has no child now and had none at the last reading (one
        ``waitid``): no descendant, nothing to read. The next child is listed at once."""
        if self._own and not self._live and not procfs.has_children():
            self._marks = None
            return True
        return False

    def read(self, *, rollup: bool = False, rollup_if_new: bool = False) -> TreeReading | None:
        """The live descendants now (``uss``, ``pss`` and ``shared`` of every one with
        ``rollup``; with ``rollup_if_new``, of a new one that publishes no reading, as a child
        that publishes reads its own), and the roles seen before that are not alive; ``None``
        where they cannot be measured."""
        if not self.available:
            return None
        if self.idle():
            return TreeReading(absent=tuple(self._seen), rollup=rollup)
        listed = self._changed() or rollup or self._since >= LIST_EVERY or not self._own
        if listed:
            live, self._since = self._list(), 0
        else:
            live = {pid: d for pid, d in self._live.items() if not self._exited(pid, d)}
        self._since += 1
        if not live and not self._live:  # none now and none before: nothing to update
            return TreeReading(absent=tuple(self._seen), rollup=rollup)
        new = live.keys() - self._live.keys() if rollup_if_new else set()
        if live.keys() != self._live.keys():
            for pid in self._live.keys() - live.keys():
                self._forget(pid)
            worker_roles.ROLES.forget(set(live))
        self._live = live
        processes = []
        for pid in list(live):
            # anon from outside at a listing and every ANON_EVERY-th reading after it
            memory = self._process(pid, self._since % ANON_EVERY == 1, rollup, pid in new)
            if memory is None:  # it exited as it was read
                del self._live[pid]
                continue
            processes.append(memory)
        roles = tuple(p.role for p in processes)
        if roles != self._roles_now:
            self._seen.update(dict.fromkeys(roles))
            self._absent = tuple(role for role in self._seen if role not in roles)
            self._roles_now = roles
        return TreeReading(tuple(processes), self._absent, rollup, self._cost(processes, rollup))

    def _cost(self, processes: list[ProcessMemory], rollup: bool) -> int | None:
        """What ``processes`` add to the job (:attr:`TreeReading.cost`), on a rollup reading."""
        for p in processes:
            if p.uss is not None and p.pid not in self._born:
                self._born[p.pid] = (p.uss, p.held)
        if not rollup:
            return None
        born = [self._born.get(p.pid) for p in processes]
        if any(b is None for b in born):
            return None
        return sum(b[0] + p.held - b[1] for p, b in zip(processes, born, strict=True) if b)

    def _process(self, pid: int, outside: bool, rollup: bool, new: bool) -> ProcessMemory | None:
        """One descendant's reading, or None when it has exited."""
        published = None
        if self.board is not None:
            published = self.board.read(pid)
        outside = outside or published is None
        anon = procfs.read_anon(pid) if outside else None
        if anon is None and outside:
            return None
        rollup = rollup or (new and published is None)
        rolled: tuple[int | None, int | None, int | None] = (None, None, None)
        if rollup:
            read = procfs.read_rollup(pid)
            if read is None:
                return None
            rolled = read
        fresh = False
        if published is not None:
            fresh = self._counts.get(pid) != published.count
            if not rollup and published.rolled != self._rolled.get(pid, 0):
                rolled = (published.uss, None, published.shared)
            self._counts[pid], self._rolled[pid] = published.count, published.rolled
        role = worker_roles.ROLES.roles.get(pid)
        if role is None:  # kept: a command name changes (python, then pt_data_worker)
            role = self._roles.get(pid) or _comm_role(pid)
            self._roles[pid] = role
        if self.history.get(pid) != role and len(self.history) < HISTORY:
            self.history[pid] = role
        heap = published.heap if published is not None else None
        bounds = (published.outside, published.beyond) if published is not None else (None, None)
        return ProcessMemory(role, pid, anon, heap, fresh, *rolled, *bounds)

    def _forget(self, pid: int) -> None:
        """Let go of an exited descendant (its slot, its count, its role)."""
        self._roles.pop(pid, None)
        self._counts.pop(pid, None)
        self._rolled.pop(pid, None)
        self._born.pop(pid, None)
        if self.board is not None:
            self.board.forget(pid)


SCHEDULE = (
    "the live heap of each child that publishes one (DataLoader workers, Python forks), read "
    "inside it and kept wherever it is new; the anon (RssAnon + RssShmem) of any other child, "
    "at the checkpoints that read the probe (a loop's batches on its stride); smaps_rollup "
    "(USS, PSS, shared pages) at phase edges, collected "
    "checkpoints and a new child's first, or by the child itself at its readings 8, 32, 128, ..."
)
"""How children are sampled, in words, for the timeline header and the report."""


HISTORY = 4096
"""Descendants whose roles a reader remembers after they exit (for what they named)."""


class ChildSampler:
    """Reads ``pid``'s live descendants (this process by default) on the schedule above;
    ``notes`` says what it cannot do here."""

    def __init__(self, pid: int | None = None) -> None:
        self.reader = ChildrenReader(pid)
        self.notes = self.reader.notes
        self._text: tuple[dict[str, int], str | None] = ({}, None)
        """The last live processes and their text (they change far less often than read)."""

    def close(self) -> None:
        """Stop reading; what the reader put in torch is put back."""
        self.reader.close()

    def read(
        self, *, rollup: bool = False, latest: bool = False
    ) -> tuple[dict[str, int], str | None] | None:
        """A checkpoint's children metrics and ``processes`` text (none of either while no
        child lives); ``rollup`` asks for USS/PSS now, ``latest`` for every child's latest
        live heap, fresh or not. None where children cannot be measured."""
        reader = self.reader
        if reader.available and reader.idle():  # the common case, in short
            return {}, None
        reading = reader.read(rollup=rollup, rollup_if_new=True)
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
