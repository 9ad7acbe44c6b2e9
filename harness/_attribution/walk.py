"""The walk: one breadth-first pass over the object graph from the named roots (every module's
globals, its functions' mutable defaults first, the locals of every running frame of every
thread), following the references C++ keeps that Python can read as any other, then over what
only C code references, recording for each object the one it was first reached from;
:meth:`Walk.up` climbs those links from a tensor to its nearest named reference and
:meth:`Walk.edge` says how one object refers to the next (``Cache.items``, ``module.NAME``,
``function:variable``, ``[3]``)."""

from __future__ import annotations

import collections
import gc
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness._attribution.names import (
    _GENERATORS,
    C_LINKS,
    SKIP,
    UNROOTED,
    Names,
    _frame_locals,
    namespace,
)
from harness._attribution.weights import own_module

TRACED_INPUTS = "torch.jit keeps each trace's example inputs"

WALK_MAX_BYTES = 192 * 2**20
"""The most a walk may hold for itself (its map of parents, the largest part, and its frontier):
a walk that would need more stops there, as when its budget of objects runs out."""
_ENTRY = 32 + 8
"""What one more reached object costs the walk beyond its map's table: the id as an int, and
its slot in a frontier."""
_CHECK = 1 << 15
"""Objects walked between two looks at the walk's own size."""


