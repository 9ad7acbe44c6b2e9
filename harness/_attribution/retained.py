"""Holders by retained size, as heap analysers find them: every object created since a snapshot
and still alive is weighed, the dominator tree is computed over the part of the object graph
that reaches those objects, and the objects that retain a large share of the new memory are
named at their *accumulation point*, where the retained size stops sitting in one child and
spreads over many (a list of 176 batches, a hook dict, a cache).

Weights: a tensor's storage counts once per storage (a node that every tensor over it refers
to), the tensor itself its C++ part (:data:`~harness._attribution.weights.TENSOR_BYTES`, a view's
too), an autograd graph by its nodes and what they saved (as :mod:`~harness._attribution.graph`
weighs them), a numpy array by its buffer, ``bytes``, ``str`` and every other object by
``sys.getsizeof`` where its type measures itself in C. The graph's roots are those of a
:class:`~harness._attribution.walk.Walk` (module globals, live frames, then what only C code or a
cycle keeps); every reference the walk saw into an object created since the recorder's freeze
is an edge, so an object two holders share is retained by neither. leakgate's own objects, and
what only they keep, are neither weighed nor walked.
"""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import torch

from harness._attribution.accumulation import HeapGraph, Naming
from harness._attribution.dominators import UNREACHED, immediate_dominators, retained
from harness._attribution.graph import node_bytes, saved_tensors
from harness._attribution.holder import Holder
from harness._attribution.quiet import unobserved
from harness._attribution.snapshot import (
    ORDERED,
    UNTRACKED_FROM,
    Snapshot,
    module_collections,
    storage_id,
    storage_of,
    untracked,
)
from harness._attribution.walk import (
    C_LINKS,
    SKIP,
    UNROOTED,
    Walk,
    contents,
    kind_of,
)
from harness._attribution.weights import TENSOR_BYTES, is_ours, size_of

_HOLDERS = 3
R = TypeVar("R")


def _shared(item: Any) -> bool:
    """Whether ``item`` is one the interpreter shares and never makes anew (``None``, a bool,
    a cached small int): no container's growth."""
    return item is None or type(item) is bool or (type(item) is int and -5 <= item <= 256)


_CHUNK = 4096


@unobserved
def retained_holders(
    before: Snapshot | None, max_objects: int, limit: int = _HOLDERS, growth: int | None = None
) -> list[Holder]:
    """The objects that retain most of what was created since ``before`` (since the last
    ``gc.freeze()`` without it), each at its accumulation point and named by its path from a
    root, with the new bytes it retains; at most ``limit``, none inside another. With
    ``growth`` (what the heap grew by since ``before``), what C++ keeps for objects that hold
    more there (a module torch.jit compiled) is counted as the growth they leave unexplained
    (:meth:`~harness._attribution.accumulation.Naming.holders`)."""
    return _searched(before, max_objects, lambda search, kept: search.holders(kept, limit, growth))


@unobserved
def retained_of(before: Snapshot | None, objects: list[Any], max_objects: int) -> list[int]:
    """The new bytes each of ``objects`` retains (0 for one the search did not reach): what
    :func:`retained_holders` names its holders by."""

    def each(search: _Search, kept: list[int]) -> list[int]:
        index = search.graph.index
        return [kept[index[id(o)]] if id(o) in index else 0 for o in objects]

    return _searched(before, max_objects, each, objects)


def _searched(
    before: Snapshot | None,
    max_objects: int,
    read: Callable[[_Search, list[int]], R],
    asked: Any = None,
) -> R:
    """Walk, weigh what is new since ``before`` and compute the dominator tree; ``read`` it.
    ``asked`` (the caller's list of objects) is never walked: it holds nothing."""
    collecting = gc.isenabled()
    gc.disable()
    young = gc.get_objects()
    garbage = _garbage(young)
    walk = Walk(max_objects, watch={id(o) for o in young}, ours=True)
    try:
        new = _new(young, before)
        walk.parent[id(new)] = walk.parent[id(young)] = walk.parent[id(asked)] = SKIP
        walk.run()
        search = _Search(walk, new, before, garbage, collecting)
        return read(search, search.retained(young))
    finally:
        walk.clear()
        if collecting:
            gc.enable()


