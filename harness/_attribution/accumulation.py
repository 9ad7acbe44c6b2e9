"""Naming holders in a weighed dominator tree, as heap analysers do: from each top that
retains a large share of the new memory, down to its *accumulation point*, where the retained
size stops sitting in one child and spreads over many (a list of 176 batches, a hook dict, a
cache). :mod:`~harness._attribution.retained` builds and weighs the tree."""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace
from typing import Any

from harness._attribution.holder import Holder
from harness._attribution.walk import SIZED, Walk, describe_item, kind_name, length
from harness._core.units import format_size

SPREAD = 0.8
"""A node whose largest child in the dominator tree retains less than this part of what the
node retains is an accumulation point: its memory is spread over its children."""
RECURSIVE = 3
"""Objects of one type met going down the dominator tree that make it a recursive structure."""
SUSPECT = 0.1
"""A top of the dominator tree retaining less than this part of the new memory is not named."""


@dataclass
class HeapNode:
    """An object (``obj``), or a storage or an autograd node (``kind``, no ``obj``)."""

    obj: Any
    kind: str = ""
    weight: int = 0
    tensors: int = 0
    graph: int = 0
    garbage: bool = False
    """Whether ``obj`` is in a reference cycle nothing else keeps, which ``gc`` frees."""
    linked: str = ""
    """What else C++ keeps for ``obj`` where it keeps a Python object from C++
    (:data:`~harness._attribution.names.C_LINKS`): no search weighs it."""