class Walk(Names):
    """One breadth-first walk of the object graph: ``parent`` maps ``id(obj)`` to the object
    it was first reached from (``None`` for roots, :data:`UNROOTED` for objects that no root
    reaches, which only C code or a reference cycle keeps). ``visit(obj, parent)``, when given,
    is called for each object the walk reaches (untracked ones, such as arrays and strings,
    each time they are reached; they get no ``parent``); a tracked object it returns False for
    is not walked further. With ``ours``, leakgate's own objects (their types' and modules')
    are not walked, nor what only they reach. With ``watch`` (ids), every reference to a
    watched object other than the one it was first reached by is kept, as its referrer in
    :attr:`referrers` and itself in :attr:`joined`: with ``parent``, every reference the walk
    saw to those objects.

    The walk, not ``gc.get_referrers``, finds referrers because ``gc.freeze()`` (which the
    :class:`~harness.Recorder` calls) hides frozen objects from ``gc.get_referrers`` and
    ``gc.get_objects``: a module global or an object created before the recorder would never be
    named. Reading a running frame's locals on Python < 3.13 leaves a snapshot of them on the
    frame that would keep a local alive after the function drops it; the walk empties it again
    (a ``locals()`` dict that the function itself keeps is emptied too).
    """

    def __init__(
        self,
        budget: int,
        targets: set[int] | None = None,
        visit: Callable[[Any, Any], bool] | None = None,
        watch: set[int] | None = None,
        ours: bool = False,
    ) -> None:
        self.budget = budget
        self.watch = watch
        self.referrers: list[Any] = []
        self.joined: list[Any] = []
        self.classify = own_or_kind if ours else kind_of
        self.skipped: list[Any] = []
        self.visit = visit
        self.visited = 0
        self.complete = False
        self.max_bytes = WALK_MAX_BYTES
        self.full = False
        self.targets = targets
        self.missing = len(targets) if targets is not None else -1
        self.parent: dict[int, Any] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.module_dicts: dict[int, str] = {}
        self.frame_locals: dict[int, dict[str, Any]] = {}
        self.slots: dict[int, dict[int, Any]] = {}
        self.kinds: dict[type, str | None] = {}
        self.library: dict[int, str] = {}
        self.linked: dict[int, Any] = {}
        self.module_parents: dict[int, tuple[torch.nn.Module, str]] = {}
        self.top_names: dict[int, str] = {}
        self._parents_known = False
        for own in (self, self.__dict__, *self.__dict__.values()):
            self.parent[id(own)] = SKIP

    def run(self, rooted: bool = False) -> None:
        """Walk until every object is reached (every one a named root reaches, with
        ``rooted``), or every one of ``targets`` (ids) when given, or ``budget`` objects were
        visited (their referents read); :attr:`complete` says which. A target's parent is the
        same either way: the first object it was reached from."""
        frontier: list[Any] = []
        self.parent[id(frontier)] = SKIP
        self._seed_modules(frontier)
        self._seed_frames(frontier)
        if not self._spread(frontier):
            return
        if not self.missing or rooted:
            self.complete = True
            return
        self._leave_ours()
        # What the named roots do not reach is referenced from C only (or is garbage): walk
        # it too, from the objects nothing else unreached refers to first, then from what is
        # left (cycles), one object at a time: instances of classes first, whose attributes
        # name what they hold, tensors last.
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
            self._see(obj, UNROOTED)
        self._leave_ours()
        tops = [o for o in tops if self.parent[id(o)] is not SKIP]
        self.parent[id(tops)] = SKIP
        if not self._spread(tops):
            return
        rest = sorted((o for o in unreached if id(o) not in self.parent), key=_seed_rank)
        self.parent[id(rest)] = SKIP
        for obj in rest:
            if id(obj) not in self.parent:
                self._see(obj, UNROOTED)
                if self.parent[id(obj)] is SKIP:
                    self._leave_ours()
                elif not self._spread([obj]):
                    return
        self.complete = True

    def _leave_ours(self) -> None:
        """Mark what only leakgate's own objects reach as not to be walked."""
        stack = self.skipped
        while stack:
            for ref in gc.get_referents(stack.pop()):
                if id(ref) not in self.parent and gc.is_tracked(ref):
                    self.parent[id(ref)] = SKIP
                    stack.append(ref)

    def clear(self) -> None:
        """Drop every reference the walk took (frames among them, which would otherwise close
        reference cycles through the caller's locals)."""
        for value in self.__dict__.values():
            if isinstance(value, (dict, list, set)):
                value.clear()

    def _frames(self) -> Iterator[types.FrameType]:
        for top in sys._current_frames().values():
            frame: types.FrameType | None = top
            while frame is not None:
                if not _ours(frame):
                    yield frame
                elif self.classify is own_or_kind:
                    self.parent.setdefault(id(frame), SKIP)
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
                self._seed(value, frame, frontier)

    def _seed_modules(self, frontier: list[Any]) -> None:
        modules = [(n, m) for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)]
        namespaces = []
        for name, module in modules:
            table = namespace(module)
            if type(table) is not dict or id(table) in self.parent:
                continue
            if self.classify is own_or_kind and own_module(name):
                self.parent[id(table)] = SKIP
                continue
            self.parent.setdefault(id(module), None)
            self.parent[id(table)] = module
            self.module_dicts[id(table)] = name
            namespaces.append(table)
        for table in namespaces:
            self._seed_defaults(table, frontier)
        for table in namespaces:
            for value in tuple(table.values()):
                self._seed(value, table, frontier)

    def _seed_defaults(self, table: dict[str, Any], frontier: list[Any]) -> None:
        """Start at the mutable default values of the functions a module's globals name (and
        of their classes' methods), through the function: such a default is named as the
        function's (``module.remember.__defaults__[0]``), a name a user edits, not as a local
        of a caller that holds the same list."""
        for value in tuple(table.values()):
            if type(value) is types.FunctionType:
                self._seed_function(value, table, frontier)
            elif issubclass(type(value), type) and id(value) not in self.parent:
                space = _type_dict(value)
                methods = [f for f in space.values() if _mutable_defaults(f)]
                if methods:
                    self._seed(value, table, frontier)
                    self._seed(space, value, frontier)
                    for method in methods:
                        self._seed_function(method, space, frontier)

    def _seed_function(self, function: Any, root: Any, frontier: list[Any]) -> None:
        """``function`` (which ``root`` refers to) and its defaults, where one is mutable."""
        found = _mutable_defaults(function)
        if not found:
            return
        self._seed(function, root, frontier)
        if self.parent.get(id(function)) is root:
            for defaults in found:
                self._seed(defaults, function, frontier)
                for value in _values(defaults):
                    self._seed(value, defaults, frontier)

    def _seed(self, value: Any, root: Any, frontier: list[Any]) -> None:
        """Start the walk at ``value``, which ``root`` (a namespace, a frame) refers to."""
        if id(value) in self.parent:
            if self.watch is not None and id(value) in self.watch:
                self.referrers.append(root)
                self.joined.append(value)
            return
        if self.visit is not None and not self.visit(value, root):
            self.parent[id(value)] = SKIP
        elif gc.is_tracked(value):
            self._see(value, root)
            if self.parent[id(value)] is not SKIP:
                frontier.append(value)

    def _see(self, obj: Any, parent: Any) -> None:
        self.parent[id(obj)] = parent
        kind = type(obj)
        if kind not in self.kinds:
            self.kinds[kind] = self.classify(kind)
        named = self.kinds[kind]
        if named == OURS or (self.classify is own_or_kind and _running_ours(obj)):
            self.parent[id(obj)] = SKIP
            self.skipped.append(obj)
        elif named is not None:
            self._keep(obj, named)

    def _keep(self, obj: Any, kind: str) -> None:
        if kind == "tensor":
            self.tensors[id(obj)] = obj
            if self.targets is not None and id(obj) in self.targets:
                self.missing -= 1
        elif kind == "module":
            self.modules.append(obj)
            if isinstance(obj, torch.jit.ScriptModule):
                self._link_traced_inputs(obj)
        else:
            self.optimizers.append(obj)

    def _link_traced_inputs(self, module: torch.jit.ScriptModule) -> None:
        """Link the example inputs a traced module keeps in C++ to the module, so that what
        holds the module holds them."""
        try:
            stored = module._c._retrieve_traced_inputs()
        except (AttributeError, RuntimeError):  # never initialized (torch raises), or no _c
            return
        for tensor in _tensors_in([value for _, value in stored.items()]):
            if id(tensor) not in self.parent:
                self.parent[id(tensor)] = module
                self.tensors[id(tensor)] = tensor
                self.library[id(tensor)] = TRACED_INPUTS

    def _link(self, holder: Any, parent: Any, following: list[Any]) -> None:
        """Follow the reference ``holder`` (an object of :data:`C_LINKS`, which ``gc`` does not
        track) keeps in C++, as though ``gc`` saw it: ``holder`` gets ``parent``, and what it
        keeps gets ``holder``."""
        kept = getattr(holder, C_LINKS[type(holder)][0])
        self.parent[id(holder)] = parent
        self.linked[id(holder)] = holder
        if id(kept) in self.parent:
            if self.watch is not None and id(kept) in self.watch:
                self.referrers.append(holder)
                self.joined.append(kept)
        elif gc.is_tracked(kept):
            self._see(kept, holder)
            if self.parent[id(kept)] is not SKIP:
                following.append(kept)

    def own_bytes(self) -> int:
        """What this walk holds for itself now, in bytes (about :attr:`max_bytes` at most)."""
        return sys.getsizeof(self.parent) + len(self.parent) * _ENTRY

    def _spread(self, frontier: list[Any]) -> bool:
        """Breadth-first from ``frontier``; False when the budget (of objects, or of the walk's
        own memory) ran out first (the objects visited until then still have their referents
        recorded)."""
        parent, kinds, tracked, referents = self.parent, self.kinds, gc.is_tracked, gc.get_referents
        code, visit, watch = types.CodeType, self.visit, self.watch
        referrers, joined = self.referrers, self.joined
        while frontier:
            room = self.budget - self.visited
            cut = len(frontier) > room
            if cut:
                frontier = frontier[: max(room, 0)]
                parent[id(frontier)] = SKIP
            following: list[Any] = []
            parent[id(following)] = SKIP
            for done, obj in enumerate(frontier):
                if not self.missing:  # every target has its parent: the rest names nothing
                    self.visited += done
                    return True
                if not done % _CHECK and self.own_bytes() > self.max_bytes:
                    self.visited += done
                    self.full = True
                    return False
                for ref in referents(obj):
                    if id(ref) in parent:
                        if watch is not None and id(ref) in watch:
                            referrers.append(obj)
                            joined.append(ref)
                        continue
                    if not tracked(ref):
                        if visit is not None:
                            visit(ref, obj)
                        if type(ref) in C_LINKS:
                            self._link(ref, obj, following)
                        continue
                    if visit is not None and not visit(ref, obj):
                        parent[id(ref)] = SKIP
                        continue
                    parent[id(ref)] = obj
                    kind = type(ref)
                    if kind is code:
                        continue
                    if kind not in kinds:
                        kinds[kind] = self.classify(kind)
                    named = kinds[kind]
                    if named is None:
                        following.append(ref)
                    elif named == OURS:
                        parent[id(ref)] = SKIP
                        self.skipped.append(ref)
                    else:
                        following.append(ref)
                        self._keep(ref, named)
            self.visited += len(frontier)
            if cut:
                return False
            frontier = following
        return True