def _garbage(young: list[Any]) -> set[int]:
    """The ids of the objects among ``young`` (every one ``gc`` lists, collection off) that
    nothing but references among them keeps: reference cycles ``gc`` frees at its next
    collection of their generation, which hold nothing. Found as ``gc`` finds them: an object
    whose count of references exceeds those from the others is kept from outside (by C code,
    a frozen object, a running frame), and so is what it reaches."""
    counts = list(map(sys.getrefcount, young))  # each with the list's and the call's
    index = {id(o): at for at, o in enumerate(young)}
    inside = [2] * len(young)
    for obj in young:
        for ref in gc.get_referents(obj):
            at = index.get(id(ref))
            if at is not None:
                inside[at] += 1
    del obj
    stack = [at for at, count in enumerate(counts) if count > inside[at]]
    kept = bytearray(len(young))
    for at in stack:
        kept[at] = 1
    while stack:
        for ref in gc.get_referents(young[stack.pop()]):
            at = index.get(id(ref))
            if at is not None and not kept[at]:
                kept[at] = 1
                stack.append(at)
    return {id(young[at]) for at in range(len(young)) if not kept[at]}


def _new(young: list[Any], before: Snapshot | None) -> dict[int, Any]:
    """The objects among ``young`` (those ``gc`` lists now) that ``before`` did not list, less
    leakgate's own and what only they reach."""
    ids = np.fromiter(map(id, young), np.int64, len(young))
    old = before.listed(ids) if before is not None else np.zeros(len(young), bool)
    new = {id(o): o for o, listed in zip(young, old.tolist(), strict=True) if not listed}
    stack = [o for o in new.values() if is_ours(o)]
    while stack:
        obj = stack.pop()
        if new.pop(id(obj), None) is not None:
            stack += [r for r in gc.get_referents(obj) if id(r) in new]
    return new


