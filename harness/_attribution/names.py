"""Naming what the walk found: how one object refers to the next (``Cache.items``,
``module.NAME``, ``function:variable``, ``[3]``), the path from the nearest named reference
down to an object, and a module's name by its place in its model. :class:`Names` is a part of
:class:`~harness._attribution.walk.Walk`, read once the walk has recorded each object's parent.

Naming runs none of an object's own code: types are asked of ``type(obj)`` (``isinstance``
would read a ``__class__`` the object may answer with anything, or an error), namespaces and
items through the C functions of their base types (never a ``__getattr__``, a ``__dict__``
property or an ``items`` a subclass defines), so an object that refuses every question is
named as any other."""

from __future__ import annotations

import _thread
import collections
import inspect
import itertools
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

_MODULE_STORES = ("_parameters", "_buffers", "_modules")
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
_DEFAULTS = ("__defaults__", "__kwdefaults__")
_SNAPSHOT_LOCALS = sys.version_info < (3, 13)
_TOP_DEPTH = 8
_CLIMB = 10_000


def _kept_in_c() -> dict[type, tuple[str, str]]:
    """Objects that keep a Python object from C++, where ``gc`` does not see the reference:
    the attribute that reads it (a reference the walk follows as any other) and what else C++
    keeps for them. torch.jit keeps each module it compiles (each trace too) in
    ``concrete_type_store.methods_compiled``, whose items keep the module's Python class."""
    links = {}
    concrete = getattr(torch._C, "ConcreteModuleType", None)
    if isinstance(concrete, type) and hasattr(concrete, "py_class"):
        links[concrete] = ("py_class", "a compiled module's graphs and code")
    return links


C_LINKS = _kept_in_c()
"""Types whose objects keep a Python object from C++: the attribute that reads it, and what
else C++ keeps for them."""


SKIP = object()
UNROOTED = object()
"""The parent recorded for an object that no named root reaches (kept by C code or a cycle)."""


