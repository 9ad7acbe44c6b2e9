"""Naming holders in a weighed dominator tree, as heap analysers do: from each top that
retains a large share of the new memory, down to its *accumulation point*, where the retained
size stops sitting in one child and spreads over many (a list of 176 batches, a hook dict, a
cache). :mod:`~harness.attribution.retained` builds and weighs the tree."""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace
from typing import Any

from harness.attribution.holder import Holder
from harness.attribution.walk import SIZED, Walk, describe_item, kind_name, length

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
    ``walk`` reached."""

    def __init__(self, graph: HeapGraph, children: list[list[int]], walk: Walk) -> None:
        self.graph = graph
        self.children = children
        self.walk = walk

    def holders(self, kept: list[int], limit: int) -> list[Holder]:
        """At most ``limit`` holders, each at its accumulation point, none inside another."""
        self._fold(kept)
        children = self.children
        total = kept[0]
        found: list[Holder | None] = []
        for top in sorted(children[0], key=lambda n: -kept[n]):
            if kept[top] < SUSPECT * total or len(found) >= limit:
                break
            point = self._descend(top, kept, children)
            found.append(self._holder(point, kept, children))
        if len(found) < limit:
            found += self._alike(children[0], kept, total)[: limit - len(found)]
        return [replace(h, growth=total) for h in found if h is not None and h.bytes > 0]

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
        by_type: dict[type, list[int]] = {}
        for top in tops:
            obj = self.graph.nodes[top].obj
            if obj is not None and kept[top] < SUSPECT * total and not self.walk.rooted(obj):
                by_type.setdefault(type(obj), []).append(top)
        found = []
        for kind, group in by_type.items():
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
                        note="kept only by a reference cycle, or by C code",
                    )
                )
        return sorted(found, key=lambda h: -h.bytes)

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
            note = "; ".join(filter(None, (note, "kept only by a reference cycle, or by C code")))
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