class HeapGraph:
    """The nodes that reach new objects, as small integers (0 is the root), and their edges."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.nodes: list[HeapNode] = [HeapNode(None)]
        self.successors: list[list[int]] = [[]]

    def node(self, key: Any, obj: Any = None, kind: str = "") -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.nodes)
            self.nodes.append(HeapNode(obj, kind))
            self.successors.append([])
        return found

    def edge(self, a: int, b: int) -> None:
        self.successors[a].append(b)


class Naming:
    """The holders of a dominator tree (``children`` of each node of ``graph``) whose objects
    ``walk`` reached; ``gc_on``: whether ``gc`` collects (it frees garbage when it does)."""

    def __init__(
        self, graph: HeapGraph, children: list[list[int]], walk: Walk, gc_on: bool = True
    ) -> None:
        self.graph = graph
        self.children = children
        self.walk = walk
        self.gc_on = gc_on

    def holders(self, kept: list[int], limit: int, growth: int | None = None) -> list[Holder]:
        """At most ``limit`` holders, each at its accumulation point, none inside another.
        With ``growth`` (what the heap grew by), where they hold under half of it, what holds
        objects that keep more in C++ is named for the rest (:meth:`_in_c`)."""
        self._fold(kept)
        children = self.children
        total = kept[0]
        tops = sorted(children[0], key=lambda n: -kept[n])
        found: list[Holder | None] = []
        for top in tops:
            if kept[top] < SUSPECT * total or len(found) >= limit:
                break
            point = self._descend(top, kept, children)
            found.append(self._holder(point, kept, children))
        if len(found) < limit:
            found += self._alike(children[0], kept, total)[: limit - len(found)]
        named = [replace(h, growth=total) for h in found if h is not None and h.bytes > 0]
        if growth is not None:
            named = self._in_c(named, kept, growth)[:limit]
        return named

    def _in_c(self, named: list[Holder], kept: list[int], growth: int) -> list[Holder]:
        """Where ``named`` hold under half of ``growth``, the top of the tree retaining the most
        among those over objects that keep more in C++ (a module torch.jit compiled), named at
        its accumulation point with the growth the others leave: what C++ keeps for its items,
        which no search weighs, however little their Python part retains. First, in place of
        its own entry."""
        if 2 * sum(h.bytes for h in named) >= growth:
            return named
        linked = self._linked_tops()
        if not linked:
            return named
        top = max(linked, key=lambda n: kept[n])
        holder = self._holder(self._descend(top, kept, self.children), kept, self.children)
        if holder is None:
            return named
        others = [h for h in named if h.path != holder.path]
        rest = growth - sum(h.bytes for h in others) - holder.bytes
        if rest <= 0:
            return named
        note = (
            f"C++ keeps more for its items ({linked[top]}): the {format_size(rest)} of growth "
            "no Python object holds counted here"
        )
        total = kept[0]
        holder = replace(
            holder,
            bytes=holder.bytes + rest,
            note="; ".join(filter(None, (holder.note, note))),
            growth=total,
        )
        return [holder, *others]

    def _linked_tops(self) -> dict[int, str]:
        """The tops of the dominator tree over objects that keep more in C++, each with what
        C++ keeps for them."""
        above: dict[int, int] = {}
        for node, below in enumerate(self.children):
            for child in below:
                above[child] = node
        tops: dict[int, str] = {}
        for node, entry in enumerate(self.graph.nodes):
            if entry.linked:
                while above.get(node, 0):
                    node = above[node]
                if node and node in above:
                    tops.setdefault(node, entry.linked)
        return tops

    def _fold(self, kept: list[int]) -> None:
        """Put each top of the dominator tree that a container also holds among others of its
        type under that container (and add what it retains to the container's and its
        dominators'): a running loop's local that names the latest item of a list (``best =
        deepcopy(model); kept.append(best)``) does not make that item a holder of its own, so
        the list is the accumulation point of all its items, not the holder of all but one."""
        nodes, successors, children = self.graph.nodes, self.graph.successors, self.children
        dominator = [0] * len(children)
        for node, below in enumerate(children):
            for child in below:
                dominator[child] = node
        referrers: dict[int, list[int]] = {top: [] for top in children[0]}
        for node, after in enumerate(successors):
            for child in after:
                if node and child in referrers:
                    referrers[child].append(node)
        for top, holding in referrers.items():
            kind = type(nodes[top].obj)
            found = [
                c
                for c in dict.fromkeys(holding)
                if type(nodes[c].obj) in SIZED
                and any(s != top and type(nodes[s].obj) is kind for s in successors[c])
            ]
            if nodes[top].obj is None or len(found) != 1:
                continue
            children[0].remove(top)
            children[found[0]].append(top)
            up = found[0]
            while up:
                kept[up] += kept[top]
                up = dominator[up]

    def _alike(self, tops: list[int], kept: list[int], total: int) -> list[Holder]:
        """Objects of one type that only C code or a reference cycle keeps, each a slice too
        small to name, that together retain a large share (a cycle made every batch while
        ``gc`` is off): one holder for all of them."""
        by_type: dict[tuple[type, bool], list[int]] = {}
        for top in tops:
            node = self.graph.nodes[top]
            obj = node.obj
            if obj is not None and kept[top] < SUSPECT * total and not self.walk.rooted(obj):
                by_type.setdefault((type(obj), node.garbage), []).append(top)
        found = []
        for (kind, _), group in by_type.items():
            weight = sum(kept[n] for n in group)
            if weight >= SUSPECT * total and len(group) > 1:
                tensors = sum(self._below(n)[0] for n in group)
                found.append(
                    Holder(
                        f"<unnamed {kind.__name__}>",
                        f"{kind.__name__} objects",
                        len(group),
                        tensors,
                        weight,
                        note=self._dead_end(group[0]),
                    )
                )
        return sorted(found, key=lambda h: -h.bytes)

    def _dead_end(self, node: int) -> str:
        """What keeps ``node``'s object, which no named root reaches."""
        if self.graph.nodes[node].garbage:
            if self.gc_on:
                return "garbage: a reference cycle gc has not freed yet"
            return "garbage: a reference cycle, never freed while gc is disabled"
        return "kept only by C code (no named root reaches it)"

    # -- naming ------------------------------------------------------------------------------

    def _descend(self, node: int, kept: list[int], children: list[list[int]]) -> int:
        """From ``node`` down the dominator tree while one child retains most of it. A descent
        that meets a :data:`RECURSIVE`-th object of one type (a dict excepted: an instance's
        namespace comes with each) is inside a recursive structure, a linked chain that
        sheds a slice at each link: it accumulates at the first object of that type."""
        first: dict[type, tuple[int, int]] = {}
        while children[node]:
            largest = max(children[node], key=lambda n: kept[n])
            obj = self.graph.nodes[largest].obj
            if kept[largest] < SPREAD * kept[node] or obj is None:
                break
            node = largest
            if type(obj) is not dict:
                at, met = first.get(type(obj), (node, 0))
                if met + 1 >= RECURSIVE:
                    return at
                first[type(obj)] = (at, met + 1)
        return node

    def _below(self, node: int) -> tuple[int, int]:
        """The tensors, and the bytes autograd graphs keep, that ``node`` dominates."""
        below, tensors, graph_bytes = [node], 0, 0
        while below:
            at = below.pop()
            tensors += self.graph.nodes[at].tensors
            graph_bytes += self.graph.nodes[at].graph
            below += self.children[at]
        return tensors, graph_bytes

    def _holder(self, node: int, kept: list[int], children: list[list[int]]) -> Holder | None:
        obj = self.graph.nodes[node].obj
        if obj is None:
            return None
        tensors, graph_bytes = self._below(node)
        path = self.walk.path_of(obj) or f"<unnamed {type(obj).__name__}>"
        items = length(obj)
        if items is None:
            items = len(children[node]) or 1  # a leaf: the object itself, as a tensor is
        note = _items(self.graph, children[node], kept)
        if not self.walk.rooted(obj):
            note = "; ".join(filter(None, (note, self._dead_end(node))))
        return Holder(
            path,
            kind_name(obj),
            items,
            tensors,
            kept[node],
            graph_bytes=graph_bytes,
            note=note,
        )


def _items(graph: HeapGraph, children: list[int], kept: list[int]) -> str:
    """What an accumulation point's items are: ``176 x list``, the most common kind among
    the children that retain its memory."""
    if len(children) < 2:
        return ""
    kinds: collections.Counter[str] = collections.Counter()
    for child in children:
        node = graph.nodes[child]
        kinds[node.kind or describe_item(node.obj)] += 1
    kind, count = kinds.most_common(1)[0]
    return f"items: {count} x {kind}"