class Names:
    """The naming half of a walk: its ``parent`` links, read upward."""

    parent: dict[int, Any]
    library: dict[int, str]
    linked: dict[int, Any]
    module_dicts: dict[int, str]
    frame_locals: dict[int, dict[str, Any]]
    slots: dict[int, dict[int, Any]]
    modules: list[torch.nn.Module]
    module_parents: dict[int, tuple[torch.nn.Module, str]]
    top_names: dict[int, str]
    _parents_known: bool

    def up(self, tensor: Any, max_depth: int) -> tuple[list[Any], str | None, str]:
        """The objects from the holder down to ``tensor``, the holder's name (``None`` when
        unnamed) and, when unnamed, why: ``outside Python``, ``unnamed`` or ``not searched``."""
        chain = [tensor]
        obj: Any = tensor
        for _ in range(max_depth):
            parent = self.parent.get(id(obj), SKIP)
            if parent is SKIP:
                return chain[::-1], None, "not searched"
            if parent is None or parent is UNROOTED:
                return chain[::-1], None, "outside Python" if obj is tensor else "unnamed"
            text, named = self.edge(parent, obj)
            if named:
                return chain[::-1], text, ""
            chain.append(parent)
            obj = parent
        return chain[::-1], None, "unnamed"

    def rooted(self, obj: Any) -> bool:
        """Whether a named root reaches ``obj`` (False: only C code or a cycle keeps it)."""
        for _ in range(_CLIMB):
            parent = self.parent.get(id(obj), SKIP)
            if parent is UNROOTED:
                return False
            if parent is None or parent is SKIP:
                return True
            obj = parent
        return True

    def module_name(self, module: torch.nn.Module) -> str:
        """How to name ``module`` as the owner of an attribute: by its class for a top-level
        module (``Tracked``), else by the path from its top module's named reference through
        ``_modules`` (``train:model.0``), so that sibling layers of one class stay apart."""
        if not self._parents_known:
            self._parents_known = True
            for owner in self.modules:
                children = (namespace(owner) or {}).get("_modules")
                if type(children) is dict:
                    for name, child in children.items():
                        if child is not None:
                            self.module_parents.setdefault(id(child), (owner, name))
        names: list[str] = []
        node, seen = module, {id(module)}
        while id(node) in self.module_parents:
            node, name = self.module_parents[id(node)]
            if id(node) in seen:
                break
            seen.add(id(node))
            names.append(name)
        if not names:
            return type(module).__name__
        return ".".join([self._top_name(node), *reversed(names)])

    def module_path(self, module: torch.nn.Module) -> str:
        """``module``'s path from a named reference: a submodule's as :meth:`module_name`
        gives it, a top-level module's from what refers to it (``train:kept[3]``)."""
        name = self.module_name(module)
        return self._top_name(module) if id(module) not in self.module_parents else name

    def _top_name(self, top: torch.nn.Module) -> str:
        """The named reference to a top-level module (its class name when it has none)."""
        name = self.top_names.get(id(top))
        if name is None:
            self.top_names[id(top)] = type(top).__name__  # stands in while the climb runs
            name = self.top_names[id(top)] = self.path_of(top) or type(top).__name__
        return name

    def path_of(self, obj: Any) -> str | None:
        """The path to ``obj`` from its nearest named reference (``Trainer.log[3]``), or None
        when no named reference reaches it within a few steps."""
        chain, root, _ = self.up(obj, _TOP_DEPTH)
        if root is None:
            return None
        return root + "".join(self.edge(a, b)[0] for a, b in itertools.pairwise(chain))

    def edge(self, parent: Any, child: Any) -> tuple[str, bool]:
        """How ``parent`` refers to ``child``, and whether that reference is a named root."""
        kind = type(parent)
        if id(child) in self.library and self.parent.get(id(child)) is parent:
            return "<traced inputs>", False
        if id(parent) in self.linked:
            return f".{C_LINKS[type(parent)][0]}", False
        module = self.module_dicts.get(id(parent))
        if module is not None:
            return f"{module}.{self.slot(parent, child)}", True
        if kind is types.FrameType:  # a root only while it runs, not in a traceback
            live = self.parent.get(id(parent), SKIP) is None
            return f"{_qualname(parent.f_code)}:{self.slot(self.locals(parent), child)}", live
        if kind in _GENERATORS:
            frame = getattr(parent, "gi_frame", None) or getattr(parent, "cr_frame", None)
            frame = frame or getattr(parent, "ag_frame", None)
            if frame is not None:
                return f"{parent.__qualname__}:{self.slot(self.locals(frame), child)}", True
        if kind is types.CellType:
            return self._cell(parent)
        if kind is types.FunctionType:
            for name in _DEFAULTS:
                if getattr(parent, name) is child:
                    return f".{name}", False
        if issubclass(kind, _thread._local):
            return "", False  # its table of each thread's attributes, read as its own
        if issubclass(kind, dict):
            return self._entry(parent, child)
        if issubclass(kind, _SEQUENCES):
            return f"[{self.slot(parent, child)}]", False
        if issubclass(kind, (set, frozenset)):
            return "{*}", False
        for name, value in _attributes(parent):
            if value is child:
                return f"{self._owner(parent)}.{name}", True
        return f"<{type(parent).__name__}>", False

    def _owner(self, obj: Any) -> str:
        """An attribute owner's name: its class, or a submodule's path."""
        if issubclass(type(obj), torch.nn.Module):
            return self.module_name(obj)
        return type(obj).__name__

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
            index = self.slots[id(container)] = {}
            for key, value in _pairs(container):
                index.setdefault(id(value), key)
        return index.get(id(child), "?")

    def _cell(self, cell: types.CellType) -> tuple[str, bool]:
        """A closure cell, named as a variable of the function that defines it, through the
        closure that holds it or the (suspended or finished) frame it belongs to."""
        owner = self.parent.get(id(cell))
        if type(owner) in (types.FrameType, *_GENERATORS):
            try:
                contents = cell.cell_contents
            except ValueError:  # emptied since the walk (its variable deleted)
                return "<cell>", False
            return self.edge(owner, contents)
        function = self.parent.get(id(owner)) if type(owner) is tuple else None
        if type(function) is types.FunctionType and function.__closure__ is owner:
            name = function.__code__.co_freevars[self.slot(owner, cell)]
            scope = function.__qualname__.rpartition(".<locals>.")[0] or function.__qualname__
            return f"{scope}:{name}", True
        return "<cell>", False

    def _entry(self, mapping: dict[Any, Any], child: Any) -> tuple[str, bool]:
        key = self.slot(mapping, child)
        owner = self.parent.get(id(mapping))
        if owner is None or owner is SKIP or owner is UNROOTED:
            return f"[{_key_text(key)}]", False
        if issubclass(type(owner), _thread._local):  # a thread's attributes, by their weak key
            return "", False
        if issubclass(type(self.parent.get(id(owner))), _thread._local):
            return f".{key}", False  # an attribute of a thread-local, named through it
        space = namespace(owner)
        if issubclass(type(owner), type):
            if space is not None and space.get(key) is child:
                return f"{owner.__name__}.{key}", True
        elif space is mapping:
            return f"{self._owner(owner)}.{key}", True
        module: Any = owner
        if not issubclass(type(owner), torch.nn.Module):
            module = self.parent.get(id(owner))
        stores = namespace(module) if issubclass(type(module), torch.nn.Module) else None
        if stores is not None and any(stores.get(store) is mapping for store in _MODULE_STORES):
            return f"{self.module_name(module)}.{key}", True
        return f"[{_key_text(key)}]", False