def kind_of(kind: type) -> str | None:
    if issubclass(kind, torch.Tensor):
        return "tensor"
    if issubclass(kind, torch.nn.Module):
        return "module"
    if issubclass(kind, torch.optim.Optimizer):
        return "optimizer"
    return None


OURS = "ours"


def own_or_kind(kind: type) -> str | None:
    """:func:`kind_of`, or :data:`OURS` for a type of leakgate's own."""
    module = kind.__dict__.get("__module__")
    if isinstance(module, str) and own_module(module):
        return OURS
    return kind_of(kind)


def _seed_rank(obj: Any) -> int:
    """Order of seeds among unreached objects: instances of classes (whose attributes name
    what they hold) first, builtin containers next, tensors last."""
    kind = type(obj)
    if issubclass(kind, torch.Tensor):
        return 2
    return 1 if kind.__module__ == "builtins" else 0


def _mutable_defaults(function: Any) -> list[Any]:
    """A function's ``__defaults__`` and ``__kwdefaults__`` that hold a value ``gc`` tracks (a
    list, a dict, an object: what a call may change and the next one sees); none for what is
    not a function."""
    if type(function) is not types.FunctionType:
        return []
    found = (function.__defaults__, function.__kwdefaults__)
    return [d for d in found if d and any(map(gc.is_tracked, _values(d)))]


