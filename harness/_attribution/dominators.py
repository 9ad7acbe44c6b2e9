"""Dominators and retained sizes over a graph of small integers (node 0 is the root).

A node *d* dominates *n* when every path from the root to *n* passes through *d*; the nearest
such *d* is *n*'s immediate dominator, and these form the dominator tree. A node's *retained*
weight is the weight of its subtree there: what would be freed if the node were gone.
:func:`immediate_dominators` is Cooper, Harvey and Kennedy's iterative algorithm ("A Simple,
Fast Dominance Algorithm", 2001): intersections along reverse postorder until nothing changes,
a few passes on heap graphs, whose back edges are few.
"""

from __future__ import annotations

from collections.abc import Sequence

UNREACHED = -1


def immediate_dominators(successors: Sequence[Sequence[int]]) -> list[int]:
    """Each node's immediate dominator (the root's is itself; :data:`UNREACHED` for nodes the
    root does not reach), for the graph whose node ``i`` refers to ``successors[i]``."""
    order = _postorder(successors)
    rank = [UNREACHED] * len(successors)
    for position, node in enumerate(order):
        rank[node] = position
    predecessors: list[list[int]] = [[] for _ in successors]
    for node in order:
        for following in successors[node]:
            predecessors[following].append(node)
    idom = [UNREACHED] * len(successors)
    idom[0] = 0
    changed = True
    while changed:
        changed = False
        for node in reversed(order[:-1]):  # reverse postorder, the root (last) left out
            chosen = UNREACHED
            for before in predecessors[node]:
                if idom[before] == UNREACHED:
                    continue
                if chosen == UNREACHED:
                    chosen = before
                    continue
                a, b = before, chosen  # the nearest common dominator of both
                while a != b:
                    while rank[a] < rank[b]:
                        a = idom[a]
                    while rank[b] < rank[a]:
                        b = idom[b]
                chosen = a
            if idom[node] != chosen:
                idom[node] = chosen
                changed = True
    return idom


def retained(idom: Sequence[int], weights: Sequence[int]) -> list[int]:
    """Each node's retained weight: its own and that of every node it dominates."""
    depth = [0] * len(idom)
    order = sorted(range(len(idom)), key=lambda n: _depth(n, idom, depth), reverse=True)
    total = list(weights)
    for node in order:
        if node and idom[node] != UNREACHED:
            total[idom[node]] += total[node]
    return total


def _depth(node: int, idom: Sequence[int], depth: list[int]) -> int:
    """``node``'s depth in the dominator tree (memoised in ``depth``; 0 when unreached)."""
    path = []
    while node and idom[node] != UNREACHED and not depth[node]:
        path.append(node)
        node = idom[node]
    known = depth[node] if node else 0
    for step in reversed(path):
        known += 1
        depth[step] = known
    return depth[path[0]] if path else known


def _postorder(successors: Sequence[Sequence[int]]) -> list[int]:
    """The nodes the root reaches, in depth-first postorder (iterative: heap paths run deep)."""
    seen = [False] * len(successors)
    seen[0] = True
    order: list[int] = []
    stack = [(0, iter(successors[0]))]
    while stack:
        node, following = stack[-1]
        for child in following:
            if not seen[child]:
                seen[child] = True
                stack.append((child, iter(successors[child])))
                break
        else:
            stack.pop()
            order.append(node)
    return order
