"""Who holds leaked memory: the references that keep a phase's new tensors alive.

:func:`live_tensors` notes the tensors alive now, weakly (a snapshot keeps nothing alive).
:func:`attribute` takes the tensors alive now that were not alive then and names what keeps
each one: it walks the object graph once, breadth-first from the named roots (every module's
globals, the locals of every running frame), then walks up from each tensor, at most
``max_depth`` references, to the nearest *named* reference:

- an object's attribute or a class attribute: ``ClassName.attr`` (``nn.Module`` parameters,
  buffers and submodules too: ``Linear.weight``);
- a module global: ``module.name``;
- a closure cell: ``function:name``, the function whose variable it is (the closure's
  enclosing function);
- a local of a frame (running, suspended in a generator, or kept by a traceback):
  ``function:name``.

The object that reference points to is the *holder*. Tensors under one holder form one
:class:`Holder`, described at the deepest container they all share (``Cache.items['attn']``,
a list of 176 items, rather than 176 tuples of one batch each). Bytes count each storage once
(views share their base's storage), for the holder with the most bytes (then the most
tensors), and only storages that are new: a view of a parameter holds nothing new.

A tensor's autograd graph counts with it: the tensors its ``grad_fn`` chain saved for
backward (activations, held in C++ where ``gc`` never sees them) are unpacked and their new
storages counted in ``graph_bytes``, which ``bytes`` includes. A saved tensor whose Python
object survives only because the graph holds it is counted there, not as a holder of its
own. The graph's C++ nodes are not counted: about 0.9 KB each, measured on the reference
TFT (263 nodes per batch, against 1.3 MB of activations at hidden size 64).

Without a snapshot (``attribute()`` after a rule failed), every live tensor is a candidate
except the parameters, buffers and gradients of live ``nn.Module``\\ s and the state of live
optimizers. Long-lived data (a data set, a cache meant to stay) then ranks with the leak, by
size; with a snapshot the answer is the difference only.

On CUDA, with allocation stacks recorded (:func:`record_sites`), each holder carries the
allocation sites of its storages (``file:line`` of the innermost frame outside torch), and
new blocks that no Python holder accounts for (activations of a graph no live tensor leads
to, C++-owned buffers) are grouped by site under ``<no Python holder>``.

The walk, not ``gc.get_referrers``, finds referrers because ``gc.freeze()`` (which the
:class:`~harness.Recorder` calls) hides frozen objects from ``gc.get_referrers`` and
``gc.get_objects``: a module global or an object created before the recorder would never be
named. Tensors frozen after a snapshot was taken count as alive before it. Reading a running
frame's locals on Python < 3.13 leaves a snapshot of them on the frame that would keep a
local alive after the function drops it; the walk empties it again (a ``locals()`` dict that
the function itself keeps is emptied too). Objects that only C code references are found
through ``gc.get_objects`` but have no name (``<unnamed ...>``); a tensor referenced from
Python nowhere is ``<outside Python>``. ``budget_s`` bounds the time: tensors the walk did not
reach by then are ``<not searched>``.
"""

from __future__ import annotations

import collections
import gc
import inspect
import os
import re
import sys
import time
import types
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from harness.sample import Sample
from harness.units import format_mb, parse_size

_SIZED = (list, tuple, dict, set, frozenset, collections.deque)
_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_SITES_PER_HOLDER = 3
_CHECK_EVERY = 1024