def _values(defaults: tuple[Any, ...] | dict[str, Any]) -> tuple[Any, ...]:
    """A function's default values: its ``__defaults__``, or its ``__kwdefaults__``' values."""
    return tuple(defaults.values()) if isinstance(defaults, dict) else defaults


def _type_dict(kind: type) -> dict[str, Any]:
    """The dict behind a class's ``__dict__`` (whose mapping proxy is made anew each time)."""
    return next((r for r in gc.get_referents(kind) if type(r) is dict), {})


def _tensors_in(values: list[Any]) -> Iterator[torch.Tensor]:
    """The tensors in nested lists, tuples and dicts."""
    while values:
        value = values.pop()
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            values.extend(value)
        elif isinstance(value, dict):
            values.extend(value.values())


def _ours(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs leakgate's own code (its recorder, plugin, callbacks and this
    search), whose locals are never holders: a callback's ``outputs`` is named by what keeps it
    after the callback returns. The self-check plays a user's part and is not ours."""
    return own_module(str(frame.f_globals.get("__name__")))


def _running_ours(obj: Any) -> bool:
    """Whether ``obj`` is a frame, generator or coroutine that runs leakgate's own code."""
    if type(obj) in _GENERATORS:
        obj = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None)
    return type(obj) is types.FrameType and _ours(obj)


def _module_level(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs a module's body, whose locals are its globals."""
    return not frame.f_code.co_flags & inspect.CO_OPTIMIZED and frame.f_locals is frame.f_globals


SIZED = (list, tuple, dict, set, frozenset, collections.deque, collections.OrderedDict)
"""Builtin containers, whose ``len`` is their items' count (never a user's ``__len__``)."""


def contents(holder: Any, referents: list[Any]) -> list[Any]:
    """``referents`` of ``holder``, the values of its namespace in place of the namespace
    (a dict of untracked values is itself untracked): each is then named as an attribute."""
    for at, item in enumerate(referents):
        if type(item) is dict and not gc.is_tracked(item) and namespace(holder) is item:
            return [*referents[:at], *item.values(), *referents[at + 1 :]]
    return referents


def kind_name(obj: Any) -> str:
    """``tensor`` for any tensor, else the type's name."""
    return "tensor" if kind_of(type(obj)) == "tensor" else type(obj).__name__


_BUILTIN_LEN = {sized.__len__ for sized in SIZED}


def length(obj: Any) -> int | None:
    """``len(obj)`` for builtin containers and subclasses that keep their ``len`` (a
    ``defaultdict``, a ``Counter``), never a user's ``__len__``; else None."""
    if issubclass(type(obj), SIZED) and type(obj).__len__ in _BUILTIN_LEN:
        return len(obj)
    return None


def describe_item(obj: Any) -> str:
    """What an object is, for a list of items: ``bound Owner.method`` for a bound method."""
    if type(obj) is types.MethodType:
        owner = type(obj.__self__).__name__
        return f"bound {owner}.{getattr(obj.__func__, '__name__', '?')}"
    return kind_name(obj)
