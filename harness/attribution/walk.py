"""The walk: one breadth-first pass over the object graph from the named roots (every module's
globals, the locals of every running frame), then over what only C code references, recording
for each object the one it was first reached from; :meth:`Walk.up` climbs those links from a
tensor to its nearest named reference and :meth:`Walk.edge` says how one object refers to the
next (``Cache.items``, ``module.NAME``, ``function:variable``, ``[3]``)."""

from __future__ import annotations

import collections
import gc
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_PACKAGE = __name__.rpartition(".")[0]

SKIP = object()


class Walk:
    """One breadth-first walk of the object graph: ``parent`` maps ``id(obj)`` to the object
    it was first reached from (``None`` for roots and objects only C code references).

    The walk, not ``gc.get_referrers``, finds referrers because ``gc.freeze()`` (which the
    :class:`~harness.Recorder` calls) hides frozen objects from ``gc.get_referrers`` and
    ``gc.get_objects``: a module global or an object created before the recorder would never be
    named. Reading a running frame's locals on Python < 3.13 leaves a snapshot of them on the
    frame that would keep a local alive after the function drops it; the walk empties it again
    (a ``locals()`` dict that the function itself keeps is emptied too).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.visited = 0
        self.complete = False
        self.parent: dict[int, Any] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.module_dicts: dict[int, str] = {}
        self.frame_locals: dict[int, dict[str, Any]] = {}
        self.slots: dict[int, dict[int, Any]] = {}
        self.kinds: dict[type, str | None] = {}
        for own in (self, self.__dict__, *self.__dict__.values()):
            self.parent[id(own)] = SKIP

    def run(self) -> None:
        """Walk until every object is reached or ``budget`` objects were visited (their
        referents read); :attr:`complete` says which."""
        frontier: list[Any] = []
        self.parent[id(frontier)] = SKIP
        self._seed_modules(frontier)
        self._seed_frames(frontier)
        if not self._spread(frontier):
            return
        # What the named roots do not reach is referenced from C only (or is garbage): walk
        # it too, from the objects nothing else unreached refers to first, then from what is
        # left (cycles), one object at a time.
        everything = gc.get_objects()
        self.parent[id(everything)] = SKIP
        unreached = [o for o in everything if id(o) not in self.parent]
        del everything
        self.parent[id(unreached)] = SKIP
        inner = {id(r) for o in unreached for r in gc.get_referents(o)}
        self.visited += len(unreached)
        tops = [o for o in unreached if id(o) not in inner]
        self.parent[id(tops)] = SKIP
        for obj in tops:
            self._see(obj, None)
        if not self._spread(tops):
            return
        for obj in unreached:
            if id(obj) not in self.parent:
                self._see(obj, None)
                if not self._spread([obj]):
                    return
        self.complete = True

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
                if not _ours(frame):
                    yield frame
                frame = frame.f_back

    def _seed_frames(self, frontier: list[Any]) -> None:
        for frame in self._frames():
            if id(frame) in self.parent or _module_level(frame):
                continue
            self.parent[id(frame)] = None
            local = _frame_locals(frame)
            self.parent[id(local)] = SKIP
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
            self.kinds[kind] = kind_of(kind)
        named = self.kinds[kind]
        if named is not None:
            self._keep(obj, named)

    def _keep(self, obj: Any, kind: str) -> None:
        if kind == "tensor":
            self.tensors[id(obj)] = obj
        elif kind == "module":
            self.modules.append(obj)
        else:
            self.optimizers.append(obj)

    def _spread(self, frontier: list[Any]) -> bool:
        """Breadth-first from ``frontier``; False when the budget ran out first (the objects
        visited until then still have their referents recorded)."""
        parent, kinds, tracked, referents = self.parent, self.kinds, gc.is_tracked, gc.get_referents
        code = types.CodeType
        while frontier:
            room = self.budget - self.visited
            cut = len(frontier) > room
            if cut:
                frontier = frontier[: max(room, 0)]
                parent[id(frontier)] = SKIP
            self.visited += len(frontier)
            following: list[Any] = []
            parent[id(following)] = SKIP
            for obj in frontier:
                for ref in referents(obj):
                    if not tracked(ref) or id(ref) in parent:
                        continue
                    parent[id(ref)] = obj
                    kind = type(ref)
                    if kind is code:
                        continue
                    following.append(ref)
                    if kind not in kinds:
                        kinds[kind] = kind_of(kind)
                    named = kinds[kind]
                    if named is not None:
                        self._keep(ref, named)
            if cut:
                return False
            frontier = following
        return True

    # -- names ------------------------------------------------------------------------------------

    def up(self, tensor: torch.Tensor, max_depth: int) -> tuple[list[Any], str | None, str]:
        """The objects from the holder down to ``tensor``, the holder's name (``None`` when
        unnamed) and, when unnamed, why: ``outside Python``, ``unnamed`` or ``not searched``."""
        chain = [tensor]
        obj: Any = tensor
        for _ in range(max_depth):
            parent = self.parent.get(id(obj), SKIP)
            if parent is SKIP:
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

    def _entry(self, mapping: dict[Any, Any], child: Any) -> tuple[str, bool]:
        key = self.slot(mapping, child)
        owner = self.parent.get(id(mapping))
        if owner is None or owner is SKIP:
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


def kind_of(kind: type) -> str | None:
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


def _ours(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs this package's code, whose locals are never holders."""
    name = str(frame.f_globals.get("__name__"))
    return name == _PACKAGE or name.startswith(_PACKAGE + ".")


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