@dataclass(frozen=True)
class Holder:
    """Tensors kept alive by one reference: ``path`` names it (``Trainer._attn_cache``),
    ``container`` is the type of what it holds (``list``, ``dict``, ``tensor``), ``items`` that
    container's length (the number of tensors for other objects), ``tensors`` the tensors under
    it, ``bytes`` their new storage, each counted once, ``graph_bytes`` the part of ``bytes``
    saved by their autograd graphs, ``sites`` the CUDA allocation sites, largest first.
    ``phase``, ``epoch`` and ``label`` say which checkpoint the attribution ran at."""

    path: str
    container: str
    items: int
    tensors: int
    bytes: int
    graph_bytes: int = 0
    sites: tuple[str, ...] = ()
    phase: str | None = None
    epoch: int | None = None
    label: str | None = None

    def __str__(self) -> str:
        return f"{self.path} ({self.container}, {self.items} items, {format_mb(self.bytes)})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = asdict(self)
        data["sites"] = list(self.sites)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Holder:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        known["sites"] = tuple(known.get("sites", ()))
        return cls(**known)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The tensors alive at ``time``, by weak reference, but for those ``gc.freeze()`` hid
    (which count as older than any snapshot). ``blocks``: the CUDA blocks in use, as
    ``(device, address, size)``, when CUDA was in use."""

    tensors: Mapping[int, weakref.ref] = field(repr=False)
    blocks: frozenset[tuple[int, int, int]] = field(default=frozenset(), repr=False)
    time: float = 0.0

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, tensor: object) -> bool:
        ref = self.tensors.get(id(tensor))
        return ref is not None and ref() is tensor


def live_tensors() -> Snapshot:
    """Note every tensor alive now (those ``gc.freeze()`` hid excepted) and the CUDA blocks in
    use. Cheap under a :class:`~harness.Recorder`, which freezes what existed before it."""
    tensors: dict[int, weakref.ref] = {}
    tensor_types: dict[type, bool] = {}
    for obj in gc.get_objects():
        kind = type(obj)
        is_tensor = tensor_types.get(kind)
        if is_tensor is None:
            is_tensor = tensor_types[kind] = issubclass(kind, torch.Tensor)
        if is_tensor:
            try:
                tensors[id(obj)] = weakref.ref(obj)
            except TypeError:
                continue
    blocks = frozenset((d, a, s) for d, a, s, _ in _cuda_blocks())
    return Snapshot(tensors, blocks, time.time())


def record_sites(enabled: bool = True) -> bool:
    """Start (or stop) recording the Python stack of every CUDA allocation, which
    :func:`attribute` turns into allocation sites; torch puts it at about 2 µs per allocation.
    A recording already on is left as it is. Returns whether recording was on before; without
    CUDA it does nothing and returns False."""
    if not torch.cuda.is_available():
        return False
    was_on = _sites_recorded()
    if enabled and not was_on:
        torch.cuda.memory._record_memory_history("state", context="state", stacks="python")
    elif not enabled and was_on:
        torch.cuda.memory._record_memory_history(None)
    return was_on


def attribute(
    before: Snapshot | None = None,
    *,
    limit: int | None = 5,
    max_depth: int = 8,
    budget_s: float = 5.0,
) -> list[Holder]:
    """The ``limit`` largest holders of tensors alive now and not in ``before`` (without
    ``before``: of every tensor that is not a live module's or optimizer's state), largest
    first. Holders of no new bytes are left out. See the module docstring for how holders are
    found and named."""
    if max_depth < 1:
        raise ValueError(f"max_depth must be at least 1, got {max_depth}")
    deadline = time.perf_counter() + budget_s
    collecting = gc.isenabled()
    gc.disable()
    walk = _Walk(deadline)
    try:
        walk.run()
        holders = _Attribution(walk, before, max_depth, deadline).holders()
    finally:
        walk.clear()
        if collecting:
            gc.enable()
    holders.sort(key=lambda h: (-h.bytes, -h.tensors, h.path))
    return holders[:limit] if limit is not None else holders


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
    allocation stacks are recorded while the recorder is open.
    Each result is kept in :attr:`holders`, tagged with the checkpoint's phase, epoch and label.
    """

    def __init__(
        self,
        *,
        growth: int | str | None = None,
        at_end: bool = True,
        limit: int | None = 5,
        max_depth: int = 8,
        budget_s: float = 5.0,
        sites: bool = True,
    ) -> None:
        self.growth = None if growth is None else parse_size(growth, what="growth")
        self.at_end = at_end
        self.limit = limit
        self.max_depth = max_depth
        self.budget_s = budget_s
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
        word = _last_word(sample.label)
        if word == "START":
            self._open[sample.phase] = _Open(live_tensors(), sample)
            return True
        if word == "OOM":
            opened = self._open.get(sample.phase)
            self.attribute(sample, opened.snapshot if opened else None)
            return True
        opened = self._open.get(sample.phase)
        if opened is None:
            return False
        if word == "END":
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
            before, limit=self.limit, max_depth=self.max_depth, budget_s=self.budget_s
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