def _key_text(key: Any) -> str:
    """A dict key as a path shows it: its ``repr`` where that is its value (a string, a number,
    a tuple of them), else its type (a weak reference's ``repr`` holds addresses, a tensor's
    its numbers)."""
    parts = key if type(key) is tuple else (key,)
    if all(type(k) in _PLAIN_KEYS for k in parts):
        return repr(key)
    return f"<{type(key).__name__}>"


_PLAIN_KEYS = frozenset({str, int, float, bool, bytes, type(None)})


def _frame_locals(frame: types.FrameType) -> dict[str, Any]:
    """A copy of ``frame``'s locals; the snapshot older Pythons keep on a function's frame is
    emptied so that it does not outlive the values the function drops."""
    namespace = frame.f_locals
    local = dict(namespace)
    if _SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        namespace.clear()
    return local


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def namespace(obj: Any) -> Any:
    """``obj.__dict__``, read through the C descriptor its type declares it with (never a
    class's ``__getattr__`` or ``__getattribute__``, nor a ``__dict__`` property of its own:
    None then, as for an object without one)."""
    for klass in type(obj).__mro__:
        descriptor = klass.__dict__.get("__dict__")
        if descriptor is not None:
            if type(descriptor) not in _C_DESCRIPTORS:
                return None
            try:
                return descriptor.__get__(obj, klass)
            except AttributeError:  # a slot declared and never set
                return None
    return None


_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)
_SEQUENCES = (list, tuple, collections.deque)


def _pairs(container: Any) -> Iterator[tuple[Any, Any]]:
    """The keys (or indices) and values of a dict, list, tuple or deque, or of a subclass of
    one, read by the base type's own C functions (never a subclass's ``items`` or
    ``__iter__``)."""
    kind = type(container)
    if issubclass(kind, dict):
        return iter(dict.items(container))
    base = next(base for base in _SEQUENCES if issubclass(kind, base))
    return enumerate(base.__iter__(container))


def _attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    """An object's instance attributes and slots, read without running its ``__getattr__``."""
    found = namespace(obj)
    if isinstance(found, dict):
        yield from found.items()
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            descriptor = klass.__dict__.get(slot)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    yield slot, descriptor.__get__(obj, klass)
                except AttributeError:
                    continue