class _Search:
    def __init__(
        self,
        walk: Walk,
        new: dict[int, Any],
        before: Snapshot | None,
        garbage: set[int],
        gc_on: bool = True,
    ) -> None:
        self.walk = walk
        self.new = new
        self.before = before
        self.garbage = garbage
        self.gc_on = gc_on
        self.graph = HeapGraph()
        self.old_storages = before.alive_storages() if before is not None else set()
        self.weighed: set[int] = set()
        self.functions: list[Any] = []
        self.children: list[list[int]] = []
        self.loose: dict[int, Any] = {}
        self.bound: set[int] = set()
        """Weak references kept by what they refer to (:meth:`_bound_to`)."""

    def retained(self, young: list[Any]) -> list[int]:
        """The graph built and weighed; each node's retained weight (the dominator tree in
        :attr:`children`)."""
        graph = self.graph
        bound: list[tuple[Any, Any]] = []
        for obj in self.new.values():
            if kind_of(type(obj)) == "tensor" and self.walk.parent.get(id(obj)) is UNROOTED:
                self.loose[id(obj)] = obj  # only C++ keeps it: a graph that saved it, maybe
            elif (referent := self._bound_to(obj)) is not None:
                bound.append((obj, referent))
            else:
                self._place(obj)
        for ref, referent in bound:
            above = self._place(referent)
            if above is None or id(ref) in graph.index:
                self._place(ref)
            else:
                graph.edge(above, graph.node(id(ref), ref))
                self.bound.add(id(ref))
        self._untracked(young)
        self._joins()
        for key, obj in list(self.new.items()):
            if key in graph.index:
                self._weigh(graph.index[key], obj)
        for obj in list(self.loose.values()):  # what no graph saved: only C++ keeps it
            node = self._place(obj)
            if node is not None and id(obj) in self.loose:
                del self.loose[id(obj)]
                self._weigh(node, obj)
        idom = immediate_dominators(graph.successors)
        weights = [n.weight for n in graph.nodes]
        kept = retained(idom, weights)
        self.children = [[] for _ in idom]
        for node, dominator in enumerate(idom):
            if node and dominator != UNREACHED:
                self.children[dominator].append(node)
        return kept

    def holders(self, kept: list[int], limit: int, growth: int | None = None) -> list[Holder]:
        """At most ``limit`` holders, each at its accumulation point, none inside another."""
        nodes, index = self.graph.nodes, self.graph.index
        for key, obj in self.walk.linked.items():
            if key in index:
                nodes[index[key]].linked = C_LINKS[type(obj)][1]
        for key in self.garbage:
            if key in index:
                nodes[index[key]].garbage = True
        naming = Naming(self.graph, self.children, self.walk, self.gc_on)
        return naming.holders(kept, limit, growth)

    # -- the graph ---------------------------------------------------------------------------

    def _place(self, obj: Any) -> int | None:
        """Add ``obj`` and the objects it was first reached from, up to a root; its node (0
        for a root itself: a module, its globals, a running frame, none of which is a holder:
        what they name is). None for what the walk did not reach, or leakgate's own."""
        parent, graph = self.walk.parent, self.graph
        chain = []
        while id(obj) not in graph.index and not self._root(obj):
            up = parent.get(id(obj), SKIP)
            if up is SKIP:
                return None
            chain.append(obj)
            if up is UNROOTED or (id(up) in self.garbage and id(obj) not in self.garbage):
                break  # what garbage reaches first but something else keeps: C code, maybe
            obj = up
        above = graph.index.get(id(obj), 0)  # 0: a root, or the top of a chain C code keeps
        for obj in reversed(chain):
            node = graph.node(id(obj), obj)
            graph.edge(above, node)
            above = node
        return above

    def _bound_to(self, obj: Any) -> Any:
        """The new object ``obj`` is a weak reference to, where a callback removes ``obj``
        from what keeps it once that object dies (a ``WeakSet``'s, ``logging``'s list of
        handlers): ``obj`` is that object's, not its registry's. Else None."""
        if not issubclass(type(obj), weakref.ref) or obj.__callback__ is None:
            return None
        referent = obj()
        return referent if referent is not None and id(referent) in self.new else None

    def _root(self, obj: Any) -> bool:
        up = self.walk.parent.get(id(obj), SKIP)
        return up is None or id(obj) in self.walk.module_dicts

    def _joins(self) -> None:
        """Add every other reference the walk saw into the graph's objects, with the paths of
        their referrers (each of which reaches a new object too), until none is left out."""
        pending = list(zip(self.walk.referrers, self.walk.joined, strict=True))
        while pending:
            left = []
            for referrer, obj in pending:
                if id(obj) in self.bound or (
                    id(referrer) in self.garbage and id(obj) not in self.garbage
                ):
                    continue  # garbage holds nothing that something else keeps
                if id(obj) not in self.graph.index:
                    left.append((referrer, obj))
                    continue
                source = self._place(referrer)
                if source is not None:
                    self.graph.edge(source, self.graph.index[id(obj)])
            if len(left) == len(pending):
                break
            pending = left

    def _weigh(self, node: int, obj: Any) -> None:
        """``obj``'s own weight, and its storage's and graph's for a tensor."""
        entry = self.graph.nodes[node]
        entry.weight += size_of(obj)
        if kind_of(type(obj)) == "tensor":
            entry.tensors += 1
            entry.weight += TENSOR_BYTES
            self._tensor(node, obj)

    def _untracked(self, young: list[Any]) -> None:
        """The untracked objects (arrays, strings, dicts of them, which ``gc`` does not list)
        added since ``before``: the items a list, dict or deque gained past its length then (all
        of a new one's), what new objects refer to, and what old ones refer to that ``before``
        did not note (an array regrown into an attribute); each a node weighing itself and what
        it holds in turn (an array view's owner too). Small ones (names, keys) are left out.
        An old object that grew in place (a buffer written to) weighs what it grew by."""
        before = self.before
        old = before.lengths if before is not None else {}
        globals_ = module_collections()
        for holder, table in globals_:
            self.walk.parent.setdefault(id(holder), table)  # untracked: no walk reached it
        garbage = [o for o in young if id(o) in self.garbage]  # last: what else holds, keeps
        live = [o for o in young if id(o) not in self.garbage]
        for holder in (*live, *(c for c, _ in globals_), *garbage):
            if type(holder) in ORDERED:
                start = old.get(id(holder), 0 if id(holder) in self.new else len(holder))
                if len(holder) > start:
                    if isinstance(holder, dict):  # a key made for an entry is its memory too
                        pairs = itertools.islice(holder.items(), start, None)
                        self._add(holder, itertools.chain.from_iterable(pairs))
                    else:
                        self._add(holder, itertools.islice(holder, start, None))
            elif id(holder) in self.new and kind_of(type(holder)) != "tensor":
                self._add(holder, contents(holder, gc.get_referents(holder)))
        if before is not None:
            kept: list[Any] = []
            tensors: list[Any] = []
            for h in young:
                if id(h) in self.new:
                    continue
                if kind_of(type(h)) == "tensor":
                    tensors.append(h)
                elif not is_ours(h):
                    kept.append(h)
            self._replaced(before, kept)
            self._grown(before, kept)
            self._resized(before, tensors)

    def _replaced(self, before: Snapshot, old: list[Any]) -> None:
        """The untracked objects ``old`` ones refer to that ``before`` did not note: an array
        regrown by ``self.outputs = np.concatenate(...)``, whose holder is not new. Only those
        of :data:`UNTRACKED_FROM` bytes or more, the ones it notes: the short strings of a
        cache filled before ``before`` (``linecache.cache``'s lines) are not new. Read
        :data:`_CHUNK` holders at a time, so that a large heap costs no large list."""
        for start in range(0, len(old), _CHUNK):
            pairs = [
                (holder, item)
                for holder in old[start : start + _CHUNK]
                for item in untracked(contents(holder, gc.get_referents(holder)))
                if size_of(item) >= UNTRACKED_FROM  # what ``before`` could note
            ]
            had = before.had([item for _, item in pairs])
            by_holder: dict[int, tuple[Any, list[Any]]] = {}
            for (holder, item), seen in zip(pairs, had.tolist(), strict=True):
                if not seen:
                    by_holder.setdefault(id(holder), (holder, []))[1].append(item)
            for holder, items in by_holder.values():
                self._add(holder, items)

    def _grown(self, before: Snapshot, old: list[Any]) -> None:
        """What each of the ``old`` objects grew by in place since ``before`` (a buffer
        written to), weighed on its own node."""
        for holder, grown in zip(old, before.grown(old).tolist(), strict=True):
            if grown >= UNTRACKED_FROM:
                node = self._place(holder)
                if node:
                    self.graph.nodes[node].weight += grown

    def _resized(self, before: Snapshot, tensors: list[Any]) -> None:
        """What the storage of each of the old ``tensors`` grew by in place since ``before``
        (``resize_``), weighed on a storage node below the tensor."""
        if not before.storage_sizes:
            return
        for tensor in tensors:
            then = before.storage_sizes.get(storage_id(tensor) or 0)
            key, now = storage_of(tensor)
            if then is not None and key is not None and now - then >= UNTRACKED_FROM:
                node = self._place(tensor)
                if node:
                    self._storage(node, key, now - then)

    def _add(self, holder: Any, items: Iterable[Any]) -> None:
        """Weigh the untracked ``items`` ``holder`` gained: each of :data:`UNTRACKED_FROM`
        bytes or more a node of its own under it, the small ones (floats, short strings, small
        tuples of them: Python's allocator's blocks) together in the holder's own weight."""
        above: int | None = None
        small = 0
        for item in items:
            if gc.is_tracked(item) or id(item) in self.weighed or _shared(item):
                continue
            weight, inner = 0, [item]
            while inner:
                part = inner.pop()
                if id(part) in self.weighed or _shared(part):
                    continue
                self.weighed.add(id(part))
                weight += size_of(part)
                inner += [r for r in gc.get_referents(part) if not gc.is_tracked(r)]
                if type(part).__name__ == "ndarray" and getattr(part, "base", None) is not None:
                    inner.append(part.base)  # a view: its owner's buffer
            if weight < UNTRACKED_FROM:
                small += weight
                continue
            above = self._place(holder) if above is None else above
            if above is None:
                return
            self.walk.parent.setdefault(id(item), holder)  # named through its holder
            at = self.graph.node(id(item), item)
            self.graph.nodes[at].weight = weight
            self.graph.edge(above, at)
        if small:
            above = self._place(holder) if above is None else above
            if above:
                self.graph.nodes[above].weight += small

    def _tensor(self, node: int, tensor: torch.Tensor) -> None:
        if self.before is not None and tensor in self.before and not self.before.regraphed(tensor):
            return
        key, nbytes = storage_of(tensor)
        if key is not None and storage_id(tensor) not in self.old_storages:
            self._storage(node, key, nbytes)
        with torch._C.DisableTorchFunctionSubclass():  # never a subclass's __torch_function__
            grad_fn = tensor.grad_fn
        if grad_fn is not None:
            self._graph(node, grad_fn)

    def _storage(self, node: int, key: Any, nbytes: int) -> int:
        graph = self.graph
        fresh = ("storage", key) not in graph.index
        storage = graph.node(("storage", key), kind="storage")
        if fresh:
            graph.nodes[storage].weight = nbytes
        graph.edge(node, storage)
        return storage

    def _graph(self, node: int, grad_fn: Any) -> None:
        """The autograd nodes below ``grad_fn`` and what they saved, as nodes of the graph."""
        graph = self.graph
        stack = [(node, grad_fn)]
        while stack:
            above, function = stack.pop()
            key = ("graph", id(function))
            fresh = key not in graph.index
            at = graph.node(key, kind="autograd graph")
            graph.edge(above, at)
            if not fresh:
                continue
            self.functions.append(function)  # keeps its id unique while the search runs
            graph.nodes[at].weight = graph.nodes[at].graph = node_bytes(function)
            for saved in saved_tensors(function):
                if self.loose.pop(id(saved), None) is not None:  # its Python object too
                    tensor = graph.node(id(saved), saved)
                    graph.edge(at, tensor)
                    self._weigh(tensor, saved)
                place, nbytes = storage_of(saved)
                if place is not None and storage_id(saved) not in self.old_storages:
                    storage = self._storage(at, place, nbytes)
                    graph.nodes[storage].graph = graph.nodes[storage].weight
            stack += [(at, f) for f, _ in function.next_functions if f is not None]