def _last_word(label: str) -> str:
    words = re.split(r"[\s_]+", label.strip().upper())
    return words[-1] if words else ""


def _growth(start: Sample, now: Sample) -> int | None:
    for metric in ("allocated", "rss"):
        a, b = start.get(metric), now.get(metric)
        if a is not None and b is not None:
            return b - a
    return None


# -- the walk -------------------------------------------------------------------------------------

_SKIP = object()


class _Walk:
    """One breadth-first walk of the object graph: ``parent`` maps ``id(obj)`` to the object
    it was first reached from (``None`` for roots and objects only C code references)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.parent: dict[int, Any] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.module_dicts: dict[int, str] = {}
        self.frame_locals: dict[int, dict[str, Any]] = {}
        self.slots: dict[int, dict[int, Any]] = {}
        self.kinds: dict[type, str | None] = {}
        for own in (self, self.__dict__, *self.__dict__.values()):
            self.parent[id(own)] = _SKIP

    def run(self) -> None:
        frontier: list[Any] = []
        self.parent[id(frontier)] = _SKIP
        self._seed_modules(frontier)
        self._seed_frames(frontier)
        if not self._spread(frontier):
            return
        # What the named roots do not reach is referenced from C only (or is garbage): walk
        # it too, from the objects nothing else unreached refers to first, then from what is
        # left (cycles), one object at a time.
        everything = gc.get_objects()
        self.parent[id(everything)] = _SKIP
        unreached = [o for o in everything if id(o) not in self.parent]
        del everything
        self.parent[id(unreached)] = _SKIP
        inner = {id(r) for o in unreached for r in gc.get_referents(o)}
        tops = [o for o in unreached if id(o) not in inner]
        self.parent[id(tops)] = _SKIP
        for obj in tops:
            self._see(obj, None)
        if not self._spread(tops):
            return
        for obj in unreached:
            if id(obj) not in self.parent:
                self._see(obj, None)
                if not self._spread([obj]):
                    return

    def clear(self) -> None:
        """Drop every reference the walk took (frames among them, which would otherwise close
        reference cycles through the caller's locals)."""
        for value in self.__dict__.values():
            if isinstance(value, (dict, list)):
                value.clear()

    def _frames(self) -> Iterator[types.FrameType]:
        for top in sys._current_frames().values():
            frame: types.FrameType | None = top
            while frame is not None:
                if frame.f_globals is not globals():
                    yield frame
                frame = frame.f_back

    def _seed_frames(self, frontier: list[Any]) -> None:
        for frame in self._frames():
            if id(frame) in self.parent or _module_level(frame):
                continue
            self.parent[id(frame)] = None
            local = _frame_locals(frame)
            self.parent[id(local)] = _SKIP
            self.frame_locals[id(frame)] = local
            for value in local.values():
                if id(value) not in self.parent and gc.is_tracked(value):
                    self._see(value, frame)
                    frontier.append(value)

    def _seed_modules(self, frontier: list[Any]) -> None:
        modules = [(n, m) for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)]
        namespaces = []
        for name, module in modules:
            namespace = getattr(module, "__dict__", None)
            if type(namespace) is not dict or id(namespace) in self.parent:
                continue
            self.parent.setdefault(id(module), None)
            self.parent[id(namespace)] = module
            self.module_dicts[id(namespace)] = name
            namespaces.append(namespace)
        for namespace in namespaces:
            for value in tuple(namespace.values()):
                if id(value) not in self.parent and gc.is_tracked(value):
                    self._see(value, namespace)
                    frontier.append(value)

    def _see(self, obj: Any, parent: Any) -> None:
        self.parent[id(obj)] = parent
        kind = type(obj)
        if kind not in self.kinds:
            self.kinds[kind] = _kind(kind)
        if self.kinds[kind] is not None:
            self._keep(obj, self.kinds[kind])

    def _keep(self, obj: Any, kind: str) -> None:
        if kind == "tensor":
            self.tensors[id(obj)] = obj
        elif kind == "module":
            self.modules.append(obj)
        else:
            self.optimizers.append(obj)

    def _spread(self, frontier: list[Any]) -> bool:
        """Breadth-first from ``frontier``; False when the deadline came first."""
        parent, kinds, tracked, referents = self.parent, self.kinds, gc.is_tracked, gc.get_referents
        code = types.CodeType
        while frontier:
            following: list[Any] = []
            parent[id(following)] = _SKIP
            for n, obj in enumerate(frontier):
                if not n % _CHECK_EVERY and time.perf_counter() > self.deadline:
                    return False
                for ref in referents(obj):
                    if not tracked(ref) or id(ref) in parent:
                        continue
                    parent[id(ref)] = obj
                    kind = type(ref)
                    if kind is code:
                        continue
                    following.append(ref)
                    if kind not in kinds:
                        kinds[kind] = _kind(kind)
                    if kinds[kind] is not None:
                        self._keep(ref, kinds[kind])
            frontier = following
        return True

    # -- names ------------------------------------------------------------------------------------

    def up(self, tensor: torch.Tensor, max_depth: int) -> tuple[list[Any], str | None, str]:
        """The objects from the holder down to ``tensor``, the holder's name (``None`` when
        unnamed) and, when unnamed, why: ``outside Python``, ``unnamed`` or ``not searched``."""
        chain = [tensor]
        obj: Any = tensor
        for _ in range(max_depth):
            parent = self.parent.get(id(obj), _SKIP)
            if parent is _SKIP:
                return chain[::-1], None, "not searched"
            if parent is None:
                return chain[::-1], None, "outside Python" if obj is tensor else "unnamed"
            text, named = self.edge(parent, obj)
            if named:
                return chain[::-1], text, ""
            chain.append(parent)
            obj = parent
        return chain[::-1], None, "unnamed"

    def edge(self, parent: Any, child: Any) -> tuple[str, bool]:
        """How ``parent`` refers to ``child``, and whether that reference is a named root."""
        try:
            return self._edge(parent, child)
        except Exception:
            return f"<{type(parent).__name__}>", False

    def _edge(self, parent: Any, child: Any) -> tuple[str, bool]:
        module = self.module_dicts.get(id(parent))
        if module is not None:
            return f"{module}.{self.slot(parent, child)}", True
        if isinstance(parent, types.FrameType):
            return f"{_qualname(parent.f_code)}:{self.slot(self.locals(parent), child)}", True
        if isinstance(parent, _GENERATORS):
            frame = getattr(parent, "gi_frame", None) or getattr(parent, "cr_frame", None)
            frame = frame or getattr(parent, "ag_frame", None)
            if frame is not None:
                return f"{parent.__qualname__}:{self.slot(self.locals(frame), child)}", True
        if isinstance(parent, types.CellType):
            return self._cell(parent)
        if isinstance(parent, dict):
            return self._entry(parent, child)
        if isinstance(parent, (list, tuple, collections.deque)):
            return f"[{self.slot(parent, child)}]", False
        if isinstance(parent, (set, frozenset)):
            return "{*}", False
        for name, value in _attributes(parent):
            if value is child:
                return f"{type(parent).__name__}.{name}", True
        return f"<{type(parent).__name__}>", False

    def locals(self, frame: types.FrameType) -> dict[str, Any]:
        """``frame``'s locals, read once per walk."""
        local = self.frame_locals.get(id(frame))
        if local is None:
            local = self.frame_locals[id(frame)] = _frame_locals(frame)
        return local

    def slot(self, container: Any, child: Any) -> Any:
        """The key or index under which ``container`` (a dict, list, tuple or deque) holds
        ``child`` (``?`` when it does not); each container is indexed once per walk, so that
        naming the n tensors of one container stays linear."""
        index = self.slots.get(id(container))
        if index is None:
            pairs = container.items() if isinstance(container, dict) else enumerate(container)
            index = self.slots[id(container)] = {}
            for key, value in pairs:
                index.setdefault(id(value), key)
        return index.get(id(child), "?")

    def _cell(self, cell: types.CellType) -> tuple[str, bool]:
        """A closure cell, named as a variable of the function that defines it, through the
        closure that holds it or the (suspended or finished) frame it belongs to."""
        owner = self.parent.get(id(cell))
        if isinstance(owner, (types.FrameType, *_GENERATORS)):
            return self._edge(owner, cell.cell_contents)
        function = self.parent.get(id(owner)) if isinstance(owner, tuple) else None
        if isinstance(function, types.FunctionType) and function.__closure__ is owner:
            name = function.__code__.co_freevars[self.slot(owner, cell)]
            scope = function.__qualname__.rpartition(".<locals>.")[0] or function.__qualname__
            return f"{scope}:{name}", True
        return "<cell>", False

    def _entry(self, mapping: dict, child: Any) -> tuple[str, bool]:
        key = self.slot(mapping, child)
        owner = self.parent.get(id(mapping))
        if owner is None or owner is _SKIP:
            return f"[{key!r}]", False
        if isinstance(owner, type):
            if owner.__dict__.get(key) is child:
                return f"{owner.__name__}.{key}", True
        elif getattr(owner, "__dict__", None) is mapping:
            return f"{type(owner).__name__}.{key}", True
        module = owner if isinstance(owner, torch.nn.Module) else self.parent.get(id(owner))
        if isinstance(module, torch.nn.Module) and any(
            module.__dict__.get(store) is mapping for store in _MODULE_STORES
        ):
            return f"{type(module).__name__}.{key}", True
        return f"[{key!r}]", False


def _kind(kind: type) -> str | None:
    if issubclass(kind, torch.Tensor):
        return "tensor"
    if issubclass(kind, torch.nn.Module):
        return "module"
    if issubclass(kind, torch.optim.Optimizer):
        return "optimizer"
    return None


def _frame_locals(frame: types.FrameType) -> dict[str, Any]:
    """A copy of ``frame``'s locals; the snapshot older Pythons keep on a function's frame is
    emptied so that it does not outlive the values the function drops."""
    namespace = frame.f_locals
    local = dict(namespace)
    if _SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        namespace.clear()
    return local


def _module_level(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs a module's body, whose locals are its globals."""
    return not frame.f_code.co_flags & inspect.CO_OPTIMIZED and frame.f_locals is frame.f_globals


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    """An object's instance attributes and slots, read without running its ``__getattr__``."""
    namespace = getattr(obj, "__dict__", None)
    if isinstance(namespace, dict):
        yield from namespace.items()
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            descriptor = klass.__dict__.get(slot)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    yield slot, descriptor.__get__(obj, klass)
                except AttributeError:
                    continue


# -- the attribution ------------------------------------------------------------------------------

StorageKey = tuple[str, int | None, int]


@dataclass
class _Group:
    name: str | None
    why: str
    chains: list[list[Any]] = field(default_factory=list)
    storages: dict[StorageKey, int] = field(default_factory=dict)
    graph: dict[StorageKey, int] = field(default_factory=dict)

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [chain[-1] for chain in self.chains]


_LOOSE = ("outside Python", "not searched")


class _Attribution:
    def __init__(
        self, walk: _Walk, before: Snapshot | None, max_depth: int, deadline: float
    ) -> None:
        self.walk = walk
        self.before = before
        self.max_depth = max_depth
        self.deadline = deadline
        kinds = walk.kinds
        unfrozen = {}
        for obj in gc.get_objects():
            kind = type(obj)
            if kind not in kinds:
                kinds[kind] = _kind(kind)
            if kinds[kind] == "tensor":
                unfrozen[id(obj)] = obj
        candidates = {**walk.tensors, **unfrozen}
        if before is None:
            self.old = _state_storages(walk.modules, walk.optimizers)
            self.new = [t for t in candidates.values() if _storage(t)[0] not in self.old]
        else:
            self.new, old = [], []
            for key, t in candidates.items():
                (self.new if key in unfrozen and t not in before else old).append(t)
            self.old = {_storage(t)[0] for t in old}
        self.counted: set[StorageKey | None] = {None, *self.old}
        self.nodes: dict[int, Any] = {}

    def holders(self) -> list[Holder]:
        groups: dict[tuple[str, int | None], _Group] = {}
        for tensor in self.new:
            chain, name, why = self.walk.up(tensor, self.max_depth)
            top = None if why in _LOOSE else id(chain[0])
            group = groups.setdefault((why, top), _Group(name, why))
            group.chains.append(chain)
        for group in groups.values():
            for tensor in group.tensors:
                key, nbytes = _storage(tensor)
                if key is not None:
                    group.storages[key] = nbytes
        ordered = sorted(groups.values(), key=lambda g: (-sum(g.storages.values()), -len(g.chains)))
        held = [g for g in ordered if g.why not in _LOOSE]
        for group in held:
            self._count(group)
        for group in held:
            self._graph(group)
        for group in ordered:
            if group.why in _LOOSE:
                self._count(group)
        blocks = _cuda_blocks()
        sites = {(device, address): _site(frames) for device, address, _, frames in blocks}
        holders = [self._holder(g, sites) for g in ordered]
        holders += self._unheld(blocks)
        return [h for h in holders if h.bytes > 0]

    def _count(self, group: _Group) -> None:
        """Keep the storages of ``group`` that no group counted before."""
        group.storages = {k: v for k, v in group.storages.items() if k not in self.counted}
        self.counted.update(group.storages)

    def _graph(self, group: _Group) -> None:
        """Count the new storages that ``group``'s tensors' autograd graphs saved."""
        stack = [t.grad_fn for t in group.tensors if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or id(node) in self.nodes:
                continue
            self.nodes[id(node)] = node
            if not len(self.nodes) % 256 and time.perf_counter() > self.deadline:
                return
            for saved in _saved_tensors(node):
                key, nbytes = _storage(saved)
                if key not in self.counted:
                    self.counted.add(key)
                    group.graph[key] = nbytes
            stack.extend(following for following, _ in node.next_functions)

    def _holder(self, group: _Group, sites: Mapping[tuple[int, int], str | None]) -> Holder:
        """Describe ``group`` at the deepest object all its chains share (a tensor's container
        when the group is one tensor below its holder)."""
        chains = group.chains
        first = chains[0]
        depth = 0
        shortest = min(len(c) for c in chains)
        while depth + 1 < shortest and all(c[depth + 1] is first[depth + 1] for c in chains):
            depth += 1
        if 0 < depth == len(first) - 1:
            depth -= 1
        labels = "".join(self.walk.edge(first[i], first[i + 1])[0] for i in range(depth))
        shared = first[depth]
        if group.why in _LOOSE:
            path, kind, items = f"<{group.why}>", "tensors", len(chains)
        else:
            path = (group.name or f"<unnamed {type(first[0]).__name__}>") + labels
            if isinstance(shared, torch.Tensor):
                kind, items = "tensor", 1
            else:
                kind = type(shared).__name__
                items = len(shared) if isinstance(shared, _SIZED) else len(chains)
        by_site: collections.Counter[str] = collections.Counter()
        for (device, index, address), nbytes in (*group.storages.items(), *group.graph.items()):
            site = sites.get((index or 0, address)) if device == "cuda" else None
            if site is not None:
                by_site[site] += nbytes
        graph_bytes = sum(group.graph.values())
        return Holder(
            path=path,
            container=kind,
            items=items,
            tensors=len(chains),
            bytes=sum(group.storages.values()) + graph_bytes,
            graph_bytes=graph_bytes,
            sites=tuple(site for site, _ in by_site.most_common(_SITES_PER_HOLDER)),
        )

    def _unheld(self, blocks: list[tuple[int, int, int, list[dict]]]) -> list[Holder]:
        """New CUDA blocks that no holder's storage accounts for, grouped by allocation site."""
        if self.before is None or not blocks:
            return []
        counted = {(k[1] or 0, k[2]) for k in self.counted if k is not None and k[0] == "cuda"}
        by_site: dict[str | None, list[int]] = {}
        for device, address, size, frames in blocks:
            if (device, address, size) in self.before.blocks or (device, address) in counted:
                continue
            by_site.setdefault(_site(frames), []).append(size)
        return [
            Holder(
                f"<no Python holder> {site}" if site else "<no Python holder>",
                "blocks",
                len(sizes),
                0,
                sum(sizes),
                sites=(site,) if site else (),
            )
            for site, sizes in by_site.items()
        ]


def _storage(tensor: torch.Tensor) -> tuple[StorageKey | None, int]:
    """``((device type, index, address), nbytes)`` of a tensor's storage; ``(None, 0)`` for
    tensors without memory of their own (meta, empty, sparse or wrapper subclasses)."""
    try:
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        address = storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None, 0
    if not nbytes or not address or tensor.device.type == "meta":
        return None, 0
    return (tensor.device.type, tensor.device.index, address), nbytes


def _state_storages(
    modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> set[StorageKey | None]:
    """Storages of live modules' parameters, buffers and gradients, and optimizer state."""
    tensors: list[torch.Tensor] = []
    for module in modules:
        for store in ("_parameters", "_buffers"):
            tensors += [t for t in module.__dict__.get(store, {}).values() if t is not None]
    tensors += [t.grad for t in tensors if t.grad is not None]
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {_storage(t)[0] for t in tensors}


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_tensors(node: Any) -> Iterator[torch.Tensor]:
    """The tensors an autograd node saved for backward, unpacked (none once freed)."""
    names = _SAVED_NAMES.get(type(node))
    if names is None:
        names = tuple(n for n in dir(type(node)) if n.startswith("_saved_") or n == "saved_tensors")
        _SAVED_NAMES[type(node)] = names
    for name in names:
        try:
            value = getattr(node, name)
        except (RuntimeError, AttributeError):
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, torch.Tensor):
                yield item


# -- CUDA allocation sites ------------------------------------------------------------------------


def _sites_recorded() -> bool:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(enabled()) if enabled is not None else False


def _cuda_blocks() -> list[tuple[int, int, int, list[dict]]]:
    """Blocks in use on every CUDA device: ``(device, address, size, frames)``."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    blocks = []
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = block.get("frames")
            if frames is None:
                history = block.get("history") or [{}]
                frames = history[0].get("frames", [])
            blocks.append((segment.get("device", 0), block["address"], block["size"], frames))
    return blocks


def _site(frames: list[dict]) -> str | None:
    """``file:line`` of the innermost frame outside torch (the innermost of all when every frame
    is torch's); ``None`` without frames (stacks not recorded)."""
    outside = [f for f in frames if not f["filename"].startswith((_TORCH_DIR, "<"))]
    chosen = (outside or frames or [None])[0]
    if chosen is None:
        return None
    filename = chosen["filename"]
    here = os.getcwd() + os.sep
    if filename.startswith(here):
        filename = filename[len(here) :]
    return f"{filename}:{chosen['line']}"
